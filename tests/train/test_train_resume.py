"""A run killed with SIGKILL mid-training and resumed logs exactly the same per-step metrics
(and ends with the same weights) as an uninterrupted run with the same seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gmts.train.checkpoint import list_checkpoints
from gmts.train.metrics_log import TIMING_KEYS, read_metrics

from file_modules import load_module

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "_resume_script.py")
_tiny = load_module(HERE / "_tiny.py", "_tiny")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _without_timing(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def _final_params(run_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    (_, path), *_ = reversed(list_checkpoints(run_dir))
    return _tiny.params_vector(AutoModelForCausalLM.from_pretrained(path / "model"))


@pytest.mark.slow
def test_sigkill_and_resume_gives_identical_metrics(tmp_path):
    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(
        [sys.executable, SCRIPT, str(model_dir), str(straight)], check=True, env=ENV, timeout=600
    )

    proc = subprocess.Popen([sys.executable, SCRIPT, str(model_dir), str(killed)], env=ENV)
    deadline = time.monotonic() + 600
    while not list_checkpoints(killed) and time.monotonic() < deadline:
        assert proc.poll() is None, "run ended before its first checkpoint"
        time.sleep(0.02)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = max(s for s, _ in list_checkpoints(killed))
    assert done < 8

    subprocess.run(
        [sys.executable, SCRIPT, str(model_dir), str(killed), "--resume"],
        check=True,
        env=ENV,
        timeout=600,
    )
    a, b = read_metrics(straight), read_metrics(killed)
    assert [r["step"] for r in b] == list(range(1, 9))
    assert _without_timing(a) == _without_timing(b)
    assert torch.equal(_final_params(straight), _final_params(killed))
