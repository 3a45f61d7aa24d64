"""The methods every distributed strategy has (:class:`Strategy`), so the trainer never
branches on the strategy's name. The strategies themselves and their table:
:mod:`gmts.scale.strategy` (``replicate``) and :mod:`gmts.scale.fsdp` (``fsdp``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

from gmts.scale.distributed import DistInfo
from gmts.scale.layout import Layout, PlanSettings
from gmts.scale.model_cost import ModelShape
from gmts.scale.precision import Precision

__all__ = ["Strategy"]


class Strategy:
    """The layout of the policy (and the reference model) over the ranks.

    Args:
        info: this process's place in the process group.
        precision: the run's dtypes (:class:`gmts.scale.precision.Precision`).
        device: this rank's device.
    """

    name: ClassVar[str]
    collective_forward: ClassVar[bool] = False
    """Every forward of a laid-out model is a collective (FSDP all-gathers the weights): all
    ranks must make the same number of model calls outside :meth:`sampling`."""

    @staticmethod
    def layout(shape: ModelShape, precision: Precision, settings: PlanSettings) -> Layout:
        """Bytes per rank for the weights under this strategy (the memory plan's input)."""
        raise NotImplementedError

    def __init__(self, info: DistInfo, precision: Precision, device: torch.device) -> None:
        self.info = info
        self.precision = precision
        self.device = device

    # ---- setting up
    def prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The trainable policy (float32 master weights on CPU; with LoRA a peft model whose
        frozen base is in the compute dtype) laid out on this rank."""
        raise NotImplementedError

    def prepare_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """The frozen reference model (loaded in the compute dtype) laid out on this rank."""
        raise NotImplementedError

    # ---- passes
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Around each model forward of training and scoring (the backward follows it)."""
        return contextlib.nullcontext()

    def sampling(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Around generation and evaluation: inside, ``model`` runs on this rank alone (no
        collective per forward), so ranks may run different numbers of forwards. Every rank
        must enter and leave it together."""
        raise NotImplementedError

    # ---- the optimizer step
    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum ``.grad`` over ranks (no-op where the backward already did)."""

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float | None) -> float:
        """Clip the global gradient norm to ``max_norm`` (None: no clip); returns the norm
        before clipping (inf or nan when a gradient is not finite)."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
        return float(norm)

    # ---- weights for a rollout engine (collective: every rank iterates, in the same order)
    def full_parameters(
        self, model: torch.nn.Module, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter of the policy, whole, one at a time: ``(name, tensor)`` in the
        Hugging Face checkpoint's names (a tied weight under each of its names, as a
        checkpoint holds it: vLLM's in-place reload waits for every name of a layer), cast to
        ``dtype`` (None: as held, the float32 master weights). A sharded parameter (an FSDP2 ``DTensor``) is cast on its
        shard and then all-gathered, so at most one whole parameter exists beyond the shards
        at a time (the consumer decides how long it keeps it). Every rank must consume the
        iterator to its end together."""
        for name, param in model.named_parameters(remove_duplicate=False):
            tensor = param.detach()
            if dtype is not None:
                tensor = tensor.to(dtype)
            if hasattr(tensor, "full_tensor"):  # a DTensor shard: gather the whole tensor
                tensor = tensor.full_tensor()
            yield name, tensor

    # ---- checkpoints (collective: every rank calls; rank 0 gets the result)
    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The whole float32 state dict on rank 0, frozen parameters left out (None:
        ``save_pretrained`` reads the model itself); None on the other ranks."""
        return None

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        """The optimizer state to save (whole, on rank 0)."""
        return optimizer.state_dict()

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Any
    ) -> None:
        """Put back what :meth:`optimizer_state` saved."""
        optimizer.load_state_dict(state)
