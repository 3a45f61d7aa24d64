"""Resume store, results table, model-path layouts and config validation of ``gmts eval``."""

from __future__ import annotations

import json

import pytest

from gmts.eval.backends import BackendOptions, group_completions
from gmts.eval.harness import EvalConfig, derive_seed, partial_results_path
from gmts.eval.report import format_table
from gmts.eval.results_store import QuestionRecord, ResultsStore, SettingsMismatchError
from gmts.models.loading import ModelPathError, resolve_model_path

SETTINGS = {"model": "m", "n": 2, "temperature": 1.0}


def _record(i: int) -> QuestionRecord:
    return QuestionRecord("math500", f"q{i}", "Q?", str(i), ["a", "b"], [1.0, 0.0], ["1", None])


def test_store_roundtrip_and_resume(tmp_path):
    path = tmp_path / "r.partial.jsonl"
    store = ResultsStore(path, SETTINGS)
    store.add([_record(0), _record(1)])
    again = ResultsStore(path, dict(SETTINGS))
    assert set(again.records) == {("math500", "q0"), ("math500", "q1")}
    assert again.get("math500", "q1") == _record(1)
    assert again.get("math500", "q9") is None
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"gmts_eval": 1, "settings": SETTINGS}
    assert len(lines) == 3


def test_store_refuses_other_settings_and_fresh_discards(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsStore(path, SETTINGS).add([_record(0)])
    with pytest.raises(SettingsMismatchError, match=r"differs in: n, temperature"):
        ResultsStore(path, {**SETTINGS, "n": 4, "temperature": 0.5})
    fresh = ResultsStore(path, {**SETTINGS, "n": 4}, fresh=True)
    assert fresh.records == {}
    assert len(path.read_text().splitlines()) == 1


def test_store_drops_torn_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsStore(path, SETTINGS).add([_record(0), _record(1)])
    full = path.read_bytes()
    path.write_bytes(full[:-20])  # killed in the middle of writing q1
    store = ResultsStore(path, SETTINGS)
    assert set(store.records) == {("math500", "q0")}
    store.add([_record(2)])  # the append starts on a fresh line
    reread = ResultsStore(path, SETTINGS)
    assert set(reread.records) == {("math500", "q0"), ("math500", "q2")}


def test_store_rejects_foreign_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="not a gmts eval results file"):
        ResultsStore(path, SETTINGS)


def test_record_lengths_checked():
    with pytest.raises(ValueError, match="same length"):
        QuestionRecord("b", "1", "q", "a", ["x"], [1.0, 0.0], [None])


def test_format_table_hand_computed():
    s1 = {
        "model": "grpo",
        "benchmarks": {
            "aime24": {"display": "AIME24", "metric": "average@16", "score": 0.1},
            "math500": {"display": "MATH-500", "metric": "average@16", "score": 0.745},
        },
        "average": 0.4225,
    }
    s2 = {
        "model": "gmts-long-name",
        "benchmarks": {"math500": {"display": "MATH-500", "metric": "average@16", "score": 0.5}},
        "average": 0.5,
    }
    assert format_table([s1, s2]) == "\n".join(
        [
            "| Model          | AIME24 | MATH-500 |  Avg. |",
            "|----------------|-------:|---------:|------:|",
            "| grpo           |  10.00 |    74.50 | 42.25 |",
            "| gmts-long-name |      - |    50.00 | 50.00 |",
            "(average@16 in %)",
        ]
    )


def test_resolve_model_path_layouts(tmp_path):
    with pytest.raises(ModelPathError, match="does not exist"):
        resolve_model_path(tmp_path / "missing")
    with pytest.raises(ModelPathError, match="no model found"):
        resolve_model_path(tmp_path)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert resolve_model_path(hf) == str(hf)
    ckpt = tmp_path / "ckpt"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    assert resolve_model_path(ckpt) == str(ckpt / "model")
    run = tmp_path / "run"
    for step in (9, 10, 100):
        d = run / "checkpoints" / f"step_{step:06d}" / "model"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    (run / "checkpoints" / "step_000200.tmp-123" / "model").mkdir(parents=True)
    assert resolve_model_path(run) == str(run / "checkpoints" / "step_000100" / "model")


def test_group_completions_by_group_id():
    out = group_completions(["a0", "b0", "a1", "b1"], [0, 1, 0, 1], 2, 2)
    assert out == [["a0", "a1"], ["b0", "b1"]]
    with pytest.raises(RuntimeError, match="returned 3 completions"):
        group_completions(["a", "b", "c"], [0, 0, 1], 2, 2)


def test_seed_derivation_and_paths(tmp_path):
    assert derive_seed(0, "math500", 3) == derive_seed(0, "math500", 3)
    seeds = {derive_seed(s, b, c) for s in (0, 1) for b in ("math500", "aime24") for c in range(5)}
    assert len(seeds) == 20 and all(0 <= s < 2**31 for s in seeds)
    assert partial_results_path(tmp_path / "res.json") == tmp_path / "res.partial.jsonl"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n": 0}, "n must be"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"limit": 0}, "limit"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_eval_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**kwargs)


def test_end_of_turn_token_stops_sampling(make_byte_tokenizer):
    from gmts.data.prompts import CHATML_TEMPLATE
    from gmts.eval.backends import end_of_turn_id

    tok = make_byte_tokenizer(CHATML_TEMPLATE)
    assert end_of_turn_id(tok) is None  # eos is already <|im_end|>
    tok.eos_token = "<|endoftext|>"
    stop = end_of_turn_id(tok)
    assert stop == tok.convert_tokens_to_ids("<|im_end|>") != tok.eos_token_id
    assert tok.eos_token == "<|endoftext|>"  # the tokenizer is untouched
    ids = tok(["ab"], add_special_tokens=False)["input_ids"]
    assert len(ids[0]) == 2
    assert tok.batch_decode([ids[0] + [stop]], skip_special_tokens=True) == ["ab"]
    plain = make_byte_tokenizer()
    assert end_of_turn_id(plain) is None


def test_vllm_backend_missing_package(monkeypatch, tmp_path):
    import sys

    from gmts.eval.backends import make_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ValueError, match="vllm backend needs the vllm package.*setup.sh vllm"):
        make_backend("vllm", BackendOptions(tmp_path))


def test_default_row_label():
    from gmts.cli.eval import _default_name

    assert _default_name("/x/runs/gmts") == "gmts"
    assert _default_name("/x/runs/gmts/checkpoints/step_000100") == "gmts/step_000100"
    assert _default_name("/x/runs/gmts/checkpoints/step_000100/model") == "gmts/step_000100"
    assert _default_name("/x/qwen/model") == "qwen"
