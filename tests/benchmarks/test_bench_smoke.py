"""Smoke test of the benchmark harness (benchmarks/run.py): runs, writes JSON, renders markdown.

Every benchmark behind docs/results.md and README's Measured table runs its ``--quick`` path
here (the real code, tiny shapes; a randomly initialised tiny model instead of the cached warm
start, through ``GMTS_BENCH_MODEL``), and the generated tables of docs/results.md must be what
benchmarks/report.py renders from the committed JSON. No timing is asserted (machines are
noisy); only that the harness works end to end and that the measured variants compute the
same numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import bench_learning  # noqa: E402
import bench_logprobs  # noqa: E402


def _load(name: str, filename: str):
    """Load benchmarks/<filename> under a unique module name (run.py / report.py are generic)."""
    return load_module(BENCH_DIR / filename, name, register=True)


bench_run = _load("gmts_bench_run", "run.py")
report = _load("gmts_bench_report", "report.py")
DOCS = BENCH_DIR.parent / "docs"


@pytest.fixture(scope="module")
def tiny_bench_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny model of the warm start's architecture (the embedded GPT-2
    and character tokenizer), saved where ``GMTS_BENCH_MODEL`` can point."""
    from gmts.embedded.tiny_model import build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    folder = tmp_path_factory.mktemp("bench-model")
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _marks(name: str) -> list:
    if name == "learning":  # its quick path trains 2 runs in subprocesses: 15-50 s
        return [pytest.mark.slow]
    if name == "rollout":  # hf vs vllm: needs vllm (tests/vllm/test_vllm_bench.py runs it there)
        import importlib.util

        missing = importlib.util.find_spec("vllm") is None
        return [pytest.mark.skipif(missing, reason="vllm is installed in .venv-vllm only")]
    return []


QUICK_CASES = [pytest.param(name, marks=_marks(name)) for name in bench_run.BENCHMARKS]


