"""README's "Using the core" example runs as written on small random inputs."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _core_snippet() -> str:
    text = README.read_text()
    section = text.split("## Using the core", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'Using the core' section has no python block"
    return match.group(1)


def test_readme_core_example_runs_and_selects_twenty_percent() -> None:
    g = torch.Generator().manual_seed(0)
    B, T, V = 4, 10, 32  # noqa: N806
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    labels = torch.randint(0, V, (B, T), generator=g)
    response_mask = torch.ones(B, T, dtype=torch.bool)
    response_mask[0, 7:] = False
    with torch.no_grad():
        old_logprobs = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    scope = {
        "logits": logits,
        "labels": labels,
        "response_mask": response_mask,
        "old_logprobs": old_logprobs,
        "advantages": advantages,
    }
    exec(compile(_core_snippet(), str(README), "exec"), scope)  # noqa: S102
    selected = scope["result"].selected
    n_valid = int(response_mask.sum())
    assert int(selected.sum()) == -(-n_valid * 2 // 10)  # ceil(0.2 * N)
    assert not bool((selected & ~response_mask).any())
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert 0.0 < scope["metrics"]["selected_fraction"] <= 0.25
