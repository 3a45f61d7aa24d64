"""Linear layers that keep no compute-dtype copy of their weights for the backward.

Under ``torch.autocast`` a linear layer casts its float32 weight to the compute dtype and its
matmul saves that cast for the backward. The cast lives until the backward, and autocast makes
one per region: the grouped layout (:mod:`gmts.train.grouped_forward`) runs each model call
in its own region (so that each call's weight gradients reach the float32 ``.grad`` in float32,
summed there), so a forward of ``n`` calls held ``n`` compute-dtype copies of every weight
until its backward: 9 copies for 9 calls, measured on a tiny Llama. For a 7B model on one GPU
that would be about 14 GB a call (7e9 weights x 2 bytes; not measured here).

:func:`uncached_weight_casts` swaps, for one model call, the forward of every ``nn.Linear`` (and
GPT-2's ``Conv1D``) whose float32 weight trains for :class:`_CastLinear`: the same forward (inputs, weight and
bias cast to the autocast dtype, one ``F.linear`` in it) whose backward casts the float32
weight again instead of keeping the cast; the gradients are the ones autocast's graph gives
(the same matmuls in the compute dtype, cast back to each input's dtype), and each call's
weight gradient still reaches ``.grad`` on its own, in float32. What stays alive between the
forward and the backward is the float32 weight, which lives anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["uncached_weight_casts"]


class _CastLinear(torch.autograd.Function):
    """A linear layer's forward on ``x``, ``weight``, ``bias`` cast to ``dtype``; saves ``x``'s
    cast and the float32 ``weight`` itself (not its cast). ``conv1d``: GPT-2's ``Conv1D``
    layout (weight ``(in, out)``, ``addmm``) instead of ``nn.Linear``'s (``(out, in)``,
    ``F.linear``): each the same call as the layer's own, so the same kernels run."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        conv1d: bool,
    ) -> torch.Tensor:
        x_cast = x.to(dtype)  # (..., in)
        ctx.save_for_backward(x_cast, weight)
        ctx.dtype, ctx.x_dtype, ctx.conv1d = dtype, x.dtype, conv1d
        ctx.bias_dtype = None if bias is None else bias.dtype
        w_cast, b_cast = weight.to(dtype), None if bias is None else bias.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            if not conv1d:
                return F.linear(x_cast, w_cast, b_cast)  # (..., out)
            flat = x_cast.view(-1, x_cast.shape[-1])  # (N, in)
            out = torch.addmm(b_cast, flat, w_cast)  # (N, out)
            return out.view(*x_cast.shape[:-1], w_cast.shape[1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x_cast, weight = ctx.saved_tensors
        w_cast = weight.to(ctx.dtype)  # cast again: the float32 weight is what was kept
        grad = grad.to(ctx.dtype)  # (..., out)
        flat = grad.reshape(-1, grad.shape[-1])  # (N, out)
        x_flat = x_cast.reshape(-1, x_cast.shape[-1])  # (N, in)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (flat.mm(w_cast.t()) if ctx.conv1d else grad.matmul(w_cast)).to(ctx.x_dtype)
            grad_x = grad_x.view(x_cast.shape)  # (..., in)
        if ctx.needs_input_grad[1]:
            grad_w = x_flat.t().mm(flat) if ctx.conv1d else flat.t().mm(x_flat)
            grad_w = grad_w.to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = flat.sum(0).to(ctx.bias_dtype)  # (out,)
        return grad_x, grad_w, grad_b, None, None


def _sharded(model: torch.nn.Module) -> bool:
    """FSDP (1 or 2) or DeepSpeed ZeRO-3 manage the weights: a weight kept for the backward
    could be freed by them in between, so their casts are left to autocast."""
    for module in model.modules():
        if type(module).__name__.startswith(("FSDP", "FullyShardedDataParallel")):
            return True
        weight = getattr(module, "weight", None)
        if weight is not None and hasattr(weight, "ds_id"):
            return True
    return False


def _is_conv1d(module: torch.nn.Module) -> bool:
    """GPT-2's ``Conv1D`` (transformers), found by name: no import of transformers here."""
    kind = type(module)
    return kind.__name__ == "Conv1D" and kind.__module__.startswith("transformers")


def _needs_swap(module: torch.nn.Module, dtype: torch.dtype) -> bool:
    weight = getattr(module, "weight", None)
    return (
        (type(module) is torch.nn.Linear or _is_conv1d(module))
        and weight is not None
        and weight.requires_grad
        and weight.dtype == torch.float32
        and dtype != torch.float32
    )


@contextlib.contextmanager
def uncached_weight_casts(model: Any, skip: Sequence[torch.nn.Module] = ()) -> Iterator[None]:
    """Inside an autocast region with grad on: every plain ``nn.Linear`` or ``Conv1D`` of
    ``model`` with a trainable float32 weight runs as :class:`_CastLinear` (module
    docstring), except inside the modules ``skip`` (activation-checkpointed layers, whose
    replay must save what their forward saved); elsewhere (no autocast, no grad, frozen or
    compute-dtype weights; a ``model`` that is not a module, such as a LoRA run's
    adapters-off reference) nothing changes."""
    weight = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
    device_type = weight.device.type if weight is not None else ""
    if (
        not device_type
        or not torch.is_grad_enabled()
        or not torch.is_autocast_enabled(device_type)
        or _sharded(model)
    ):
        yield
        return
    dtype = torch.get_autocast_dtype(device_type)
    inside = {id(m) for layer in skip for m in layer.modules()}
    swapped = [
        (m, vars(m).get("forward"))
        for m in model.modules()
        if id(m) not in inside and _needs_swap(m, dtype)
    ]
    for module, _ in swapped:
        module.forward = _cast_forward(module, dtype)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for module, before in swapped:
            if before is None:
                del module.forward  # back to the class's forward
            else:
                module.forward = before  # type: ignore[method-assign]


def _cast_forward(module: torch.nn.Module, dtype: torch.dtype) -> Any:
    conv1d = _is_conv1d(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _CastLinear.apply(x, module.weight, module.bias, dtype, conv1d)

    return forward
