"""The ``fsdp`` strategy: PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Layout: ``fully_shard`` on every decoder layer, then on the root (embeddings, final norm and
output head). Decoder layers are found generically, by the class names the model lists in
``_no_split_modules`` (``GPT2Block``, ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...), so
any Hugging Face causal LM that declares them works. Each rank holds 1/N of the float32
master weights, gradients and AdamW state; a layer's parameters are all-gathered (in bf16 under
``model.dtype: bfloat16``, :meth:`Precision.fsdp_policy`) for its forward and again for its
backward, and its gradients are reduce-scattered in float32.

Exactness: FSDP averages gradients over ranks by default; the trainer's loss already has a
global denominator, so the gradients must be SUMMED. Every FSDP module gets a divide factor of
1 with plain-sum collectives (:func:`_sum_gradients`), which also works on gloo.

Sampling: generation runs many small forwards whose number differs between ranks (rows stop at
EOS, dynamic sampling skips full ranks). :meth:`FullyShard.sampling` all-gathers every layer
once (bf16 under mixed precision: 2 bytes per parameter), disables resharding, lets each rank
generate on its own, and reshards at the end.

Checkpoints hold whole state dicts (``get_model_state_dict`` / ``get_optimizer_state_dict``
with ``full_state_dict=True``, offloaded to rank 0's CPU): ``model/`` stays a Hugging Face
folder of float32 master weights (a LoRA run's: its adapters; the frozen base is not
gathered), and the optimizer state is keyed by parameter name. Resume
loads the weights before sharding and hands the whole optimizer state to
``set_optimizer_state_dict``, which re-shards it; both are bit-exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from gmts.scale.distributed import barrier, init_process_group
from gmts.scale.layers import decoder_layers
from gmts.scale.layout import Layout, PlanSettings
from gmts.scale.model_cost import ModelShape
from gmts.scale.precision import Precision
from gmts.scale.strategy_base import Strategy


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _sum_gradients(model: torch.nn.Module) -> None:
    """Gradients summed (not averaged) over ranks, with SUM collectives only (gloo has no
    PREMUL_SUM)."""
    for m in _fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)


def shard(model: torch.nn.Module, mp_policy: Any, device: torch.device) -> torch.nn.Module:
    """``fully_shard`` every decoder layer (resharded after forward) and the root (kept
    gathered between forward and backward, FSDP2's default for the root)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    try:
        layers = decoder_layers(model)
    except ValueError as exc:
        raise ValueError(f"distributed.strategy=fsdp: {exc}; use replicate") from None
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
    _sum_gradients(model)
    return model


def unwrapped_class_name(model: torch.nn.Module) -> str:
    """The model's own class name (FSDP2 swaps in a subclass named ``FSDP<name>``)."""
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if not issubclass(cls, FSDPModule):
            return cls.__name__
    return type(model).__name__  # pragma: no cover


class FullyShard(Strategy):
    """FSDP2 over all ranks (a one-process group is created when run without torchrun)."""

    name = "fsdp"
    collective_forward = True

    @staticmethod
    def layout(shape: ModelShape, precision: Precision, settings: PlanSettings) -> Layout:
        n, p, cb = settings.world_size, shape.params, precision.compute_bytes
        # t: float32 masters (every parameter, or a LoRA run's adapters); f: the frozen base
        t, f = shape.trainable_params, shape.frozen_params
        # gathered during a pass: the root (kept from forward to backward) and the current and
        # the prefetched layer (their adapters included)
        root = shape.root_params * cb
        gathered = root + 2 * shape.layer_params * cb
        return Layout(
            weights=4 * t / n,
            gradients=4 * t / n,
            optimizer=8 * t / n,
            compute_copy=gathered,
            resident_copy=root,
            sampling_copy=(p + shape.adapter_params) * cb,  # every layer gathered to generate
            reference=(p * cb / n + gathered) if settings.reference else 0.0,
            step_temporaries=4 * t / n,
            frozen=f * cb / n,
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import torch.distributed as dist

        if not dist.is_initialized():  # one process: FSDP still needs a process group
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)

    def prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        return shard(model, self.precision.fsdp_policy(), self.device)

    def prepare_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        # loaded in the compute dtype already: gathered as it is, never reduced
        return shard(model, MixedPrecisionPolicy(), self.device)

    @contextlib.contextmanager
    def sampling(self, model: torch.nn.Module) -> Iterator[None]:
        modules = _fsdp_modules(model)
        for m in modules:
            m.unshard()
            m.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            barrier(self.info)  # everyone done with the gathered weights
            for m in modules:
                m.reshard()
                m.set_reshard_after_forward(m is not model, recurse=False)

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float | None) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
        if hasattr(norm, "full_tensor"):  # a DTensor: the global norm
            norm = norm.full_tensor()
        return float(norm)

    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if any(not p.requires_grad for p in model.parameters()):
            return self._trainable_weights(model)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=options)
        return weights if self.info.is_main else None

    def _trainable_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """Only what trains (a LoRA run's adapters), gathered one tensor at a time: the frozen
        base is never gathered (``get_model_state_dict``'s ``ignore_frozen_params`` would
        still gather a tied output head, which ``named_parameters`` does not list as frozen)."""
        weights = {}
        for name, param in model.named_parameters():  # the same order on every rank
            if param.requires_grad:
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                if self.info.is_main:
                    weights[name] = full.detach().cpu()
        return weights if self.info.is_main else None

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Any
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)
