"""A forward with gradients under bf16 autocast (grouped or padded layout) keeps no bf16 copy
of the weights for the backward (gmts.scale.uncached_casts), and its log-probs and gradients
are the ones autocast's own casts gave, bit for bit. Without it, a forward of n model calls held
n bf16 copies of every weight until its backward."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

import gmts.scale.uncached_casts as uncached_casts
from gmts.scale.uncached_casts import uncached_weight_casts
from gmts.train.forward_plan import plan_forward
from gmts.train.scoring import TokenScorer

from file_modules import load_module

HERE = Path(__file__).resolve().parent
_rows = load_module(HERE / "_rows.py", "_rows")
_grouped = load_module(HERE / "test_grouped_forward.py", "_grouped")


def _bf16() -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _autocasts_own(model, skip=()) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _run(model, rows, monkeypatch, layout: str, *, keep_casts: bool) -> tuple[dict, int]:
    """Log-probs, gradients and the bytes of bf16 weight-shaped tensors saved for backward."""
    with monkeypatch.context() as patch:
        if keep_casts:  # autocast's own casts, one set per call (before this module)
            patch.setattr(uncached_casts, "uncached_weight_casts", _autocasts_own)
        shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
        shapes |= {shape[::-1] for shape in shapes}  # a matmul may save the cast's transpose
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.dtype == torch.bfloat16 and tuple(t.shape) in shapes:
                saved[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
            return t

        model.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            stats = TokenScorer(layout=layout, autocast=_bf16)(model, rows)
        mask = rows.response_mask
        weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape)
        (stats.logprobs.float() * weights * mask).sum().backward()
    out = {"logprobs": stats.logprobs.detach()}
    out.update({n: p.grad.clone() for n, p in model.named_parameters()})
    return out, sum(saved.values())


@pytest.mark.parametrize("layout", ["grouped", "padded"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("name", sorted(_grouped.MODELS))
def test_no_weight_cast_is_kept_and_the_gradients_are_unchanged(
    name, checkpointing, layout, monkeypatch
):
    model, vocab, eos = _grouped.MODELS[name]()
    if checkpointing:
        from gmts.models.loading import _enable_activation_checkpointing

        _enable_activation_checkpointing(model)
    rows = _rows.random_rows(3, vocab=vocab, eos=eos)
    calls = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask).calls
    calls = calls if layout == "grouped" else 1
    assert layout == "padded" or calls >= 3  # several autocast regions: several casts
    before, kept_before = _run(model, rows, monkeypatch, layout, keep_casts=True)
    after, kept_after = _run(model, rows, monkeypatch, layout, keep_casts=False)
    linear_bytes = sum(
        m.weight.numel() * 2
        for m in model.modules()
        if type(m) is torch.nn.Linear or type(m).__name__ == "Conv1D"
    )  # one bf16 copy of the linear layers' weights
    if not checkpointing:  # each call kept a copy of the linear weights
        assert kept_before >= 0.9 * calls * linear_bytes
    else:  # the output projection's cast, once per call (the layers are replayed)
        assert kept_before > 0
    assert kept_after == 0
    for key in before:
        assert torch.equal(after[key], before[key]), key
    assert not any("forward" in vars(m) for m in model.modules())  # the swap is undone


def test_nothing_is_swapped_without_autocast_or_without_grad():
    model, _, _ = _grouped.MODELS["smollm2-architecture"]()
    linear = next(m for m in model.modules() if type(m) is torch.nn.Linear)
    with uncached_weight_casts(model):  # no autocast: float32 as it was
        assert "forward" not in vars(linear)
    with _bf16(), torch.no_grad(), uncached_weight_casts(model):  # nothing is saved
        assert "forward" not in vars(linear)
    with _bf16(), uncached_weight_casts(model):
        assert "forward" in vars(linear)
    assert "forward" not in vars(linear)
