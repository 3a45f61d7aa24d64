"""benchmarks/bench_step_commits.py (a step of today's code against an older commit's): its
quick mode, both sides today's code, on a random tiny llama."""

import sys
from pathlib import Path

import pytest

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _module():
    sys.path.insert(0, str(BENCH_DIR))
    return load_module(BENCH_DIR / "bench_step_commits.py", "gmts_bench_step_commits")


@pytest.mark.slow
def test_quick_mode_pairs_the_two_sides_and_their_first_steps_agree():
    record = _module().run(["--quick", "--threads", "1"])
    sides = [(p["round"], p["side"]) for p in record["processes"]]
    assert sides == [(0, "old"), (0, "new")]
    for process in record["processes"]:
        assert [s["step"] for s in process["steps"]] == [1, 2]
        assert process["peak_rss_kib"] > 0
        assert "update/positions_computed" in process["steps"][0]
    summary = record["summary"]
    # the same code on both sides: the same seed gives the same first rollout
    assert summary["step1_equal"] == [True]
    assert summary["new_over_old time/step_s"]["n"] == 1
    assert summary["new_over_old time/step_s"]["median"] > 0


def test_old_src_must_hold_gmts(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        _module().run(["--old-src", str(tmp_path), "--quick"])
