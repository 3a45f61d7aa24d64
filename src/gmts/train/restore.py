"""Restore: the trainer's state put back from a checkpoint (``--resume``), so that the run
continues exactly where the checkpoint left it (what :meth:`Trainer.save` wrote).

The checkpoint's model weights are not read here: :func:`gmts.train.policy.load_policy` loads
them in place of the base model's. This part comes after every other part of the build that
draws random numbers (the LoRA adapters' initialisation): the RNG states it restores are the
last word, so the next draw is the one the uninterrupted run would have made.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gmts.scale.distributed import DistInfo
from gmts.scale.strategy import Strategy
from gmts.train import checkpoint as ckpt
from gmts.train.sources import QuestionSource


@dataclass(frozen=True)
class RestoredCounters:
    """The step counters of a restored run: the checkpoint's step and the non-finite updates
    skipped before it."""

    step: int
    skipped_total: int


def restore_trainer_state(
    checkpoint: Path,
    *,
    strategy_name: str,
    strategy: Strategy,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    source: QuestionSource,
    info: DistInfo,
    stacklevel: int = 2,
) -> RestoredCounters:
    """Put the optimizer, LR schedule, question source and RNG states of ``checkpoint`` back.

    Needs the model already loaded (with the checkpoint's weights) and wrapped by
    ``strategy``, and the optimizer and scheduler built over it. Raises ValueError when the
    checkpoint was written under another ``distributed.strategy``. A checkpoint written by a
    different number of processes restores rank 0's RNG state on every rank and warns: the
    run then does not continue exactly; ``stacklevel`` is :func:`warnings.warn`'s, counted
    from this function (2: its caller). Gives the checkpoint's step counters.
    """
    state = ckpt.load_trainer_state(checkpoint)
    saved = state.get("strategy", "replicate")
    if saved != strategy_name:
        raise ValueError(
            f"--resume: {checkpoint} was written with distributed.strategy="
            f"{saved}; resume it with the same strategy"
        )
    strategy.load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    source.load_state_dict(state["source"])
    ranks = state.get("rng_ranks")  # checkpoints before per-rank states: rank 0's
    if ranks is not None and len(ranks) != info.world_size:
        warnings.warn(
            f"--resume: {checkpoint} was written by {len(ranks)} processes, this "
            f"run has {info.world_size}: every rank takes rank 0's RNG state, so the run does "
            "not continue exactly (it does with the same number of processes)",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
        ranks = None
    ckpt.restore_rng_state(state["rng"] if ranks is None else ranks[info.rank])
    return RestoredCounters(
        step=int(state["step"]), skipped_total=int(state.get("skipped_total", 0))
    )
