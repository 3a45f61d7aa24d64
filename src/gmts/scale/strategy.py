"""How the policy is laid out over the processes: ``distributed.strategy``, by name.

- ``replicate``: every rank holds the whole model, its gradients and the AdamW state; the
  gradients are summed over ranks with one all-reduce per optimizer step. About 16 bytes per
  parameter per rank (float32 weights, gradients, two Adam moments); with LoRA 16 bytes per
  adapter parameter plus the frozen base in the compute dtype.
- ``fsdp``: PyTorch's FSDP2 (``fully_shard`` per decoder layer plus the root,
  :mod:`gmts.scale.fsdp`): weights, gradients and the AdamW state are split over the ranks
  (16 / N bytes per parameter), layers are all-gathered for their forward and backward.

Both keep the update exact: the token selection and the loss denominator are global over the
ranks (the core's ``process_group`` arguments) and the gradients are SUMMED over ranks, never
averaged, so one process and N processes make the same update. Every strategy has the same
methods (:class:`Strategy`), so the trainer never branches on the name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gmts._registry import Registry
from gmts.scale.distributed import DistInfo, all_reduce_gradients
from gmts.scale.fsdp import FullyShard
from gmts.scale.layout import Layout, PlanSettings
from gmts.scale.model_cost import ModelShape
from gmts.scale.precision import Precision
from gmts.scale.strategy_base import Strategy

__all__ = ["Strategy", "Replicate", "STRATEGIES", "make_strategy", "available_strategies"]


STRATEGIES: Registry[Callable[[DistInfo, Precision, torch.device], Strategy]] = Registry(
    "distributed strategy"
)


class Replicate(Strategy):
    """The whole model on every rank; one gradient all-reduce per optimizer step. Mixed
    precision by autocast over the float32 parameters."""

    name = "replicate"

    @staticmethod
    def layout(shape: ModelShape, precision: Precision, settings: PlanSettings) -> Layout:
        # t: float32 masters (every parameter, or a LoRA run's adapters); f: the frozen base
        t, f, cb = shape.trainable_params, shape.frozen_params, precision.compute_bytes
        cast = t * cb if precision.mixed else 0.0  # autocast's weight casts (freed at its exit)
        return Layout(
            weights=4 * t,
            gradients=4 * t,
            optimizer=8 * t,
            compute_copy=cast,
            resident_copy=0.0,
            sampling_copy=cast,
            reference=shape.params * cb if settings.reference else 0.0,
            step_temporaries=4 * t,
            frozen=f * cb,  # already in the compute dtype: autocast casts nothing of it
            # with checkpointing the layers' casts are not saved (each layer keeps its input
            # and re-casts its weights when recomputed) and autocast's cache is cleared at its
            # exit: what stays is the output projection's cast (saved by its matmul for the
            # hidden states' gradient; the embedding lookup takes no cast) and the layer being
            # recomputed. A LoRA run's base needs no cast; its adapters' are negligible.
            checkpointed_copy=(shape.vocab * shape.hidden + shape.layer_params) * cb
            if precision.mixed and not shape.lora
            else 0.0,
        )

    def prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def prepare_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return self.precision.autocast(self.device)

    @contextlib.contextmanager
    def sampling(self, model: torch.nn.Module) -> Iterator[None]:
        with self.precision.autocast(self.device):  # one region: each weight cast once
            yield

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        all_reduce_gradients(params, self.info)


STRATEGIES.add("replicate", Replicate)
STRATEGIES.add("fsdp", FullyShard)


def available_strategies() -> list[str]:
    """Names accepted by ``distributed.strategy``."""
    return STRATEGIES.names()


def make_strategy(
    name: str, info: DistInfo, precision: Precision, device: torch.device
) -> Strategy:
    """The strategy ``name`` for this rank; an unknown name lists the valid ones."""
    return STRATEGIES.get(name)(info, precision, device)
