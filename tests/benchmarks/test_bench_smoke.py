"""Smoke test of the benchmark harness (benchmarks/run.py): runs, writes JSON, renders markdown.

No timing is asserted (machines are noisy); only that the harness works end to end on tiny
shapes and that the measured variants compute the same numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import bench_logprobs  # noqa: E402
import report  # noqa: E402
import run as bench_run  # noqa: E402


def test_parse_only_validates_names() -> None:
    assert bench_run.parse_only("logprobs,selection") == ["selection", "logprobs"]
    assert bench_run.parse_only(None) == list(bench_run.BENCHMARKS)
    with pytest.raises(ValueError, match="unknown benchmark"):
        bench_run.parse_only("selection,nope")


def test_quick_selection_writes_json_and_renders(tmp_path: Path) -> None:
    code = bench_run.main(["--only", "selection", "--quick", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "selection.json").read_text())
    assert record["status"] == "ok" and record["quick"] is True
    assert record["machine"]["nproc"]
    for row in record["rows"]:
        assert row["exact_count"] and row["is_top_k"]
        assert row["select_tokens"]["ok"] and row["select_tokens"]["median_s"] > 0
    markdown = report.render(record)
    assert "select_tokens" in markdown and "exact top-k" in markdown


def test_report_replaces_only_marked_block(tmp_path: Path) -> None:
    record = {"benchmark": "selection", "status": "error", "error": "boom", "rows": []}
    (tmp_path / "selection.json").write_text(json.dumps(record))
    doc = tmp_path / "results.md"
    doc.write_text(
        "intro\n<!-- results:selection:begin -->\nold\n<!-- results:selection:end -->\nend\n"
    )
    assert report.update_results_doc(tmp_path, doc) == ["selection"]
    text = doc.read_text()
    assert "old" not in text and "boom" in text
    assert text.startswith("intro\n") and text.endswith("end\n")


def test_logprob_variants_agree_in_process() -> None:
    results = {
        name: bench_logprobs.worker(name, n=24, v=50, h=8, repeats=1, threads=1)
        for name in bench_logprobs.VARIANTS
    }
    naive = results["naive"]["checks"]
    for name, result in results.items():
        for key, value in result["checks"].items():
            assert value == pytest.approx(naive[key], rel=1e-4, abs=1e-4), (name, key)
        assert result["peak_beyond_params_grads_bytes"] is not None
