"""The standalone trainer on the real pretrained model (SmolLM2-135M-Instruct, named
``smollm2-135m-instruct``): one GMTS step of GRPO on 2-digit additions with the ``math``
reward and the ``plain`` template, on the ``hf`` engine, with LoRA, and with 2 processes
under FSDP2 (torchrun, gloo). The vLLM engine's step is in tests/vllm/test_vllm_real_model.py.

Each run is 2 questions x 4 answers x 16 new tokens, one step. They are slow: loading the
model and one step take tens of seconds on a 2-core CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gmts.train.checkpoint import list_checkpoints
from gmts.train.config import load_config
from gmts.train.metrics_log import read_metrics
from gmts.train.trainer import Trainer

from file_modules import load_module

_real = load_module(Path(__file__).with_name("_real.py"), "_real")

pytestmark = pytest.mark.slow


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _one_step(tmp_path: Path, model: str, *overrides: str) -> tuple[Trainer, dict, dict]:
    """One step in this process: the trainer, its trainable weights before, its metrics row."""
    dataset = _real.write_additions(tmp_path / "additions.jsonl")
    run = tmp_path / "run"
    cfg = load_config(None, [*_real.real_overrides(model, dataset, run), *overrides])
    trainer = Trainer(cfg)
    before = _trainable(trainer.model)
    try:
        trainer.run()
    finally:
        trainer.close()
    (row,) = read_metrics(run)
    return trainer, before, row


def test_one_gmts_step_on_the_hf_engine(tmp_path, real_model):
    """By name: model.path=smollm2-135m-instruct resolves to the converted folder."""
    trainer, before, row = _one_step(tmp_path, _real.MODEL_NAME)
    _real.check_step(row)
    assert row["response/tokens"] <= 2 * 4 * 16
    after = _trainable(trainer.model)
    assert len(after) == 272  # every parameter of the 30-layer Llama trains (tied embeddings)
    moved = [n for n in after if not torch.equal(after[n], before[n])]
    assert len(moved) > len(after) // 2, f"only {len(moved)} of {len(after)} tensors moved"


def test_one_gmts_step_with_lora(tmp_path, real_model):
    trainer, before, row = _one_step(
        tmp_path, real_model, "model.lora.rank=4", "model.lora.alpha=8", "optim.lr=1e-3"
    )
    _real.check_step(row)
    after = _trainable(trainer.model)
    assert after and all("lora_" in n for n in after)  # only the adapters train
    moved_b = [n for n in after if "lora_B" in n and after[n].abs().max() > 0]
    assert moved_b, "no LoRA B matrix left zero: the adapters did not train"
    assert all(not torch.equal(after[n], before[n]) for n in moved_b)


def test_one_gmts_step_on_two_processes_under_fsdp2(tmp_path, real_model, free_port):
    """`torchrun --nproc_per_node 2 -m gmts train ... distributed.strategy=fsdp` (gloo): the
    global selection count is exact over both ranks, and the saved weights moved."""
    dataset = _real.write_additions(tmp_path / "additions.jsonl")
    run = tmp_path / "run"
    overrides = [
        *_real.real_overrides(real_model, dataset, run),
        "distributed.strategy=fsdp",
        "checkpoint.save_final=true",
    ]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += [f"--master_port={free_port}", "-m", "gmts", "train", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run(command, check=True, env=env, timeout=900)
    (row,) = read_metrics(run)
    _real.check_step(row)

    from safetensors.torch import load_file

    (_, path), *_ = reversed(list_checkpoints(run))
    trained = load_file(path / "model" / "model.safetensors")
    start = load_file(Path(real_model) / "model.safetensors")
    assert trained.keys() == start.keys()
    assert all(trained[k].dtype == torch.float32 for k in trained)  # whole fp32 weights
    moved = [k for k in start if not torch.equal(trained[k], start[k])]
    assert len(moved) > len(start) // 2, f"only {len(moved)} of {len(start)} tensors moved"


def test_own_file_with_prompts_of_different_lengths(tmp_path, real_model):
    """Issue 33: a user's file whose prompts differ in token length, several questions per
    batch, crashed at the batch's assembly (a trimmed group's prompt mask wider than its
    ids). Two steps of 3 questions x 2 answers on sums in prose with 1- to 3-digit operands."""
    questions = [("What is 7 + 5?", 12), ("Add 123 and 45.", 168), ("What is 12 + 30?", 42),
                 ("Please add 305 and 7 together.", 312), ("What is 4 + 4?", 8),
                 ("Compute the sum of 250 and 19.", 269)]  # fmt: skip
    dataset = tmp_path / "mine.jsonl"
    dataset.write_text("".join(f'{{"problem": "{q}", "answer": "{a}"}}\n' for q, a in questions))
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            *_real.real_overrides(real_model, dataset, run),
            "rollout.questions_per_batch=3",
            "rollout.group_size=2",
            "rollout.max_response_length=8",
            "optim.steps=2",
        ],
    )
    trainer = Trainer(cfg)
    lengths = {len(trainer.tokenizer(q)["input_ids"]) for q, _ in questions}
    assert len(lengths) >= 3, f"the prompts must differ in token length: {lengths}"
    try:
        trainer.run()
    finally:
        trainer.close()
    rows = read_metrics(run)
    assert len(rows) == 2 and all(0 < r["response/tokens"] <= 6 * 8 for r in rows)
    assert all(r["update/skipped_nonfinite"] == 0 for r in rows)
