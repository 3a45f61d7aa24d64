"""Helpers for the analysis tests: a synthetic TokenAnalysis built without any model."""

from __future__ import annotations

import pytest
import torch

from gmts.analysis.collect import PROXY_SCORES, TokenAnalysis
from gmts.core import ScoreInputs, compute_scores, group_advantages


def make_analysis(
    entropy: torch.Tensor,
    grad_logprob_norm: torch.Tensor,
    response_mask: torch.Tensor,
    rewards: torch.Tensor,
    group_size: int,
    prob: torch.Tensor | None = None,
    logit_grad_norm: torch.Tensor | None = None,
) -> TokenAnalysis:
    """A consistent TokenAnalysis from (B, T) entropy / norms and (B,) rewards (on-policy omega)."""
    B, T = entropy.shape
    mask = response_mask.bool()
    advantages = group_advantages(rewards.float(), group_size)
    omega = advantages[:, None].expand(B, T).masked_fill(~mask, 0.0).clone()
    prob = torch.full((B, T), 0.9) if prob is None else prob
    logit_grad_norm = entropy * 0.5 if logit_grad_norm is None else logit_grad_norm
    inputs = ScoreInputs(entropy=entropy, omega=omega, logit_grad_norm=logit_grad_norm, mask=mask)
    scores = {n: compute_scores(n, inputs).masked_fill(~mask, 0.0) for n in PROXY_SCORES}
    grad_objective = omega.abs() * grad_logprob_norm
    scores["oracle"] = grad_objective
    G = group_size
    return TokenAnalysis(
        response_ids=torch.zeros(B, T, dtype=torch.long),
        response_mask=mask,
        group_ids=torch.arange(B // G).repeat_interleave(G),
        rewards=rewards.float(),
        advantages=advantages,
        logprob=prob.log(),
        prob=prob,
        eps=1 - prob,
        entropy=entropy,
        logit_grad_norm=logit_grad_norm,
        omega=omega,
        grad_logprob_norm=grad_logprob_norm,
        grad_objective_norm=grad_objective,
        scores=scores,
        token_text=[[f"t{b}_{t}" for t in range(int(mask[b].sum()))] for b in range(B)],
        prompts=[f"q{b // G}" for b in range(B)],
        completions=["" for _ in range(B)],
        answers=["a" for _ in range(B)],
        num_samples=G,
    )


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run much faster on one thread (intra-op threads only synchronise); restored
    after each test so other areas' tests keep their settings."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def synthetic_analysis():
    return make_analysis


class _ReadsValues(torch.autograd.Function):
    """Identity whose backward calls .item(): vmap cannot batch it."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _ = float(grad.sum().item())
        return grad


class _Unvmappable(torch.nn.Module):
    """A causal LM whose logits pass through :class:`_ReadsValues` (forces the loop fallback)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = _ReadsValues.apply(out.logits)
        return out


@pytest.fixture
def unvmappable():
    """Wraps a causal LM so that its backward cannot be vmapped: ``unvmappable(model)``."""
    return _Unvmappable
