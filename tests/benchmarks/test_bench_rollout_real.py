"""benchmarks/bench_rollout_real.py (ours vs ``generate`` vs vLLM on a real model) runs end to
end in --quick mode on a random tiny llama: a record with provenance, every contender measured
(or its skip recorded), ratios taken per round. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH_DIR))
    return load_module(BENCH_DIR / "bench_rollout_real.py", "gmts_bench_rollout_real")


def run_quick(tmp_path: Path) -> dict:
    """Run the quick mode into ``tmp_path`` and check what every run must hold."""
    bench = _bench()
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "rollout_real.json").read_text())
    assert record["quick"] is True and record["commit"] and record["command"]
    assert record["machine"]["uptime"] and len(record["load_before"]) == 3
    result = record["results"]["float32"]
    for name in ("ours", "ours_inverse_cdf", "ours_fast", "generate"):
        row = result["contenders"][name]
        assert row["tokens_per_s_median"] > 0
        # 8 rows of at most 4 tokens (a random model may sample the stop id before)
        assert 0 < row["tokens_per_call"][0] <= 8 * 4
    for ratio in ("ours_vs_generate", "fast_vs_generate", "inverse_cdf_vs_ours", "prepack_effect"):
        assert result["ratios"][ratio]["median"] > 0
    return result


def test_quick_mode_without_vllm(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed: tests/vllm/test_vllm_bench.py runs the full quick mode")
    result = run_quick(tmp_path)
    assert set(result["raw"]["skipped"]) == {"vllm_plain", "vllm_engine"}
    assert "engine_vs_plain" not in result["ratios"]
