"""Prompt + generation budget longer than the model's positions: a clear error at load time
(naming the numbers and the settings), never an IndexError inside the position embedding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmts.cli import main
from gmts.models.context import ContextError, ContextLimit, check_fits, context_limit

from file_modules import load_module

REPO = Path(__file__).resolve().parents[2]
_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


def test_limit_is_the_smaller_of_config_and_meaningful_tokenizer_length():
    class Config:
        max_position_embeddings = 4096

    class Tokenizer:
        model_max_length = 1024

    class Unknown:
        model_max_length = int(1e30)  # transformers' filler for "not known"

    assert context_limit(Config(), Tokenizer()).positions == 1024
    assert context_limit(Config(), Unknown()).positions == 4096
    check_fits(
        prompt_tokens=96, new_tokens=4000, limit=ContextLimit(4096, "x"), what="w", settings="s"
    )
    with pytest.raises(ContextError, match=r"97 tokens\) \+ 4000 new tokens = 4097 .*4096"):
        check_fits(
            prompt_tokens=97, new_tokens=4000, limit=ContextLimit(4096, "x"), what="w", settings="s"
        )


def test_train_on_gsm8k_with_the_demo_config_is_a_clear_error(
    tiny_dir, tmp_path, shared_data, capsys, monkeypatch
):
    """`gmts train --config configs/demo.yaml data.dataset=gsm8k` (the embedded model has 64
    positions and reads only its task alphabet) used to die with IndexError in the position
    embedding: now the text it cannot read stops it, and a file it can read but that does not
    fit stops at the context guard, both before any weight is read."""

    def train(*overrides: str) -> tuple[int, str]:
        code = main(
            [
                "train",
                "--config",
                str(REPO / "configs" / "demo.yaml"),
                *overrides,
                f"model.path={tiny_dir}",  # the embedded warm start's shape, without building it
                f"logging.output_dir={tmp_path / 'run'}",
            ]
        )
        return code, capsys.readouterr().err

    monkeypatch.setenv("GMTS_DATA_DIR", str(shared_data))
    code, err = train("data.dataset=gsm8k")
    assert code == 2 and "cannot encode" in err and "'0123456789+-*=>'" in err
    digits = tmp_path / "digits.jsonl"
    digits.write_text(json.dumps({"problem": "1+" * 30 + "1=", "answer": "31"}) + "\n")
    # an explicit budget (a null one is fitted to the context the prompt leaves)
    code, err = train(
        f"data.dataset={digits}", "data.template=null", "rollout.max_response_length=16"
    )
    assert code == 2
    assert "exceeds the model's context of 64 (max_position_embeddings" in err
    assert "rollout.max_prompt_length" in err and "rollout.max_response_length" in err
    assert "Traceback" not in err and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_eval_math500_on_a_64_position_model_is_a_clear_error(
    tiny_dir, shared_data, tmp_path, capsys
):
    """`gmts eval --model <embedded warm start> --benchmarks math500` used to die with
    IndexError; now it stops before loading the weights."""
    code = main(
        [
            "eval",
            "--model",
            str(tiny_dir),
            "--benchmarks",
            "math500",
            "--data-dir",
            str(shared_data),
            "--out",
            str(tmp_path / "eval.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "benchmark math500" in err and "exceeds the model's context of 64" in err
    assert "--max-new-tokens (default: the benchmark's 2048)" in err
    assert "loading" not in err  # refused before the model was loaded


def test_builtin_task_budget_beyond_the_positions(tiny_dir, tmp_path):
    from gmts.train.trainer import Trainer

    cfg = _tiny.small_config(tiny_dir, tmp_path / "run", "rollout.max_response_length=60")
    with pytest.raises(ContextError, match=r"data.task addition: .*8 tokens\) \+ 60 new .*= 68"):
        Trainer(cfg)
    Trainer(_tiny.small_config(tiny_dir, tmp_path / "ok", "rollout.max_response_length=56"))


def test_dataset_prompts_dropped_by_max_prompt_length_are_counted(tiny_dir, tmp_path):
    """The documented policy: prompts over rollout.max_prompt_length are dropped at load and
    counted; the kept prompts + the budget must still fit."""
    import json

    from gmts.train.trainer import Trainer

    data = tmp_path / "train.jsonl"
    rows = [{"problem": f"{a}+1=", "answer": str(a + 1)} for a in range(10, 20)]
    rows.append({"problem": "9" * 60, "answer": "0"})
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = (f"data.dataset={data}", "data.template=null", "algorithm=grpo")
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "a",
        *base,
        "rollout.max_prompt_length=40",
        "rollout.max_response_length=30",
    )
    trainer = Trainer(cfg)
    assert trainer.source.skipped_too_long == 1 and trainer.prompt_tokens == 5
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "b",
        *base,
        "rollout.max_prompt_length=64",
        "rollout.max_response_length=30",
    )
    with pytest.raises(ContextError, match=r"0 longer than rollout.max_prompt_length=64 dropped"):
        Trainer(cfg)


def test_analyze_budget_beyond_the_positions(tiny_dir, tmp_path, capsys):
    code = main(
        ["analyze", "--model", str(tiny_dir), "--max-new-tokens", "100", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "task addition" in capsys.readouterr().err


def test_eval_sampler_refuses_before_sampling(tiny_dir):
    """gmts eval's hf sampler is given the model's context (64 positions)."""
    from gmts.eval.backends import BackendOptions, make_backend

    sampler = make_backend("hf", BackendOptions(tiny_dir, device="cpu", dtype="float32"))
    kw = dict(num_samples=1, temperature=1.0, seed=0)
    with pytest.raises(ValueError, match="the hf sampler: .* exceeds the model's context of 64"):
        sampler.sample(["1" * 40], max_new_tokens=30, **kw)
    assert sampler.sample(["12+34="], max_new_tokens=5, **kw).batch_size == 1
