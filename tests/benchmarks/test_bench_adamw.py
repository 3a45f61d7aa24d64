"""benchmarks/bench_adamw.py: its quick mode times every implementation of ``optim.adamw`` on
the same weights and gradients and finds their updates equal to rounding."""

import json
import sys
from pathlib import Path

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_mode_times_each_implementation_and_they_agree(tmp_path):
    sys.path.insert(0, str(BENCH_DIR))
    module = load_module(BENCH_DIR / "bench_adamw.py", "gmts_bench_adamw")
    assert module.main(["--quick", "--threads", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "adamw.json").read_text())
    assert set(record["seconds"]) == {"for-loop", "foreach", "fused"}
    assert all(len(s["times_s"]) == 2 for s in record["seconds"].values())
    assert record["over_default_per_round"]["for-loop"]["median"] == 1.0
    drift = record["max_weight_difference_to_default"]
    assert drift["for-loop"] == 0.0 and drift["fused"] < 1e-6 and drift["foreach"] < 1e-6
    assert record["tensors"] > 10 and record["quick"] is True
