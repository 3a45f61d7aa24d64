"""benchmarks/profile_logprobs.py (where the log-prob step's time goes, docs/results.md) cannot
rot unseen: its ``--quick`` path runs here and writes the JSON that report.py renders into the
page; the page's block is checked against the committed JSON by test_bench_smoke.py. No timing
is asserted, only what the shapes fix: how many (N, H) x (H, V) matmuls each path does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, filename: str):
    return load_module(BENCH_DIR / filename, name, register=True)


def test_profile_logprobs_quick(tmp_path: Path) -> None:
    profile_logprobs = _load("gmts_bench_profile_logprobs", "profile_logprobs.py")
    report = _load("gmts_bench_report_profile", "report.py")
    out = tmp_path / "profile_logprobs.json"
    assert profile_logprobs.main(["--quick", "--out", str(out), "--rows", "3"]) == 0
    record = json.loads(out.read_text())
    assert record["benchmark"] == "profile_logprobs" and record["quick"] is True
    assert (record["v"], record["h"]) == (4096, 64) and record["machine"]["nproc"]
    rows = {(r["n"], r["variant"]): r for r in record["rows"]}
    assert set(rows) == {(64, "naive"), (64, "from_hidden")}
    # the naive path's forward and two gradients; the from-hidden path recomputes the logits
    assert rows[64, "naive"]["vocab_matmuls"] == pytest.approx(3.0)
    assert rows[64, "from_hidden"]["vocab_matmuls"] == pytest.approx(4.0)
    for r in rows.values():
        assert 0 < r["matmul_s"] <= r["profiled_s"] and 0 < r["matmul_share"] <= 1
        assert r["other_s"] == pytest.approx(r["profiled_s"] - r["matmul_s"])
        assert r["step_wall_s"] > 0 and len(r["top_operators"]) == 3
    page = report.render(record)
    assert "| 64 | from_hidden |" in page and "4.00" in page and "3.00" in page


def test_matmul_flops_reads_mm_and_addmm_shapes() -> None:
    profile_logprobs = _load("gmts_bench_profile_logprobs", "profile_logprobs.py")
    assert profile_logprobs.matmul_flops("aten::mm", [[2, 3], [3, 5], [2, 5]]) == 60
    assert profile_logprobs.matmul_flops("aten::addmm", [[5], [2, 3], [3, 5]]) == 60
    assert profile_logprobs.matmul_flops("aten::addmm_", [[2, 5], [2, 3], [3, 5]]) == 60
