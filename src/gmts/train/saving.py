"""Saving a run's state at a step: the weights, the optimizer, the schedule, the question
source and every rank's RNG states, written atomically by rank 0
(:func:`gmts.train.checkpoint.save_checkpoint`); what :mod:`gmts.train.restore` puts back."""

from __future__ import annotations

import dataclasses
from typing import Any

from gmts.scale.distributed import DistInfo, barrier
from gmts.train import checkpoint as ckpt
from gmts.train.run_parts import RunParts


def save_run(parts: RunParts, step: int, skipped_total: int) -> None:
    """Checkpoint ``parts`` at ``step`` (collective: under fsdp the whole state dicts are
    gathered on rank 0; every rank returns once rank 0 has written it)."""
    model, opt, info = parts.model, parts.optimization, parts.processes.info
    weights = model.strategy.full_weights(model.model)
    optimizer_state = model.strategy.optimizer_state(model.model, opt.optimizer)
    rng_ranks = rng_of_every_rank(info)  # collective: dropout draws differ by rank
    if info.is_main:
        state = {
            "step": step,
            "strategy": parts.cfg.distributed.strategy,
            "optimizer": optimizer_state,
            "scheduler": opt.scheduler.state_dict(),
            "source": parts.data.source.state_dict(),
            "rng": ckpt.capture_rng_state(),
            "rng_ranks": rng_ranks,
            "skipped_total": skipped_total,
            "config": dataclasses.asdict(parts.cfg),
        }
        ckpt.save_checkpoint(
            parts.folder.path,
            step,
            model=model.model,
            weights=weights,
            tokenizer=model.tokenizer,
            trainer_state=state,
            keep=parts.cfg.checkpoint.keep,
        )
    barrier(info)


def rng_of_every_rank(info: DistInfo) -> list[dict[str, Any]] | None:
    """Every rank's RNG states on rank 0, in rank order (None elsewhere; one process: its
    own). Restored per rank on resume, so dropout (a LoRA run's, a model's own) draws the
    same numbers as in an uninterrupted run on every rank."""
    state = ckpt.capture_rng_state()
    if info.world_size == 1:
        return [state]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * info.world_size if info.is_main else None
    dist.gather_object(state, gathered, dst=0, group=info.group)
    return gathered