@pytest.mark.parametrize("name", QUICK_CASES)
def test_quick_run_of_every_benchmark(
    name: str, tiny_bench_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each benchmark's --quick path as `python benchmarks/run.py --quick --only NAME` runs it;
    # a benchmark that raises is recorded with status "error" and run.py returns 1
    monkeypatch.setenv("GMTS_BENCH_MODEL", str(tiny_bench_model))
    assert bench_run.main(["--only", name, "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / f"{name}.json").read_text())
    assert record["status"] == "ok", record.get("error")
    assert record["quick"] is True and record["rows"]
    assert report.render(record).strip()  # the page's renderer reads what it wrote


def test_quick_overhead_from_a_config_file(tiny_bench_model: Path, tmp_path: Path) -> None:
    # --overhead-config: every variant is that trainer config (here the tiny model on the
    # embedded task, 2 x 2 answers), only the selection differs; its shape is the config's
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model:\n  path: {tiny_bench_model}\nrollout:\n  questions_per_batch: 2\n  group_size: 3\n"
    )
    out = tmp_path / "out"
    argv = ["--only", "overhead", "--quick", "--out", str(out), "--overhead-config", str(config)]
    assert bench_run.main([*argv, "--overhead-set", "optim.lr=1e-4"]) == 0
    record = json.loads((out / "overhead.json").read_text())
    assert record["status"] == "ok", record.get("error")
    settings = record["settings"]
    assert settings["config"] == str(config) and settings["overrides"] == ["optim.lr=1e-4"]
    assert settings["model"] == str(tiny_bench_model)
    assert (settings["questions"], settings["group_size"]) == (2, 3)
    rows = {row["variant"]: row for row in record["rows"]}
    assert rows["none"]["selected_fraction"] == 1.0
    assert rows["gmts"]["selected_fraction"] < 1.0


def test_overhead_config_is_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    missing = tmp_path / "missing.yaml"
    assert bench_run.main(["--only", "overhead", "--out", str(out), "--overhead-set", "a=1"]) == 2
    assert "--overhead-set needs --overhead-config" in capsys.readouterr().err
    assert bench_run.main(["--only", "overhead", "--overhead-config", str(missing)]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert not out.exists()


def test_logprobs_shape_is_parsed_and_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_logprobs.parse_shape("49152x576") == (49152, 576)
    for bad in ("49152", "49152x", "x576", "1x576", "49152x0", "a x b"):
        with pytest.raises(ValueError, match="VOCABxHIDDEN"):
            bench_logprobs.parse_shape(bad)
    out = tmp_path / "out"
    assert bench_run.main(["--only", "logprobs", "--out", str(out), "--logprobs-shape", "9"]) == 2
    assert "--logprobs-shape" in capsys.readouterr().err
    assert not out.exists()


def test_results_page_is_rendered_from_the_committed_results(tmp_path: Path) -> None:
    # docs/results.md's generated blocks are what report.py makes of benchmarks/results/*.json
    page = tmp_path / "results.md"
    page.write_text((DOCS / "results.md").read_text())
    updated = report.update_results_doc(BENCH_DIR / "results", page)
    assert {"selection", "logprobs", "overhead", "throughput", "learning"} <= set(updated)
    assert page.read_text() == (DOCS / "results.md").read_text(), (
        "docs/results.md differs from `python benchmarks/report.py` on benchmarks/results"
    )


def test_gold_rates_table(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # benchmarks/gold_rates.py, behind docs/rewards.md's table, on its smallest benchmark
    gold_rates = _load("gmts_gold_rates", "gold_rates.py")
    assert gold_rates.main(["--benchmarks", "aime24", "--data-dir", str(shared_data)]) == 0
    assert "| aime24 | 30 | 30 (100.0%) | 30 (100.0%) | 30 | 0 |" in capsys.readouterr().out


def test_parse_only_validates_names() -> None:
    assert bench_run.parse_only("logprobs,selection") == ["selection", "logprobs"]
    assert bench_run.parse_only(None) == bench_run.default_benchmarks()
    assert set(bench_run.BENCHMARKS) - set(bench_run.default_benchmarks()) <= bench_run.NEEDS_VLLM
    assert bench_run.parse_only("rollout") == ["rollout"]
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


def test_learning_plans_and_specs() -> None:
    full = bench_learning.plan("full")
    assert len(full) == 42  # 18 (Table 1) + 18 (Table 7, 0.2 shared with Table 1) + 6 (Table 6)
    assert len({spec.run_id for spec in full}) == len(full)
    subset_ids = {spec.run_id for spec in bench_learning.plan("subset")}
    assert subset_ids <= {spec.run_id for spec in full}
    spec = bench_learning.RunSpec.parse("dapo:gmts:0.8:bottom:2")
    assert (spec.algorithm, spec.score, spec.ratio, spec.bottom, spec.seed) == (
        "dapo",
        "gmts",
        0.8,
        True,
        2,
    )
    assert spec.label == "GMTS bottom 0.8"
    with pytest.raises(ValueError, match="score"):
        bench_learning.RunSpec.parse("dapo:nope:0.2:0")
    with pytest.raises(ValueError, match="expected"):
        bench_learning.RunSpec.parse("dapo:gmts:0.2")


def test_learning_aggregate_mean_and_spread() -> None:
    def record(seed: int, value: float) -> dict:
        spec = bench_learning.RunSpec("dapo", "gmts", 0.2, False, seed)
        return {"spec": bench_learning.asdict(spec), "eval_after": {"average@16": value}}

    summary = bench_learning.aggregate([record(0, 0.5), record(1, 0.7)])
    cell = summary["cells"]["dapo"]["GMTS top 0.2"]
    assert cell["n"] == 2
    assert cell["mean"] == pytest.approx(0.6)
    assert cell["std"] == pytest.approx(0.1414213, rel=1e-5)


def test_device_option_is_checked_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    assert bench_run.main(["--only", "selection", "--quick", "--device", "tpu"]) == 2
    assert "device must be" in capsys.readouterr().err
    assert bench_run.main(["--only", "learning", "--quick", "--device", "cuda"]) == 2
    assert "CPU only" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bench_run.main(["--only", "selection", "--quick", "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_report_renders_gpu_results_into_their_own_blocks(tmp_path: Path) -> None:
    cpu = {"benchmark": "selection", "status": "error", "error": "cpu-boom", "rows": []}
    gpu = {"benchmark": "selection", "status": "error", "error": "gpu-boom", "rows": []}
    (tmp_path / "selection.json").write_text(json.dumps(cpu))
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "selection.json").write_text(json.dumps(gpu))
    doc = tmp_path / "results.md"
    doc.write_text(
        "<!-- results:selection:begin -->\nold\n<!-- results:selection:end -->\n"
        "<!-- results:gpu-selection:begin -->\nnot run\n<!-- results:gpu-selection:end -->\n"
    )
    assert report.update_results_doc(tmp_path, doc) == ["selection", "gpu-selection"]
    cpu_part, gpu_part = doc.read_text().split("results:gpu-selection:begin")
    assert "cpu-boom" in cpu_part and "gpu-boom" not in cpu_part
    assert "gpu-boom" in gpu_part and "not run" not in gpu_part


def test_learning_recipes_extend_the_run_specs() -> None:
    """The first field of a run spec names a recipe; grpo and dapo mean what they meant."""
    objectives = bench_learning.plan("objectives")
    assert len(objectives) == 27 and {s.algorithm for s in objectives} == {
        "dapo-4mb",
        "gspo",
        "cispo",
    }
    both = bench_learning.plan("full,objectives,gspo:gmts:0.2:0")  # the last one is in both
    assert len(both) == 42 + 27
    spec = bench_learning.RunSpec.parse("gspo:gmts:0.2:1")
    assert (spec.recipe.algorithm, spec.recipe.objective, spec.run_id) == (
        "grpo",
        "gspo",
        "gspo-gmts-top0.2-seed1",
    )
    assert bench_learning.RunSpec.parse("dapo:none:1:0").run_id == "dapo-all-seed0"  # as before
    with pytest.raises(ValueError, match="recipe must be one of"):
        bench_learning.RunSpec.parse("ppo:gmts:0.2:0")
    with pytest.raises(ValueError, match="or a plan name"):
        bench_learning.plan("ful")


def test_learning_recipe_configs(tmp_path: Path) -> None:
    """Each recipe's resolved trainer config: the objective preset, the mini-batches, dynamic
    sampling from the algorithm; the fingerprint sees every difference but the run dir."""
    from gmts.core.objectives import ObjectiveConfig

    def cfg(text: str, run_dir: str = "a"):
        spec = bench_learning.RunSpec.parse(text)
        return bench_learning.run_config(spec, "m", tmp_path / run_dir, 10, 5, 8)

    gspo, cispo, ref, dapo = (
        cfg(t)
        for t in ("gspo:gmts:0.2:0", "cispo:none:1:0", "dapo-4mb:entropy:0.2:0", "dapo:none:1:0")
    )
    assert gspo.objective == ObjectiveConfig.preset("gspo") and not gspo.rollout.dynamic_sampling
    assert cispo.objective == ObjectiveConfig.preset("cispo") and cispo.rollout.dynamic_sampling
    assert ref.objective == dapo.objective == ObjectiveConfig.preset("dapo")
    assert (gspo.mini_batch_questions, ref.mini_batch_questions, dapo.mini_batch_questions) == (
        8,
        8,
        32,
    )
    assert (gspo.selection.score, gspo.optim.steps, gspo.data.eval_every) == ("gmts", 10, 5)
    fp = bench_learning.config_fingerprint
    assert fp(gspo, 1) == fp(cfg("gspo:gmts:0.2:0", "elsewhere"), 1)
    assert fp(gspo, 1) != fp(gspo, 2) and fp(gspo, 1) != fp(cfg("gspo:gmts:0.2:1"), 1)


def _run_record(recipe: str, score: str, seed: int, curve: list[float], clip: float) -> dict:
    spec = bench_learning.RunSpec(recipe, score, 1.0 if score == "none" else 0.2, False, seed)
    return {
        "spec": bench_learning.asdict(spec),
        "run_id": spec.run_id,
        "steps": 50,
        "eval_before": {"average@16": curve[0], "pass@16": 0.5},
        "eval_curve": [
            {"step": 0, "average@16": curve[0]},
            {"step": 25, "average@16": curve[1]},
            {"step": 50, "average@16": curve[2]},
        ],
        "eval_after": {"average@16": curve[2], "pass@16": 0.9},
        "history": [{"update/clip_fraction": clip, "select/fraction": 1.0}],
        "wall_s": 1.0,
    }


def test_learning_paired_differences_and_objectives_table() -> None:
    runs = []
    for seed in range(3):
        runs.append(_run_record("gspo", "none", seed, [0.1, 0.3, 0.5], 0.4))
        runs.append(_run_record("gspo", "entropy", seed, [0.1, 0.2, 0.4 + 0.01 * seed], 0.3))
        runs.append(_run_record("gspo", "gmts", seed, [0.1, 0.3, 0.5 + 0.02 * seed], 0.3))
    summary = bench_learning.aggregate(runs)
    pairs = {(p["a"], p["b"]): p for p in summary["paired"]["gspo"]}
    gmts_ets = pairs[("GMTS top 0.2", "ETS top 0.2")]
    assert gmts_ets["final"]["values"] == pytest.approx([10.0, 11.0, 12.0])
    # mean over training, trapezoid over 0-25-50: (0.1 + 2 * 0.3 + 0.5) / 4 vs (0.1 + 2 * 0.2 + 0.4) / 4
    assert gmts_ets["mean"]["values"][0] == pytest.approx(100 * (1.2 - 0.9) / 4)
    assert ("GMTS top 0.2", "all tokens") in pairs and ("ETS top 0.2", "all tokens") in pairs
    assert summary["clip_fraction"]["gspo"]["all tokens"]["mean"] == pytest.approx(0.4)
    record = {
        "settings": {
            "plan": "objectives",
            "runs_done": 9,
            "runs_in_plan": 27,
            "steps": 50,
            "questions": 32,
            "group_size": 8,
            "lr": 2e-4,
            "eval_samples": 16,
            "eval_questions": 200,
            "recipes": {"gspo": {"title": "GSPO", "description": "the GSPO paper's"}},
        },
        "summary": summary,
    }
    text = report.render_learning(record)
    objectives = text.split("**Objectives**")[1].split("\n\n")[1]
    gspo_row = objectives.splitlines()[2]
    assert gspo_row.startswith("| GSPO | 50.0 ± 0.0 (n=3) | 41.0 ± 1.0 (n=3) | 52.0 ± 2.0 (n=3) |")
    assert "+11.0 ± 1.0 [+8.5, +13.5] **clear** (3/3 seeds > 0)" in gspo_row
    assert gspo_row.endswith("| 40.00% |")
    assert "**GSPO, held-out average@16 (%) by training step**" in text
    assert "**Paired differences**" in text


def test_report_renders_the_demo_into_the_other_pages(tmp_path: Path) -> None:
    record = {
        "benchmark": "demo",
        "status": "ok",
        "command": "gmts demo",
        "date": "2026-12-02",
        "commit": "abc1234",
        "threads": 1,
        "wall_s": 300.0,
        "machine": {"cpu": "AMD EPYC", "nproc": 2, "simd_flags": ["avx2"], "uptime": "load 0.5"},
        "uptime_after": "load 1.0",
        "table": "DAPO on 'addition' ...\nGMTS top 20% - ETS top 20%   mean  +3.0",
    }
    (tmp_path / "demo.json").write_text(json.dumps(record))
    doc = tmp_path / "results.md"
    doc.write_text("no demo block here\n")
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- results:demo:begin -->\nold\n<!-- results:demo:end -->\nb\n")
    assert report.update_results_doc(tmp_path, doc, other_docs=(readme,)) == ["README.md:demo"]
    text = readme.read_text()
    assert "old" not in text and "GMTS top 20% - ETS top 20%   mean  +3.0" in text
    assert "`gmts demo`" in text and "AMD EPYC" in text and text.endswith("end -->\nb\n")


def test_warmstart_stop_replays_the_warm_starts_own_rule() -> None:
    """benchmarks/warmstart_stop.py replays gmts.embedded.warmstart.StopCheck on a trace: a
    coarse rule overshoots a steep rise, the fine rule with a mean does not stop on one lucky
    check."""
    from dataclasses import replace

    from gmts.embedded.warmstart import WarmStartConfig

    ws = _load("gmts_bench_warmstart_stop", "warmstart_stop.py")
    # every 10th step below DENSE_FROM, then every step: a steep rise with one lucky check
    rising = {11: 0.1, 12: 0.15, 13: 0.2, 14: 0.25, 15: 0.5, 16: 0.3, 17: 0.33, 18: 0.36}
    rising.update({19: 0.38, 20: 0.6, 21: 0.62, 22: 0.64})
    trace = [{"step": 10, "check@100": 0.01, "check@400": 0.01}] + [
        {"step": s, "check@100": a, "check@400": a, "held_out": a} for s, a in rising.items()
    ]
    before = WarmStartConfig(check_questions=100, fine_check_from=None, stop_window=1)
    stop = ws.replay(before, trace)
    assert stop["step"] == 20 and stop["overshoot"] == pytest.approx(0.25)
    stop = ws.replay(replace(before, check_every=1), trace)
    assert stop["step"] == 15  # the lucky check
    # checks at 10, 12, 14 (0.25: every step from now on), 15 (0.5 alone would stop), 16
    stop = ws.replay(WarmStartConfig(check_every=2, stop_window=3, stop_at_greedy=0.34), trace)
    assert stop["step"] == 16 and stop["check"] == pytest.approx((0.25 + 0.5 + 0.3) / 3)
    assert ws.replay(WarmStartConfig(), trace) is None  # 4 checks (10, 20, 21, 22) < stop_window
    assert ws.replay(replace(before, check_questions=200), trace) is None  # not traced
    summary = ws.summarize({"t": {"trace": trace}}, (before,))
    assert summary["rules"][0]["max_overshoot"] == pytest.approx(0.25)


@pytest.mark.slow  # two worker processes (default and AVX2 paths), 5 steps each: 25-45 s
def test_warmstart_stop_quick_traces_the_real_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/warmstart_stop.py --quick end to end: a worker process per floating-point
    path traces the real warm-start loop, the driver replays every rule on the traces."""
    ws = _load("gmts_bench_warmstart_stop_quick", "warmstart_stop.py")
    assert ws.main(["--quick", "--out", str(tmp_path)]) == 0
    names = {"default": "trace-default-seed0-t1.json", "avx2": "trace-avx2-seed0-t1.json"}
    for path, filename in names.items():
        record = json.loads((tmp_path / filename).read_text())
        assert (record["seed"], record["threads"], record["check_questions"]) == (0, 1, 400)
        assert record["env"] == ws.PATHS[path]  # the worker ran with the path's environment
        trace = record["trace"]
        assert [row["step"] for row in trace] == [1, 2, 3, 4, 5]  # dense from the first step
        for row in trace:
            assert {"check@100", "check@400", "held_out"} <= set(row)
            assert all(0.0 <= row[k] <= 1.0 for k in ("check@100", "check@400", "held_out"))
    avx2 = json.loads((tmp_path / names["avx2"]).read_text())
    assert avx2["cpu_capability"] in ("AVX2", "DEFAULT")  # never AVX512 on the AVX2 path
    summary = json.loads((tmp_path / "warmstart_stop.json").read_text())
    assert set(summary["traces"]) == {"default seed 0 threads 1", "avx2 seed 0 threads 1"}
    assert [r["rule"] for r in summary["rules"]] == [ws.rule_name(c) for c in ws.rules()]
    for rule in summary["rules"]:  # 5 steps from a random model reach no target
        assert set(rule["stops"]) == set(summary["traces"]) and rule["max_overshoot"] is None
    assert "not reached / not traced" in capsys.readouterr().out
    # resumable: a second run reuses the traces present and spawns no worker
    stamps = {f: (tmp_path / f).stat().st_mtime_ns for f in names.values()}
    assert ws.main(["--quick", "--out", str(tmp_path)]) == 0
    assert {f: (tmp_path / f).stat().st_mtime_ns for f in names.values()} == stamps
    assert ": ok" not in capsys.readouterr().out
