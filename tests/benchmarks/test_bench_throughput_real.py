"""benchmarks/bench_throughput_real.py (gmts train on both engines, today's path and issue 34's
old one, vs TRL's GRPOTrainer, and the trainer's vLLM rollout vs plain vLLM) runs end to end in
--quick mode on a random tiny llama: a record with provenance, every contender's steps measured
(or its skip recorded), the same prompt token ids on every side, ratios taken per step, the old
path's overrides on its contenders only. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from file_modules import load_module

pytest.importorskip("trl")

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
QUICK = {"steps": 3, "questions": 2, "group_size": 2, "new_tokens": 8}


def _bench():
    sys.path.insert(0, str(BENCH_DIR))
    return load_module(BENCH_DIR / "bench_throughput_real.py", "gmts_bench_throughput_real")


def run_quick(tmp_path: Path) -> dict:
    """Run the quick mode into ``tmp_path`` and check what every run must hold."""
    bench = _bench()
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "throughput_real.json").read_text())
    assert record["quick"] is True and record["commit"] and record["command"]
    assert record["machine"]["uptime"] and len(record["load_before"]) == 3
    raw = record["raw"]
    assert raw["prompt_tokens_checked"] is True and raw["prompt_example"]["ids"]
    assert raw["gmts_config"]["selection"] == "entropy 0.2"
    assert raw["gmts_config"]["kl_coef"] == 0.0
    rows_per_step = QUICK["questions"] * QUICK["group_size"]
    for name in ("trl", "hf", "hf_old"):
        steps = raw["rows"][name]
        assert [s["step"] for s in steps] == list(range(QUICK["steps"]))
        for s in steps:
            assert 0 < s["tokens"] <= rows_per_step * QUICK["new_tokens"]
            assert s["step_s"] > 0 and s["peak_rss_mib"] > 0
        row = record["contenders"][name]
        assert row["timed_steps"] == QUICK["steps"] - 1  # the warm-up dropped
        assert row["tokens_per_s"]["median"] > 0
    assert all(s["generate_s"] > 0 for s in raw["rows"]["trl"])
    for name in ("hf", "hf_old"):
        for s in raw["rows"][name]:
            assert 0 < s["rollout_s"] < s["step_s"] and 0 < s["update_s"] < s["step_s"]
            assert s["positions_computed"] > 0 and s["positions_real"] > 0
    # the same questions and seed: the old path samples the new one's tokens; padded rows
    # compute at least the real positions, grouped ones (each prompt once per group) fewer
    for new, old in zip(raw["rows"]["hf"], raw["rows"]["hf_old"]):
        assert new["tokens"] == old["tokens"]
        assert new["positions_real"] == old["positions_real"] <= old["positions_computed"]
        assert new["positions_computed"] < old["positions_computed"]
    overrides = raw["gmts_config"]["overrides"]
    assert "model.forward_layout=padded" in overrides["hf_old"]
    assert "rollout.drop_finished_rows=false" in overrides["hf_old"]
    assert not any("forward_layout" in o or "drop_finished" in o for o in overrides["hf"])
    for label in (
        "hf_vs_trl_tokens_per_s",
        "hf_old_vs_trl_tokens_per_s",
        "hf_vs_hf_old_step_time",
        "hf_vs_hf_old_rollout_time",
        "hf_vs_hf_old_update_time",
        "hf_vs_hf_old_positions_computed",
        "hf_vs_hf_old_tokens_per_s",
    ):
        ratio = record["ratios"][label]
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"], label
    # the contenders' order rotates from step to step
    assert len({tuple(order) for order in raw["orders"]}) > 1
    goals = {g["name"]: g for g in record["goals"]}
    assert len(goals) == 7 and all(g["met"] is None for g in goals.values())  # quick
    assert sum("issue 34" in name for name in goals) == 4
    return record


def test_quick_mode_without_vllm(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed: tests/vllm/test_vllm_bench.py runs the full quick mode")
    record = run_quick(tmp_path)
    assert set(record["raw"]["skipped"]) == {"vllm", "vllm_old", "vllm_plain"}
    assert "vllm_vs_trl_tokens_per_s" not in record["ratios"]
    assert "vllm_vs_vllm_old_step_time" not in record["ratios"]
    assert record["raw"]["orders"] == [
        ["trl", "hf", "hf_old"],
        ["hf", "hf_old", "trl"],
        ["hf_old", "trl", "hf"],
    ]


def test_rotation_covers_every_position():
    bench = _bench()
    n = len(bench.CONTENDERS)
    orders = [bench.rotation(step) for step in range(n)]
    for name in bench.CONTENDERS:
        assert sorted(order.index(name) for order in orders) == list(range(n))


def test_bad_arguments_fail_before_any_work(tmp_path):
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--steps", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["--set", "selection.score=gmts", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["--set", "rollout.no_such_field=1", "--out", str(tmp_path)])
    for contenders in ("hf_old,vllm", "hf,nope"):  # hf must run (TRL mirrors it); known names
        with pytest.raises(SystemExit):
            bench.main(["--contenders", contenders, "--out", str(tmp_path)])
    assert not (tmp_path / "throughput_real.json").exists()


def test_trl_cannot_mirror_a_gmts_selection_it_lacks():
    from gmts.train.config import load_config

    bench = _bench()
    cfg = load_config(bench.DEFAULT_CONFIG, ["selection.score=gmts"])
    with pytest.raises(ValueError, match="TRL has ETS only"):
        bench.check_trl_can_match(cfg)
    bench.check_trl_can_match(load_config(bench.DEFAULT_CONFIG))  # the shipped config


def test_hf_only_overrides_reach_the_hf_trainer_only(tmp_path):
    """``--hf-set`` (the hf sampler's speed settings, which the vllm engine refuses) lands in
    the hf trainer's overrides and not the vllm one's; a bad one fails before any work."""
    bench = _bench()
    args = SimpleNamespace(
        threads=2,
        steps=2,
        model=None,
        dataset=None,
        questions=None,
        group_size=None,
        new_tokens=None,
        max_prompt_length=None,
        set=["logging.overlap_metrics=false"],
        hf_set=["rollout.draw=inverse_cdf"],
    )
    hf = bench.gmts_overrides(args, "hf", tmp_path / "hf")
    vllm = bench.gmts_overrides(args, "vllm", tmp_path / "vllm")
    assert "rollout.draw=inverse_cdf" in hf and "rollout.draw=inverse_cdf" not in vllm
    assert "logging.overlap_metrics=false" in hf and "logging.overlap_metrics=false" in vllm
    # the old path: its settings last (they win), drop_finished_rows on the hf engine only
    hf_old = bench.gmts_overrides(args, "hf_old", tmp_path / "hf_old")
    vllm_old = bench.gmts_overrides(args, "vllm_old", tmp_path / "vllm_old")

    def without_run_dir(overrides: list[str]) -> list[str]:
        return [o for o in overrides if not o.startswith("logging.output_dir=")]

    assert without_run_dir(hf_old[:-2]) == without_run_dir(hf)
    assert without_run_dir(vllm_old[:-1]) == without_run_dir(vllm)
    assert hf_old[-2:] == ["model.forward_layout=padded", "rollout.drop_finished_rows=false"]
    assert vllm_old[-1:] == ["model.forward_layout=padded"] and "rollout.engine=vllm" in vllm_old
    from gmts.train.config import load_config

    for overrides in (hf_old, vllm_old):  # both load (vllm refuses drop_finished_rows=false)
        load_config(bench.DEFAULT_CONFIG, overrides)
    with pytest.raises(SystemExit):
        bench.main(["--hf-set", "rollout.draw=gumbel", "--out", str(tmp_path)])
    assert not (tmp_path / "throughput_real.json").exists()
