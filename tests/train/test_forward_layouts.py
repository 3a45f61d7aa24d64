"""The trainer with model.forward_layout=grouped against padded (its reference, the layout
before): the same step metrics, up to float rounding, for every registered objective (GRPO
recipe: a reference pass; two mini-batches: an off-policy selection pass), with LoRA, with
gradient checkpointing, in bf16 (a looser tolerance) and under FSDP2 on two processes (slow);
and the positions of every step's record (grouped: within 10% of the real ones).
(The forward itself against the padded one: tests/train/test_grouped_forward.py.)"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gmts.train.metrics_log import TIMING_KEYS, read_metrics
from gmts.train.trainer import Trainer

from file_modules import load_module

HERE = Path(__file__).resolve().parent
_tiny = load_module(HERE / "_tiny.py", "_tiny")
_objectives = load_module(HERE / "test_train_objectives.py", "_objectives")

LAYOUTS = ("padded", "grouped")
POSITION_KEYS = ("update/positions_computed", "update/positions_real")
FP32 = dict(rel=1e-5, abs=1e-7)  # measured: at most 1.1e-6 relative (a KL mean near 1e-3)
# bf16 rounds each product to 8 bits of mantissa (2^-9 relative) and the layouts reduce in a
# different order (a prompt's attention in its own call); measured: at most 0.8% relative
# (update/kl_mean of 2e-7), 0.3% on the loss and the gradient norm
BF16 = dict(rel=2e-2, abs=1e-6)


def _histories(tiny_dir: Path, tmp_path: Path, *overrides: str) -> dict[str, list[dict]]:
    out = {}
    for layout in LAYOUTS:
        cfg = _tiny.small_config(
            tiny_dir, tmp_path / layout, *overrides, f"model.forward_layout={layout}"
        )
        trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
        try:
            out[layout] = trainer.run().history
        finally:
            trainer.close()
    return out


def _compared(row: dict) -> set[str]:
    """The metrics both layouts must agree on: all but the timings and the positions."""
    return set(row) - set(TIMING_KEYS) - set(POSITION_KEYS)


def _assert_same_metrics(runs: dict[str, list[dict]], tolerance: dict) -> None:
    padded, grouped = runs["padded"], runs["grouped"]
    assert len(padded) == len(grouped) > 0
    for a, b in zip(padded, grouped):
        keys = _compared(a)
        assert keys == _compared(b)
        for key in sorted(keys):
            if isinstance(a[key], float) and math.isnan(a[key]):
                assert math.isnan(b[key]), key
                continue
            assert b[key] == pytest.approx(a[key], **tolerance), (a["step"], key)
        assert b["update/skipped_nonfinite"] == 0


def _assert_positions(runs: dict[str, list[dict]]) -> None:
    """Grouped computes at most 1.1x the real positions; padded (every row whole) more; both
    count the same real ones."""
    for a, b in zip(runs["padded"], runs["grouped"]):
        real = b["update/positions_real"]
        assert real == a["update/positions_real"] > 0
        assert 0 < b["update/positions_computed"] <= 1.1 * real
        assert a["update/positions_computed"] > 1.1 * real


@pytest.mark.parametrize("case", sorted(_objectives.OBJECTIVES))
def test_every_objective_trains_the_same_in_both_layouts(tiny_dir, tmp_path, case):
    runs = _histories(
        tiny_dir,
        tmp_path,
        "algorithm=grpo",  # KL: the reference log-probs go through the layout too
        "selection.ratio=0.3",
        "optim.mini_batch_questions=2",  # the second update's scores: a no-grad pass
        "optim.steps=1",
        *_objectives.OBJECTIVES[case],
    )
    _assert_same_metrics(runs, FP32)
    _assert_positions(runs)


@pytest.mark.parametrize(
    "overrides",
    [
        ("model.lora.rank=4", "model.lora.alpha=8"),
        ("model.gradient_checkpointing=true", "optim.micro_batch_size=4"),
    ],
    ids=["lora", "gradient-checkpointing"],
)
def test_lora_and_checkpointing_train_the_same_in_both_layouts(tiny_dir, tmp_path, overrides):
    runs = _histories(tiny_dir, tmp_path, "algorithm=grpo", *overrides)
    _assert_same_metrics(runs, FP32)
    _assert_positions(runs)


def test_bf16_trains_the_same_in_both_layouts_up_to_bf16_rounding(tiny_dir, tmp_path):
    runs = _histories(tiny_dir, tmp_path, "algorithm=grpo", "model.dtype=bfloat16")
    _assert_same_metrics(runs, BF16)
    _assert_positions(runs)


@pytest.mark.slow
def test_fsdp2_trains_the_same_in_both_layouts(tmp_path, free_port):
    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    runs = {}
    for layout in LAYOUTS:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                f"--master_port={free_port}",
                str(HERE / "_train_script.py"),
                str(model_dir),
                str(tmp_path / layout),
                "distributed.strategy=fsdp",
                "algorithm=grpo",  # the reference is sharded too
                "optim.mini_batch_questions=2",
                "optim.micro_batch_size=2",
                "model.gradient_checkpointing=true",
                f"model.forward_layout={layout}",
            ],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
            timeout=600,
        )
        runs[layout] = read_metrics(tmp_path / layout)
    _assert_same_metrics(runs, FP32)
    _assert_positions(runs)
