"""docs/semantics.md's "Your own objective" example runs as written: omega by autograd of the
user's term is its closed form, GMTS ranks by it, and the loss is eq. 2 with that omega."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from gmts.core.objectives.registry import _OBJECTIVES

DOC = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"


def _snippet() -> str:
    section = DOC.read_text().split("**Your own objective.**", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the 'Your own objective' paragraph has no python block"
    return match.group(1)


def test_your_own_objective_example_scores_and_trains_by_its_omega() -> None:
    g = torch.Generator().manual_seed(0)
    b, t = 4, 12
    old = -torch.rand(b, t, dtype=torch.float64, generator=g) * 3
    logprobs = (old + 0.3 * torch.randn(b, t, dtype=torch.float64, generator=g)).clamp(max=0)
    logprobs.requires_grad_(True)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 8:] = False
    scope = {
        "logprobs": logprobs,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64),
        "response_mask": mask,
        "entropy": torch.rand(b, t, dtype=torch.float64, generator=g),
    }
    try:
        exec(compile(_snippet(), str(DOC), "exec"), scope)  # noqa: S102
    finally:
        _OBJECTIVES.remove("tanh-ratio")
    r = torch.exp(logprobs.detach() - old)
    omega = scope["advantages"][:, None] * (1 - torch.tanh(r - 1) ** 2) * r  # d s / d log pi
    omega = torch.where(mask, omega, 0.0)
    result = scope["result"]
    torch.testing.assert_close(result.scores, (scope["entropy"] * omega).abs())
    n = int(mask.sum())
    selected = result.selected
    assert int(selected.sum()) == -(-n // 5)  # ceil(0.2 N): no score is 0 here
    kth = result.scores[selected].min()
    assert bool((result.scores[mask & ~selected] <= kth).all())  # the top of |E omega|
    expected = torch.where(selected, -omega / int(selected.sum()), 0.0)
    torch.testing.assert_close(logprobs.grad, expected)
