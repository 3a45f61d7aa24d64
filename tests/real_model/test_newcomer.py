"""A newcomer's first session, as README and docs/training.md ("Your own data") tell it: from a
clean cache (SmolLM2-135M-Instruct converted again, about a minute), their own JSONL of sums in
prose whose prompts differ in length, ``gmts eval`` and two training steps with the defaults
(template, temperature and budget unset), both through the real command line.

Checked: exit status 0; the first lines name the template, the temperature and the budget with
the flag or key of each; the training either rewarded some answer or said that the first steps
had no learning signal. Sized small (4 questions x 2 answers to evaluate, 2 x 2 per step, one
sampling round) so that the conversion is most of its time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gmts.train.metrics_log import read_metrics

pytestmark = pytest.mark.slow

SUMS = ((7, 5), (123, 45), (38, 4), (9, 870), (61, 27), (402, 3))
"""1- to 3-digit operands: the prompts' token lengths differ, across groups of one batch."""
WORDINGS = ("What is {a} + {b}?", "Add {a} and {b}.", "Compute the sum of {a} and {b}.")


def _own_file(path: Path) -> Path:
    rows = [
        {"problem": WORDINGS[i % len(WORDINGS)].format(a=a, b=b), "answer": str(a + b)}
        for i, (a, b) in enumerate(SUMS)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _gmts(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gmts", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def _first_lines(stderr: str, command: str) -> str:
    """The command's own first line (the conversion's lines may come before it)."""
    return next(line for line in stderr.splitlines() if line.startswith(f"{command}: "))


def test_a_newcomer_evaluates_and_trains_smollm2_on_their_own_file(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GMTS_CACHE": str(tmp_path / "clean-cache"),  # nothing converted yet
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    mine = _own_file(tmp_path / "mine.jsonl")

    evaluated = _gmts(
        "eval", "--model", "smollm2-135m-instruct", "--benchmarks", str(mine),
        "--limit", "4", "--n", "2", "--threads", "1", "--out", str(tmp_path / "eval.json"),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert "gmts: converting SmolLM2-135M-Instruct" in evaluated.stderr.splitlines()[0]
    line = _first_lines(evaluated.stderr, "gmts eval")
    assert "template plain (--template; auto: the question in the model's chat template)" in line
    assert "temperature 1.0 (--temperature)" in line
    assert "budget 128 new tokens (--max-new-tokens; fitted: " in line
    header = [cell.strip() for cell in evaluated.stdout.splitlines()[0].split("|")[1:-1]]
    assert header == ["Model", "mine.jsonl", "Avg."]

    run = tmp_path / "run"
    trained = _gmts(
        "train", "model.path=smollm2-135m-instruct", f"data.dataset={mine}",
        "rollout.questions_per_batch=2", "rollout.group_size=2", "rollout.max_sampling_rounds=1",
        "optim.steps=2", "optim.micro_batch_size=4", "checkpoint.save_final=false", "threads=1",
        f"logging.output_dir={run}",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    line = _first_lines(trained.stderr, "gmts train")
    assert line.startswith("gmts train: template plain (data.template; auto: ")
    assert "temperature 1.0 (rollout.temperature)" in line
    assert "budget 128 new tokens (rollout.max_response_length; fitted: " in line
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == [1, 2]
    rewarded = any(row["reward/raw_mean"] > 0 for row in rows)
    assert rewarded or "no learning signal in the first 2 step(s)" in trained.stderr
