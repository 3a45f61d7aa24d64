"""The condition rules STAPO (arXiv 2602.15620) and RSI-S (arXiv 2606.31575) against slow
references written from their papers' definitions, on random batches (random lengths, padding,
tied entropies, both signs of A), through the core's selection step and loss.

- STAPO's S2T: a token is silenced when A > 0, pi(o_t) < tau_p and E_t < tau_h, tau_h the
  80% quantile of the mini-batch's entropies; its objective is DAPO's clipped term averaged
  over the tokens left (``1 / sum I`` renormalisation).
- RSI-S: a token is kept when RSI_t = -log pi(o_t) / E_t lies in [rsi_low, rsi_high]. The
  index is checked against the property the paper's abstract states: it is tied to the ratio of
  the first-order changes of the logit-gradient norm G and of the entropy E when the sampled
  token's logit moves (here exactly: d ln E / d ln G = 1 - RSI).
"""

from __future__ import annotations

import math

import pytest
import torch

import gmts
from gmts.core import LossConfig, SelectionConfig, UpdateBatch, policy_loss

F64 = torch.float64


def _batch(seed: int, b: int = 8, t: int = 10):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b, 1), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths
    old = -torch.rand(b, t, generator=g, dtype=F64) * 4
    lp = old + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    entropy = torch.rand(b, t, generator=g, dtype=F64) * 2
    entropy[:, ::3] = (entropy[:, ::3] * 4).round() / 4  # ties in the entropies
    lp[~mask] = float("nan")  # garbage at the padding is never read
    entropy[~mask] = float("inf")
    return lp, old, adv, mask, entropy


def _step(selection: SelectionConfig, lp, old, adv, mask, entropy):
    objective = gmts.ObjectiveConfig.preset("dapo")
    batch = UpdateBatch(lp, old, adv, mask, entropy=entropy)
    return gmts.selection_step(LossConfig.of(objective, selection), batch)


# ------------------------------------------------------------------------------- STAPO


def _stapo_reference(lp, adv, mask, entropy, tau_p, quantile):
    """Token by token: spurious = A > 0 and p < tau_p and E < tau_h (tau_h from
    torch.quantile of the valid entropies in float32); kept = valid and not spurious."""
    valid = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    values = torch.tensor([float(entropy[it]) for it in valid], dtype=torch.float32)
    tau_h = float(torch.quantile(values, quantile))
    kept = torch.zeros_like(mask)
    for i, t in valid:
        spurious = adv[i] > 0 and math.exp(float(lp[i, t])) < tau_p and entropy[i, t] < tau_h
        kept[i, t] = not spurious
    return kept


@pytest.mark.parametrize("tau_p,quantile", [(0.002, 0.8), (0.3, 0.8), (0.5, 0.3)])
def test_stapo_silences_exactly_the_spurious_tokens(tau_p, quantile):
    silenced = 0
    for seed in range(10):
        lp, old, adv, mask, entropy = _batch(seed)
        selection = SelectionConfig(
            score="stapo", ratio=1.0, stapo_prob_threshold=tau_p, stapo_entropy_quantile=quantile
        )
        step = _step(selection, lp, old, adv, mask, entropy)
        want = _stapo_reference(lp, adv, mask, entropy, tau_p, quantile)
        assert torch.equal(step.selected, want), seed
        silenced += int((mask & ~want).sum())
    assert (silenced > 0) == (tau_p > 0.002)  # at 0.002 nothing here is that improbable


