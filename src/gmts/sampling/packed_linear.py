"""oneDNN-prepacked linear layers for sampling on a CPU.

A decoding step multiplies a few rows (one token per answer) by every weight matrix of the
model. PyTorch's CPU ``linear`` hands each product to a BLAS that re-reads the weight in its
stored layout every call; oneDNN can reorder a weight once into the blocked layout its kernels
read fastest (``torch.ops.mkldnn._reorder_linear_weight``) and then multiply against that copy
(``torch.ops.mkldnn._linear_pointwise``). vLLM's CPU backend works the same way. For the length of
a rollout the weights do not change, so :func:`prepacked_linears` reorders every plain
``torch.nn.Linear`` once when sampling starts and puts the originals back when it ends.

What it costs and changes:
- memory: one reordered copy of every packed weight while the context is open (the whole
  model's linear weights: for SmolLM2-135M about 0.5 GB in float32, the tied output
  projection included);
- values: oneDNN sums in another order than the BLAS, so logits differ in the last bits
  (about 1e-5 relative); sampling from them is the same distribution, and the tests check
  that the sampled tokens of the tiny models agree with the unpacked path;
- scope: only ``type(module) is torch.nn.Linear`` with a plain (not distributed) float32 CPU
  weight is packed; everything else runs as before: bfloat16 weights (oneDNN packs them too,
  but no machine of this project with bf16 instructions has run it), LoRA's adapter matrices
  around a packed base layer, an accelerator's layers. Gradients are
  not tracked through the packed copy: it is for ``torch.no_grad`` sampling only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["can_prepack", "prepacked_linears"]


def can_prepack(device: torch.device | str) -> bool:
    """Whether this PyTorch build can prepack linear weights on ``device`` (a CPU with oneDNN)."""
    return (
        torch.device(device).type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _packable(module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear:
        return False
    weight = module.weight
    if type(weight) not in (torch.Tensor, torch.nn.Parameter) or weight.device.type != "cpu":
        return False  # a DTensor (fsdp) or an accelerator's weight
    return weight.dtype == torch.float32


class _PackedForward:
    """``module.forward`` for the duration of a rollout: ``x @ W^T + b`` with W prepacked."""

    def __init__(self, module: torch.nn.Linear, rows: int) -> None:
        weight = module.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        self.bias = None if module.bias is None else module.bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features)."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


@contextlib.contextmanager
def prepacked_linears(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Within the context, every packable linear layer of ``model`` multiplies against a
    oneDNN-prepacked copy of its weight; yields how many layers were packed (0 where the build
    or device cannot: see :func:`can_prepack`).

    ``rows``: the number of rows a decoding step multiplies (the batch), oneDNN's hint for the
    layout; any other number of rows is still computed correctly (the sampler passes its chunk's
    rows, the most a step multiplies: rows that have stopped leave its batch).
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    params = next(model.parameters(), None)
    if params is None or not can_prepack(params.device):
        yield 0
        return
    patched: list[torch.nn.Module] = []
    try:
        for module in model.modules():
            if _packable(module):
                if "forward" in vars(module):
                    continue  # someone else replaced this forward: leave it alone
                module.forward = _PackedForward(module, rows)
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
