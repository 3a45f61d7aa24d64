"""``gmts eval --verifier NAME``: a registered benchmark scored by a reward of ``gmts.rewards``
in place of its own verifier (a model that answers in prose, scored the way it was trained).

GSM8K's own verifier (``math-boxed``) reads only ``\\boxed{}``; the ``math`` reward also reads
the last number. The data is a three-row GSM8K file written here (no shared data needed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gmts.cli import main
from gmts.eval.benchmarks import FileFields, load_eval_benchmark, verifier_override
from gmts.eval.harness import EvalConfig, evaluate, partial_results_path, store_settings
from gmts.eval.report import format_table
from gmts.eval.results_store import ResultsStore, SettingsMismatchError
from gmts.rewards import get_reward

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text_sampler import TextSampler  # noqa: E402

GOLDS = ["122", "18", "3"]


@pytest.fixture
def gsm8k_dir(tmp_path: Path) -> Path:
    """A data folder holding ``gsm8k/test.jsonl`` in the file's own layout (``#### gold``)."""
    folder = tmp_path / "data" / "gsm8k"
    folder.mkdir(parents=True)
    rows = [
        {"question": f"Question {i}?", "answer": f"work\n#### {g}"} for i, g in enumerate(GOLDS)
    ]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder.parent


class ProseBackend(TextSampler):
    """Answers every question in prose, never boxed: sample j is right iff j is even."""

    name = "prose"

    def __init__(self, gold_by_prompt: dict[str, str]):
        self.gold_by_prompt = gold_by_prompt
        self.calls = 0

    def complete(self, prompts, *, n, temperature, max_new_tokens, seed):
        self.calls += 1
        out = []
        for prompt in prompts:
            gold = int(self.gold_by_prompt[prompt])
            out.append(
                [f"Adding 2 and 5, it is {gold if j % 2 == 0 else gold + 1}." for j in range(n)]
            )
        return out


def _backend(data_dir: Path) -> ProseBackend:
    items = load_eval_benchmark("gsm8k", tokenizer=None, data_dir=data_dir).items
    return ProseBackend({item.prompt: item.answer for item in items})


def test_override_scores_prose_answers_by_the_named_reward(gsm8k_dir: Path) -> None:
    own = evaluate(
        _backend(gsm8k_dir), "gsm8k", EvalConfig(n=4, data_dir=str(gsm8k_dir)), progress=False
    )
    config = EvalConfig(n=4, data_dir=str(gsm8k_dir), verifier="math")
    over = evaluate(_backend(gsm8k_dir), "gsm8k", config, progress=False)
    (own_bench,), (over_bench,) = own.benchmarks, over.benchmarks
    # the same completions: never boxed, so the benchmark's own verifier gives 0 ...
    assert [r.completions for r in own_bench.records] == [r.completions for r in over_bench.records]
    assert own_bench.score == 0.0 and own_bench.verifier_override is None
    assert [r.extracted for r in own_bench.records] == [[None] * 4] * 3
    # ... and `math` reads the last number: the even samples are right (half of them)
    assert [r.rewards for r in over_bench.records] == [[1.0, 0.0, 1.0, 0.0]] * 3
    assert over_bench.score == pytest.approx(0.5) and over_bench.verifier_override == "math"
    assert [r.extracted[:2] for r in over_bench.records] == [[g, str(int(g) + 1)] for g in GOLDS]
    reward = get_reward("math")  # the registered reward itself is the reference
    for record in over_bench.records:
        assert record.rewards == [reward(c, record.answer) for c in record.completions]
    # recorded and shown: the results' settings, the summary and the table
    assert over.settings["verifier"] == "math" and own.settings["verifier"] is None
    assert over.summary()["benchmarks"]["gsm8k"]["verifier_override"] == "math"
    table = over.table().splitlines()
    assert table[2].endswith("| 50.00 [math] | 50.00 |")
    assert table[-1] == (
        "(average@4 in %; [math]: scored by the reward math, not the benchmark's own verifier)"
    )
    assert "[" not in own.table()


def test_naming_the_benchmarks_own_verifier_changes_nothing(gsm8k_dir: Path) -> None:
    assert verifier_override("gsm8k", "math-boxed") is None
    assert verifier_override("addition-2digit", "math") is None  # its own is `math`
    assert verifier_override("gsm8k", "math").name == "math"
    assert verifier_override("gsm8k", None) is None
    config = EvalConfig(n=2, data_dir=str(gsm8k_dir), verifier="math-boxed")
    report = evaluate(_backend(gsm8k_dir), "gsm8k", config, progress=False)
    assert report.benchmarks[0].score == 0.0 and report.benchmarks[0].verifier_override is None


