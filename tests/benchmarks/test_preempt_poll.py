"""benchmarks/bench_preempt_poll.py (the poll's cost in docs/training.md, from
benchmarks/results/preempt_poll.json) cannot rot unseen: its ``--quick`` path runs here under
``torchrun --nproc_per_node 2`` (gloo), on a randomly initialised tiny model through
``GMTS_BENCH_MODEL``. Only the record's structure and sanity are checked, no timing goal
(machines are noisy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_bench_model(tmp_path: Path) -> Path:
    """A random model of the warm start's architecture (the embedded GPT-2 and tokenizer)."""
    from gmts.embedded.tiny_model import build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    folder = tmp_path / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow  # two torchrun ranks: 12 s here (18 s with the model; 2 cores, load 1.9)
def test_preempt_poll_quick(tiny_bench_model: Path, tmp_path: Path, free_port: int) -> None:
    out = tmp_path / "preempt_poll.json"
    src = str(REPO / "src")
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": src + (os.pathsep + path if path else ""),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "GMTS_BENCH_MODEL": str(tiny_bench_model),
    }
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        + [f"--master_port={free_port}", str(REPO / "benchmarks" / "bench_preempt_poll.py")]
        + ["--quick", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "preempt_poll" and record["quick"] is True
    assert record["world_size"] == 2 and record["device"] == "cpu"
    assert (record["questions"], record["group_size"], record["polls_per_block"]) == (8, 4, 50)
    step, poll = record["step"], record["poll"]
    for timing in (step, poll):
        assert len(timing["times_s"]) == 2  # the quick rounds, the warm-up round not counted
        assert 0 < timing["min_s"] <= timing["median_s"] <= timing["max_s"]
    assert len(record["poll_us_spread"]) == 2
    # one all-reduce of one element is far cheaper than a training step, even a tiny one
    assert poll["median_s"] < step["median_s"]
    assert record["poll_over_step_median"] == pytest.approx(poll["median_s"] / step["median_s"])
    assert "poll / step" in done.stdout  # rank 0's summary line
