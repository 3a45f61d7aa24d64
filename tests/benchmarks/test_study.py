"""benchmarks/study.py end to end in its quick mode on the real model (SmolLM2-135M-Instruct):
each run's record written as it finishes under a key of its resolved config and reused, the
seed's pretrained figure taken once, the summary with paired differences, the figure, and
--report training nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from file_modules import load_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "study.py"
study = load_module(SCRIPT, "study", register=True)


def test_a_record_key_follows_the_resolved_config() -> None:
    config = study.CONFIGS / "smollm2-135m-instruct" / "dapo-gmts.yaml"
    key, resolved = study.resolved_key(config, ["seed=0", "optim.steps=3"])
    assert resolved["seed"] == 0 and resolved["optim"]["steps"] == 3
    assert "output_dir" not in resolved["logging"]
    # the run's folder and its progress display do not change the run; a setting does
    assert (
        study.resolved_key(config, ["seed=0", "optim.steps=3", "logging.progress=true"])[0] == key
    )
    assert study.resolved_key(config, ["seed=1", "optim.steps=3"])[0] != key
    assert study.resolved_key(config, ["seed=0", "optim.steps=4"])[0] != key


def test_a_record_written_before_a_field_was_added_is_still_found(tmp_path) -> None:
    """A config field added since a record was written (at its default, not set by the run's
    arguments) keeps the record; a changed value, or the new field set, does not."""
    config = study.CONFIGS / "smollm2-135m-instruct" / "dapo-gmts.yaml"
    args = ["seed=0", "optim.steps=3"]
    key, resolved = study.resolved_key(config, args)
    older = json.loads(json.dumps(resolved))
    del older["optim"]["adamw"]  # a field this record's code did not have yet
    (tmp_path / "gmts-seed0-0123456789abcdef.json").write_text(
        json.dumps({"resolved_config": older})
    )
    name = f"gmts-seed0-{key}"
    found = study.matching_record(tmp_path, name, resolved, args)
    assert found is not None and found.name == "gmts-seed0-0123456789abcdef.json"
    set_args = [*args, "optim.adamw=for-loop"]
    _, set_resolved = study.resolved_key(config, set_args)
    assert study.matching_record(tmp_path, name, set_resolved, set_args) is None
    _, other = study.resolved_key(config, ["seed=0", "optim.steps=4"])
    assert study.matching_record(tmp_path, name, other, ["seed=0", "optim.steps=4"]) is None
    assert study.matching_record(tmp_path, f"ets-seed0-{key}", resolved, args) is None
    (tmp_path / f"{name}.json").write_text(json.dumps({"resolved_config": resolved}))
    assert study.matching_record(tmp_path, name, resolved, args) == tmp_path / f"{name}.json"


def test_every_experiment_names_configs_that_exist_or_is_pending() -> None:
    for experiment in study.EXPERIMENTS.values():
        assert list(experiment.methods)[0] == "all tokens"  # it evaluates the pretrained model
        for a, b in experiment.pairs:
            assert a in experiment.methods and b in experiment.methods


def test_the_area_under_the_curve_is_the_trapezoid_mean() -> None:
    record = {
        "args": [],
        "seed": 0,
        "evals": [{"step": 0, "average@2": 0.1}, {"step": 5, "average@2": 0.3},
                  {"step": 10, "average@2": 0.2}],
        "steps": [{"step": 1, "select/fraction": 0.2, "time/step_s": 2.0}],
    }  # fmt: skip
    figures = study.per_run_figures(record, {})
    assert figures["start"] == pytest.approx(10.0) and figures["final"] == pytest.approx(20.0)
    assert figures["auc"] == pytest.approx(((10 + 30) / 2 * 5 + (30 + 20) / 2 * 5) / 10)
    assert figures["s_per_step"] == 2.0


def test_the_last_fifth_figures_average_the_runs_last_fifth_of_steps() -> None:
    steps = [
        {"step": i + 1, "response/truncated_fraction": i / 10, "response/length_mean": 10.0 * i,
         "policy/entropy": 1.0 - i / 10}
        for i in range(10)
    ]  # fmt: skip
    record = {"args": [], "seed": 0, "evals": [{"step": 0, "average@2": 0.1}], "steps": steps}
    figures = study.per_run_figures(record, {})
    assert figures["cut_end"] == pytest.approx(100 * (0.8 + 0.9) / 2)  # steps 9 and 10, in %
    assert figures["length_end"] == pytest.approx((80 + 90) / 2)
    assert figures["entropy_end"] == pytest.approx((0.2 + 0.1) / 2)
    headings = [key for _, _, key in study._columns(study.EXPERIMENTS["task2"])]
    assert {"cut_end", "length_end"} <= set(headings)
    assert "cut_end" not in [key for _, _, key in study._columns(study.EXPERIMENTS["budget"])]


@pytest.mark.slow
def test_quick_study_writes_each_run_and_reuses_it(tmp_path, real_model):
    command = [sys.executable, str(SCRIPT), "budget", "--quick", "--out", str(tmp_path)]
    command += ["--methods", "all tokens,GMTS top 20%"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    records = sorted((tmp_path / "runs" / "smollm2-135m-instruct").glob("*.json"))
    assert [p.name.split("-seed")[0] for p in records] == ["gmts", "none"]
    by_suffix = {json.loads(p.read_text())["suffix"]: json.loads(p.read_text()) for p in records}
    # the seed's first method evaluates the pretrained model; the other reuses its figure
    assert [row["step"] for row in by_suffix["none"]["evals"]] == [0, 1]
    assert [row["step"] for row in by_suffix["gmts"]["evals"]] == [1]
    assert by_suffix["none"]["steps"][0]["select/fraction"] == 1.0
    assert by_suffix["gmts"]["steps"][0]["select/fraction"] <= 0.2 + 1e-9
    summary = json.loads((tmp_path / "study.json").read_text())["budget"]
    assert set(summary["methods"]) == {"all tokens", "GMTS top 20%"}
    starts = {m: summary["methods"][m]["start"]["mean"] for m in summary["methods"]}
    assert starts["GMTS top 20%"] == starts["all tokens"]
    assert summary["pairs"][0]["a"] == "GMTS top 20%" and summary["pairs"][0]["std"] is None
    assert (tmp_path / "budget.png").stat().st_size > 0
    # a second call finds both records and trains nothing; --report summarises the same
    times = [p.stat().st_mtime_ns for p in records]
    second = subprocess.run(
        command + ["--report"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in records] == times
    assert json.loads((tmp_path / "study.json").read_text())["budget"] == summary


def test_the_study_blocks_of_the_results_page_are_rendered_from_the_committed_records() -> None:
    """docs/results.md's ``study:<experiment>`` blocks are what ``study.py --report`` makes of
    benchmarks/results/study/runs (no figure typed by hand)."""
    page = study.DOC.read_text()
    out = REPO / "benchmarks" / "results" / "study"
    blocks = [name for name in study.EXPERIMENTS if f"<!-- study:{name}:begin -->" in page]
    assert blocks, "docs/results.md has no study block"
    for name in blocks:
        experiment = study.EXPERIMENTS[name]
        records = study.read_records(experiment, out)
        expected = study.render_markdown(experiment, study.summarize(experiment, records), records)
        shown = page.split(f"<!-- study:{name}:begin -->\n", 1)[1].split(
            f"\n<!-- study:{name}:end -->", 1
        )[0]
        assert shown == expected, f"the study:{name} block differs: run study.py {name} --report"