def test_unknown_code_and_code_benchmark_refused_before_generating(gsm8k_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown verifier 'nope'; .*math-boxed"):
        EvalConfig(verifier="nope")
    with pytest.raises(ValueError, match="verifier 'code' runs code"):
        EvalConfig(verifier="code")
    backend = _backend(gsm8k_dir)
    config = EvalConfig(n=2, data_dir=str(gsm8k_dir), verifier="math")
    for code in ("humaneval", "mbpp"):
        with pytest.raises(ValueError, match=f"cannot score the code benchmark '{code}'"):
            evaluate(backend, ["gsm8k", code], config, progress=False)
    assert backend.calls == 0  # refused before gsm8k generated anything


def test_resume_with_another_verifier_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.partial.jsonl"
    default = store_settings("m", "hf", EvalConfig(n=2))
    assert "verifier" not in default  # stores written before the option still resume
    ResultsStore(path, store_settings("m", "hf", EvalConfig(n=2, verifier="math")))
    ResultsStore(path, store_settings("m", "hf", EvalConfig(n=2, verifier="math")))  # resumes
    for other in (default, store_settings("m", "hf", EvalConfig(n=2, verifier="exact"))):
        with pytest.raises(SettingsMismatchError, match=r"differs in: verifier\)"):
            ResultsStore(path, other)


def test_resume_with_another_file_reward_is_refused(tmp_path: Path) -> None:
    """A user's file scored by another --reward (or prompted by another --template) is kept
    apart the same way: its records hold the rewards of the first run."""
    path = tmp_path / "r.partial.jsonl"
    default = store_settings("m", "hf", EvalConfig(n=2))
    assert "file_fields" not in default
    ResultsStore(
        path, store_settings("m", "hf", EvalConfig(file_fields=FileFields(reward="exact")))
    )
    for fields in (FileFields(), FileFields(reward="math-boxed"), FileFields(template="plain")):
        with pytest.raises(SettingsMismatchError, match=r"differs in: [a-z_, ]*file_fields"):
            ResultsStore(path, store_settings("m", "hf", EvalConfig(file_fields=fields)))


def test_table_marks_only_the_overridden_cells() -> None:
    def bench(display: str, score: float, override: str | None = None) -> dict:
        return {"display": display, "metric": "average@4", "score": score,
                "verifier_override": override}  # fmt: skip

    own = {"model": "own", "benchmarks": {"gsm8k": bench("GSM8K", 0.0)}, "average": 0.0}
    math = {
        "model": "prose",
        "benchmarks": {"gsm8k": bench("GSM8K", 0.25, "math"), "csqa": bench("CS-QA", 0.5)},
        "average": 0.375,
    }
    assert format_table([own, math]) == "\n".join(
        [
            "| Model |        GSM8K | CS-QA |  Avg. |",
            "|-------|-------------:|------:|------:|",
            "| own   |         0.00 |     - |  0.00 |",
            "| prose | 25.00 [math] | 50.00 | 37.50 |",
            "(average@4 in %; [math]: scored by the reward math, not the benchmark's own verifier)",
        ]
    )


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(["eval", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_cli_refusals_come_before_the_model_loads(
    tiny_chat_model_dir: Path, gsm8k_dir: Path, capsys, monkeypatch
) -> None:
    import gmts.eval.backends as backends

    monkeypatch.setattr(backends, "make_backend", lambda *a, **k: pytest.fail("model loaded"))
    base = ["--model", str(tiny_chat_model_dir), "--data-dir", str(gsm8k_dir)]
    cases = {
        ("--benchmarks", "gsm8k", "--verifier", "nope"): "unknown verifier 'nope'",
        ("--benchmarks", "gsm8k,humaneval", "--verifier", "math"): "code benchmark 'humaneval'",
        ("--benchmarks", "gsm8k", "--verifier", "math", "--reward", "exact"): "give one",
    }
    for argv, message in cases.items():
        rc, out, err = _run([*base, *argv], capsys)
        assert rc == 2 and out == "" and message in err, err
        assert err.count("\n") == 1  # one line


def test_cli_end_to_end_records_the_verifier_and_refuses_to_resume_without_it(
    tiny_chat_model_dir: Path, gsm8k_dir: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "res.json"
    common = [
        "--model", str(tiny_chat_model_dir), "--benchmarks", "gsm8k", "--data-dir", str(gsm8k_dir),
        "--limit", "2", "--n", "2", "--max-new-tokens", "4", "--out", str(out), "--name", "tiny",
        "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    rc, table, err = _run([*common, "--verifier", "math"], capsys)
    assert rc == 0, err
    assert "[math]" in table.splitlines()[2] and "[math]: scored by the reward math" in table
    data = json.loads(out.read_text())
    assert data["settings"]["verifier"] == "math"
    assert data["summary"]["benchmarks"]["gsm8k"]["verifier_override"] == "math"
    header = json.loads(partial_results_path(out).read_text().splitlines()[0])
    assert header["settings"]["verifier"] == "math"
    reward = get_reward("math")
    for record in data["results"]["gsm8k"]:
        assert record["rewards"] == [reward(c, record["answer"]) for c in record["completions"]]

    rc, _, err = _run(common, capsys)  # the same --out, without --verifier
    assert rc == 2 and "differs in: verifier" in err and "--fresh" in err
