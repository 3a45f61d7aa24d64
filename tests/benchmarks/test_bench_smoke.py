"""Smoke test of the benchmark harness (benchmarks/run.py): runs, writes JSON, renders markdown.

Every benchmark behind docs/results.md and README's Measured table runs its ``--quick`` path
here (the real code, tiny shapes; a randomly initialised tiny model instead of the cached warm
start, through ``GMTS_BENCH_MODEL``), and the generated tables of docs/results.md must be what
benchmarks/report.py renders from the committed JSON. No timing is asserted (machines are
noisy); only that the harness works end to end and that the measured variants compute the
same numbers.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import bench_learning  # noqa: E402
import bench_logprobs  # noqa: E402


def _load(name: str, filename: str):
    """Load benchmarks/<filename> under a unique module name (run.py / report.py are generic)."""
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


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
