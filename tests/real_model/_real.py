"""Helpers shared by the real-model tests (not a test module): a tiny JSONL of 2-digit
additions SmolLM2-135M-Instruct answers right about half the time, and the trainer's
smallest run on it."""

from __future__ import annotations

import json
from pathlib import Path

MODEL_NAME = "smollm2-135m-instruct"

QUESTIONS = ((10, 10), (11, 11))
"""2-digit additions the model gets right about half the time at temperature 0.7 in 16
tokens, so a group of 4 answers has mixed rewards and GRPO has signal. Measured 2026-12-03
(hf sampler, seed 0, plain template, last-number reading): 10 + 10 right in 1 of 4
("10 + 10 = 20." vs prose that ends on another number), 11 + 11 in 2 of 4; harder sums
such as 23 + 45 were right in 0 of 4 (and a step with all rewards equal trains nothing)."""

RATIO = 0.2


def write_additions(path: Path) -> Path:
    """``path``: one JSON object per line, ``{"problem": "What is a + b?", "answer": "a+b"}``."""
    rows = [{"problem": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in QUESTIONS]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def real_overrides(model: str, dataset: Path, run_dir: Path) -> list[str]:
    """One GMTS step (top 20%) of GRPO on the 2 questions x 4 answers, 16 new tokens each."""
    return [
        f"model.path={model}",
        f"logging.output_dir={run_dir}",
        "logging.progress=false",
        f"data.dataset={dataset}",
        "data.reward=math",
        "data.template=plain",
        "data.shuffle=false",
        "selection.score=gmts",
        f"selection.ratio={RATIO}",
        "rollout.questions_per_batch=2",
        "rollout.group_size=4",
        "rollout.max_response_length=16",
        "rollout.temperature=0.7",
        "optim.steps=1",
        "optim.lr=1e-5",
        "optim.micro_batch_size=8",
        "checkpoint.save_final=false",
    ]


def check_step(row: dict) -> None:
    """What one real step must show: rewards in [0, 1] with signal, exactly ceil(0.2 N) of the
    N tokens selected, a finite non-zero gradient."""
    assert 0.0 <= row["reward/mean"] <= 1.0
    assert 0.0 < row["reward/accuracy"] < 1.0, "no mixed group: the step had no signal"
    assert row["update/skipped_nonfinite"] == 0
    n = row["response/tokens"]
    assert RATIO <= row["select/fraction"] <= RATIO + 1.0 / n + 1e-9, row["select/fraction"]
    assert 0.0 < row["update/grad_norm"] < float("inf")
