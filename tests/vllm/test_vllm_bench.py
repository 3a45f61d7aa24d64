"""The rollout benchmark (benchmarks/bench_rollout.py: hf vs vLLM tokens/s) runs end to end in
--quick mode, writes its JSON and renders its block. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from file_modules import load_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_tiny import SKIP_REASON, vllm_installed  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON)

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, filename: str):
    sys.path.insert(0, str(BENCH_DIR))
    return load_module(BENCH_DIR / filename, name)


@pytest.mark.slow
def test_quick_rollout_benchmark(tmp_path):
    bench_run = _load("gmts_bench_run_vllm", "run.py")
    report = _load("gmts_bench_report_vllm", "report.py")
    assert "rollout" in bench_run.parse_only(None)  # vllm is installed here
    assert bench_run.main(["--only", "rollout", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "rollout.json").read_text())
    assert record["status"] == "ok" and record["quick"] is True
    engines = {row["engine"]: row for row in record["rows"]}
    assert set(engines) == {"hf", "vllm"}
    for row in engines.values():
        assert row["tokens_per_call_mean"] > 0 and row["tokens_per_s_median"] > 0
    assert record["engine_start_s"] > 0 and record["weight_sync"]["median_s"] > 0
    markdown = report.render(record)
    assert "vLLM / hf tokens per second" in markdown and "| vllm |" in markdown


@pytest.mark.slow
def test_quick_real_model_rollout_benchmark(tmp_path):
    """benchmarks/bench_rollout_real.py --quick with vLLM: all six contenders measured."""
    helpers = load_module(
        Path(__file__).resolve().parents[1] / "benchmarks" / "test_bench_rollout_real.py",
        "gmts_test_bench_rollout_real",
    )
    result = helpers.run_quick(tmp_path)
    assert not result["raw"]["skipped"]
    for name in ("vllm_plain", "vllm_engine"):
        assert 0 < result["contenders"][name]["tokens_per_call"][0] <= 8 * 4
    assert result["ratios"]["engine_vs_plain"]["median"] > 0


@pytest.mark.slow
def test_quick_throughput_real_benchmark(tmp_path):
    """benchmarks/bench_throughput_real.py --quick with vLLM: the vllm trainer and plain vLLM
    measured on the same rows, the old path's vllm trainer (a second engine in the process)
    beside the new one, every ratio taken."""
    helpers = load_module(
        Path(__file__).resolve().parents[1] / "benchmarks" / "test_bench_throughput_real.py",
        "gmts_test_bench_throughput_real",
    )
    record = helpers.run_quick(tmp_path)
    raw = record["raw"]
    assert not raw["skipped"]
    for vllm_step, plain_step in zip(raw["rows"]["vllm"], raw["rows"]["vllm_plain"]):
        assert vllm_step["step"] == plain_step["step"]
        assert vllm_step["engine_sample_s"] > 0
        # the engine starts from the policy's weights: synced after every update, not before 1
        assert (vllm_step["weight_sync_s"] > 0) == (vllm_step["step"] > 0)
        assert 0 < plain_step["tokens"] <= 2 * 2 * 8
    for new, old in zip(raw["rows"]["vllm"], raw["rows"]["vllm_old"]):
        assert new["step"] == old["step"] and old["engine_sample_s"] > 0
        assert new["positions_computed"] < old["positions_computed"]
    assert "model.forward_layout=padded" in raw["gmts_config"]["overrides"]["vllm_old"]
    for label in (
        "vllm_vs_trl_tokens_per_s",
        "vllm_old_vs_trl_tokens_per_s",
        "vllm_vs_vllm_old_step_time",
        "vllm_vs_vllm_old_rollout_time",
        "vllm_vs_vllm_old_update_time",
        "vllm_vs_vllm_old_positions_computed",
        "trainer_rollout_vs_plain_vllm",
        "trainer_rollout_without_sync_vs_plain_vllm",
        "engine_sample_vs_plain_vllm",
    ):
        assert record["ratios"][label]["median"] > 0
    assert [order[0] for order in raw["orders"]] == ["trl", "hf", "hf_old"]
