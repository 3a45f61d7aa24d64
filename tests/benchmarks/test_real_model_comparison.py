"""benchmarks/real_model_comparison.py end to end in its quick mode, on the real model
(SmolLM2-135M-Instruct): each run's record written as it finishes and reused, the pretrained
model evaluated once per seed, the summary, the figure and --report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "real_model_comparison.py"


@pytest.mark.slow
def test_quick_comparison_writes_each_run_and_reuses_it(tmp_path, real_model):
    command = [sys.executable, str(SCRIPT), "--quick", "--seeds", "1", "--out", str(tmp_path)]
    command += ["--methods", "all tokens,GMTS top 20%"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    for suffix, fraction in (("none", 1.0), ("gmts", None)):
        record = json.loads((tmp_path / "real_model_runs" / f"{suffix}-seed0.json").read_text())
        assert record["seed"] == 0 and record["commit"] is not None
        # the seed's first method evaluates the pretrained model; the others reuse its figure
        assert [row["step"] for row in record["evals"]] == ([0, 1] if suffix == "none" else [1])
        assert [step["step"] for step in record["steps"]] == [1]
        assert 0.0 <= record["steps"][0]["reward/mean"] <= 1.0
        if fraction is not None:
            assert record["steps"][0]["select/fraction"] == fraction
        else:  # the top 20% of the step's tokens (or none when no group had a signal)
            assert record["steps"][0]["select/fraction"] <= 0.2 + 1e-9
    summary = json.loads((tmp_path / "real_model_comparison.json").read_text())
    assert set(summary["methods"]) == {"all tokens", "GMTS top 20%"}
    assert summary["pairs"][0]["a"] == "GMTS top 20%" and summary["pairs"][0]["std"] is None
    starts = {m: summary["methods"][m]["start"]["mean"] for m in summary["methods"]}
    assert starts["GMTS top 20%"] == starts["all tokens"]
    assert (tmp_path / "real_model_comparison.png").stat().st_size > 0
    # a second call finds both records and trains nothing
    mtime = (tmp_path / "real_model_runs" / "gmts-seed0.json").stat().st_mtime_ns
    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "real_model_runs" / "gmts-seed0.json").stat().st_mtime_ns == mtime
    # --report summarises the records without training, to the same summary
    (tmp_path / "real_model_comparison.json").unlink()
    report = subprocess.run(
        [sys.executable, str(SCRIPT), "--report", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert json.loads((tmp_path / "real_model_comparison.json").read_text()) == summary
    assert (tmp_path / "real_model_runs" / "gmts-seed0.json").stat().st_mtime_ns == mtime


def test_docs_hold_the_summary_of_the_committed_records():
    """docs/results.md's comparison table is what --report prints from the committed run
    records (benchmarks/results/real_model/real_model_runs), so neither can go stale alone."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import real_model_comparison as comparison

    records = comparison.read_records(REPO / "benchmarks" / "results" / "real_model")
    assert len({r["seed"] for r in records}) >= 3 and len({r["method"] for r in records}) == 4
    table = comparison.format_summary(comparison.summarize(records))
    assert table in (REPO / "docs" / "results.md").read_text()