def test_stapo_loss_is_the_papers_renormalised_dapo_objective():
    """(1 / sum I) sum I min(r A, clip(r, 0.8, 1.28) A), written out, values and gradients."""
    selection = SelectionConfig(score="stapo", ratio=1.0, stapo_prob_threshold=0.3)
    for seed in range(4):
        lp, old, adv, mask, entropy = _batch(seed)
        lp = torch.where(mask, lp, -1.0)
        step = _step(selection, lp, old, adv, mask, entropy)
        keep = _stapo_reference(lp, adv, mask, entropy, 0.3, 0.8)
        leaf = lp.clone().requires_grad_(True)
        loss, _ = policy_loss(
            leaf, old, adv, mask, LossConfig.of(gmts.ObjectiveConfig.preset("dapo"), selection),
            selected=step.selected, denominators=step.denominators,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, leaf)
        ref = lp.clone().requires_grad_(True)
        r, a = torch.exp(ref - old), adv[:, None]
        term = torch.min(r * a, torch.clamp(r, 0.8, 1.28) * a)
        want = -(term * keep).sum() / keep.sum()
        (want_grad,) = torch.autograd.grad(want, ref)
        torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------- RSI-S


def test_rsi_is_one_minus_the_log_entropy_change_per_log_gradient_norm_change():
    """d ln E / d z_o over d ln G / d z_o, by autograd on random logits, equals 1 - RSI."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g, dtype=F64) * 3
    labels = torch.randint(0, 50, (64,), generator=g)
    z = logits.clone().requires_grad_(True)
    p = torch.softmax(z, -1)
    entropy = -(p * torch.log(p)).sum(-1)
    grad_norm = (torch.nn.functional.one_hot(labels, 50) - p).norm(dim=-1)
    rows = torch.arange(64)
    (d_log_e,) = torch.autograd.grad(torch.log(entropy).sum(), z, retain_graph=True)
    (d_log_g,) = torch.autograd.grad(torch.log(grad_norm).sum(), z)
    ratio = d_log_e[rows, labels] / d_log_g[rows, labels]
    stats = gmts.token_statistics(logits, labels)
    rsi = -stats.logprobs / stats.entropy
    torch.testing.assert_close(ratio, 1 - rsi, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("low,high", [(0.5, 2.0), (0.0, 1.0), (1.2, 1.2)])
def test_rsi_keeps_exactly_the_interval(low, high):
    kept_any = 0
    for seed in range(10):
        lp, old, adv, mask, entropy = _batch(seed)
        entropy = torch.where(torch.rand(entropy.shape) < 0.05, 0.0, entropy)  # one-hot rows
        selection = SelectionConfig(score="rsi", ratio=1.0, rsi_low=low, rsi_high=high)
        step = _step(selection, lp, old, adv, mask, entropy)
        want = torch.zeros_like(mask)
        for i, t in mask.nonzero().tolist():
            e = float(entropy[i, t])
            want[i, t] = e > 0 and low <= -float(lp[i, t]) / e <= high
        assert torch.equal(step.selected, want), seed
        kept_any += int(want.sum())
    assert kept_any > 0 or low == high


def test_conditions_need_ratio_one_and_skipped_zeros():
    for score in ("stapo", "rsi"):
        with pytest.raises(ValueError, match="is a condition"):
            SelectionConfig(score=score)  # ratio 0.2
        with pytest.raises(ValueError, match="is a condition"):
            SelectionConfig(score=score, ratio=1.0, zero_scores="select")
        with pytest.raises(ValueError, match="is a condition"):
            SelectionConfig(score=score, ratio=1.0, largest=False)
    for kwargs, match in (
        (dict(stapo_prob_threshold=1.5), "stapo_prob_threshold"),
        (dict(stapo_entropy_quantile=-0.1), "stapo_entropy_quantile"),
        (dict(rsi_low=2.0, rsi_high=1.0), "rsi_low must be <="),
        (dict(rsi_high=float("inf")), "rsi_high"),
    ):
        with pytest.raises(ValueError, match=match):
            SelectionConfig(**kwargs)
    with pytest.raises(ValueError, match="ScoreInputs.selection"):
        gmts.compute_scores(
            "rsi", gmts.ScoreInputs(entropy=torch.ones(1, 2), logprobs=torch.zeros(1, 2))
        )
