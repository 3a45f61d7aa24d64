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


def _inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    B, T, V = 4, 10, 32  # noqa: N806
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    labels = torch.randint(0, V, (B, T), generator=g)
    response_mask = torch.ones(B, T, dtype=torch.bool)
    response_mask[0, 7:] = False
    with torch.no_grad():
        old_logprobs = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return {
        "logits": logits,
        "labels": labels,
        "response_mask": response_mask,
        "old_logprobs": old_logprobs,
        "advantages": advantages,
    }


def test_readme_core_example_runs_and_selects_twenty_percent() -> None:
    scope = _inputs()
    response_mask, logits = scope["response_mask"], scope["logits"]
    exec(compile(_core_snippet(), str(README), "exec"), scope)  # noqa: S102
    selected = scope["result"].selected
    n_valid = int(response_mask.sum())
    assert int(selected.sum()) == -(-n_valid * 2 // 10)  # ceil(0.2 * N)
    assert not bool((selected & ~response_mask).any())
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert 0.0 < scope["metrics"]["selected_fraction"] <= 0.25


def test_readme_composition_under_grpo_is_eq2() -> None:
    """The same composition with GRPO's objective (seq-mean-token-mean) gives eq. 2: every
    selected token's log-prob gets gradient -omega / S, however the tokens spread over rows."""
    snippet = _core_snippet().replace(
        'gmts.ObjectiveConfig.preset("dapo")', 'gmts.ObjectiveConfig.preset("grpo", kl_coef=0.0)'
    )
    assert snippet != _core_snippet()
    scope = _inputs()
    snippet = snippet.replace("loss.backward()", "logprobs.retain_grad()\nloss.backward()")
    exec(compile(snippet, str(README), "exec"), scope)  # noqa: S102
    import gmts

    selected = scope["result"].selected
    omega = gmts.gradient_coefficient(
        gmts.ObjectiveConfig.preset("grpo", kl_coef=0.0),
        scope["logprobs"].detach(),
        scope["old_logprobs"],
        scope["advantages"],
        scope["response_mask"],
    )
    expected = torch.where(selected, -omega / int(selected.sum()), 0.0)
    torch.testing.assert_close(scope["logprobs"].grad, expected)
