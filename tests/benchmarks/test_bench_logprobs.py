"""The log-prob benchmark's driver: its grid option, and one quick interleaved run end to end.

No timing is asserted (machines are noisy); only that every variant ran every step, the
workers computed the same numbers, and the record renders.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import bench_logprobs  # noqa: E402


def _load(name: str, filename: str):
    return load_module(BENCH_DIR / filename, name)


def test_parse_grid() -> None:
    assert bench_logprobs.parse_grid("1024x1, 4096x2") == [(1024, 1), (4096, 2)]
    for bad in ("1024", "1024x0", "x2", "1024x1,", "ax1"):
        with pytest.raises(ValueError, match="NxTHREADS"):
            bench_logprobs.parse_grid(bad)


def test_bad_grid_fails_before_running(capsys) -> None:
    bench_run = _load("gmts_bench_run_lp", "run.py")
    assert bench_run.main(["--only", "logprobs", "--logprobs-grid", "1024"]) == 2
    assert "NxTHREADS" in capsys.readouterr().err


def test_quick_run_interleaves_workers_and_renders(tmp_path: Path) -> None:
    bench_run = _load("gmts_bench_run_lp2", "run.py")
    report = _load("gmts_bench_report_lp", "report.py")
    assert bench_run.main(["--only", "logprobs", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "logprobs.json").read_text())
    assert record["status"] == "ok" and record["settings"]["grid"] == [[256, 1]]
    rows = {r["variant"]: r for r in record["rows"]}
    assert set(rows) == set(bench_logprobs.VARIANTS)
    for row in rows.values():
        assert row["ok"], row
        assert len(row["times_s"]) == len(row["cpu_times_s"]) == record["settings"]["repeats"]
        assert row["agrees_with_naive"] and row["time_vs_naive"] > 0
        assert row["peak_beyond_params_grads_bytes"] is not None
    markdown = report.render(record)
    assert "from_hidden" in markdown and "CPU time vs naive" in markdown
