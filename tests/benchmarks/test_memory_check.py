"""benchmarks/memory_check.py (the memory plan against measured peaks, docs/training.md) runs
with today's trainer, its settings are the trainer's, and the docs table is its committed result.

The figures themselves are not asserted beyond loose bounds: quick shapes are small enough that
a few MiB of allocator noise move the ratios (the docs quote the full run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
memory_check = load_module(BENCH_DIR / "memory_check.py", "gmts_memory_check", register=True)


def test_every_row_is_valid_trainer_settings(tmp_path: Path) -> None:
    # the trainer's schema reads every row at both sizes: a renamed key fails here
    for size in (*memory_check.SIZES.values(), memory_check.QUICK):
        memory_check.check_settings(list(memory_check.ROWS), size, [], tmp_path, tmp_path)
    with pytest.raises(ValueError, match="model.nope"):
        memory_check.check_settings(
            list(memory_check.ROWS), memory_check.QUICK, ["model.nope=1"], tmp_path, tmp_path
        )


def test_bad_input_fails_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert memory_check.main(["--quick", "optim.micro_batch_size=0"]) == 2
    assert "optim.micro_batch_size" in capsys.readouterr().err
    assert memory_check.main(["--quick", "--rows", "fp32,nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "bf16-fsdp-gc" in err  # the valid names are listed


def test_docs_table_is_the_committed_result() -> None:
    record = json.loads((BENCH_DIR / "results" / "memory_check.json").read_text())
    assert not record["quick"]
    assert [row["name"] for row in record["rows"]] == [row.name for row in memory_check.ROWS]
    text = memory_check.DOC.read_text()
    begin, end = memory_check.BLOCK
    block = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert block == memory_check.render(record), (
        "docs/training.md's memory-check table is not benchmarks/results/memory_check.json: "
        "re-run python benchmarks/memory_check.py (it refreshes both)"
    )


@pytest.mark.slow  # 3 fresh processes, each building the trainer twice: ~25-40 s on 2 cores
def test_quick_run_measures_every_phase_with_the_trainer(tmp_path: Path) -> None:
    out = tmp_path / "memory_check.json"
    code = memory_check.main(
        ["--quick", "--rows", "bf16-fsdp-gc", "--out", str(out), "rollout.temperature=0.9"]
    )
    assert code == 0
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    assert row["overrides"][-1] == "rollout.temperature=0.9"  # the override reached the row
    phases = row["phases"]
    assert list(phases) == list(memory_check.PHASES)
    for result in phases.values():
        settings = result["plan_settings"]  # the trainer's own plan of this run
        assert (settings["strategy"], settings["dtype"]) == ("fsdp", "bfloat16")
        assert settings["gradient_checkpointing"] is True
        assert settings["prompt_length"] == memory_check.QUICK.prompt_tokens
        assert result["planned_bytes"] > 0 and result["measured_bytes"] > 0
        # weights + AdamW state are resident at the baseline (loose: quick shapes are small)
        assert 0.8 < result["resident_measured_bytes"] / result["resident_planned_bytes"] < 1.25
    assert phases["update"]["planned_phase"] in memory_check.UPDATE_PLAN_PHASES
    # loose: at the quick shapes the allocator's fixed costs weigh (measured 1.60-1.73 for this
    # row on 2026-12-06, the grouped layout's per-call bf16 casts included); the plan's
    # agreement at real sizes is docs/results.md section 10
    assert 0.6 < phases["update"]["measured_bytes"] / phases["update"]["planned_bytes"] < 2.0
    assert "bf16-fsdp-gc" in memory_check.render(record)


@pytest.mark.slow  # converts the real model into $GMTS_CACHE on first use (about 40 s)
def test_smollm2_size_has_the_real_models_shapes(real_model: str) -> None:
    # --size smollm2 measures a random model of SmolLM2-135M-Instruct's shapes: they must be its
    import json

    config = json.loads((Path(real_model) / "config.json").read_text())
    assert {k: config[k] for k in memory_check.SMOLLM2.model} == memory_check.SMOLLM2.model
    assert config["tie_word_embeddings"] is True  # as the benchmark's Qwen2 (Qwen2.5-1.5B's)
