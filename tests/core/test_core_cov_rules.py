"""Clip-Cov and KL-Cov in the core's selection step, and the two selection helpers they (and
STAPO) use, against slow references on random batches (random lengths, padding, ties).

The objectives' formulas against verl's code: tests/core/test_core_objective_registry.py (the
``clip-cov`` / ``kl-cov`` cases) and, against verl's own functions,
tests/integrations/test_verl_cov_rules.py. Here: the pick is made once per update unit and
reaches every micro-batch's loss, so GMTS ranks by the coefficient of the loss optimised.
"""

from __future__ import annotations

import math

import pytest
import torch

import gmts
from gmts.core import LossConfig, SelectionConfig, UpdateBatch, UpdateLayout, policy_loss
from gmts.core.objectives import ObjectiveInputs

F64 = torch.float64


def _batch(seed: int, b: int = 7, t: int = 9, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b, 1), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    lp = old + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    entropy = torch.rand(b, t, generator=g, dtype=F64) * 2
    scores = torch.randn(b, t, generator=g, dtype=F64)
    if ties:
        scores = (scores * 2).round() / 2
    return lp, old, adv, mask, entropy, scores


# ------------------------------------------------------------------------- the helpers


def _sorted_cut(scores, mask, k):
    """The first min(k, N) valid tokens by (-score, row-major position)."""
    tokens = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    order = sorted(tokens, key=lambda it: (-float(scores[it]), it))
    out = torch.zeros_like(mask)
    for it in order[:k]:
        out[it] = True
    return out


def test_select_top_count_is_the_sorted_cut_ties_first():
    for seed in range(12):
        _, _, _, mask, _, scores = _batch(seed, ties=seed % 2 == 0)
        n = int(mask.sum())
        for k in (0, 1, 3, n - 1, n, n + 5):
            k = max(k, 0)
            got = gmts.select_top_count(scores, mask, k)
            assert torch.equal(got, _sorted_cut(scores, mask, k)), (seed, k)


def test_score_quantile_is_torch_quantile():
    for seed in range(12):
        _, _, _, mask, _, scores = _batch(seed, ties=seed % 2 == 0)
        scores = scores.float()
        for q in (0.0, 0.2, 0.8, 1.0):
            want = float(torch.quantile(scores[mask], q)) if bool(mask.any()) else math.nan
            assert gmts.score_quantile(scores, mask, q) == want, (seed, q)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert math.isnan(gmts.score_quantile(torch.zeros(2, 3), empty, 0.5))
    with pytest.raises(ValueError, match="q must be"):
        gmts.score_quantile(torch.zeros(2, 3), empty, 1.5)
    with pytest.raises(ValueError, match="k must be"):
        gmts.select_top_count(torch.zeros(2, 3), empty, -1)


# ------------------------------------------------------------- the pick in the step

OBJECTIVES = {
    "clip-cov": gmts.ObjectiveConfig(
        name="clip-cov", clip_cov_ratio=0.3, clip_cov_lb=-0.5, clip_cov_ub=0.5
    ),
    "kl-cov": gmts.ObjectiveConfig(name="kl-cov", kl_cov_ratio=0.3, kl_cov_coef=0.5),
}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.parametrize("score", ["gmts", "none"])
def test_the_unit_pick_reaches_every_micro_batch(name, score):
    """selection_step picks once over the unit (seed = selection.seed + step); the losses of
    micro-batches of 2 rows given their rows of that pick add up to the whole batch's loss, and
    each selected token's gradient is -omega / S with omega from the same pick (eq. 2)."""
    objective = OBJECTIVES[name]
    selection = SelectionConfig(score=score, ratio=0.3, seed=11)
    loss_config = LossConfig.of(objective, selection)
    differs = 0
    for seed in range(4):
        lp, old, adv, mask, entropy, _ = _batch(seed)
        batch = UpdateBatch(lp, old, adv, mask, entropy=entropy)
        step = gmts.selection_step(loss_config, batch, layout=UpdateLayout(), step=3)
        inputs = ObjectiveInputs.of(lp, old, adv, mask)
        assert torch.equal(step.picked, gmts.objective_picks(objective, inputs, seed=11 + 3))

        leaf = lp.clone().requires_grad_(True)
        total = 0.0
        for start in range(0, lp.shape[0], 2):
            rows = slice(start, start + 2)
            part = step.part(rows)
            loss, _ = policy_loss(
                leaf[rows], old[rows], adv[rows], mask[rows], loss_config,
                selected=part.selected, denominators=part.denominators, picked=part.picked,
            )  # fmt: skip
            loss.backward()
            total += float(loss)
        whole, _ = policy_loss(
            lp, old, adv, mask, loss_config, selected=step.selected, picked=step.picked
        )
        assert total == pytest.approx(float(whole), rel=1e-12, abs=1e-12)
        omega = gmts.gradient_coefficient(objective, lp, old, adv, mask, picked=step.picked)
        carriers = mask if step.selected is None else step.selected
        s = int(carriers.sum())
        torch.testing.assert_close(leaf.grad, torch.where(carriers, -omega / s, 0.0))
        # each micro-batch picking for itself would train another objective
        own_picks = torch.cat(
            [
                gmts.objective_picks(objective, ObjectiveInputs.of(lp[r], old[r], adv[r], mask[r]))
                for r in (slice(i, i + 2) for i in range(0, lp.shape[0], 2))
            ]
        )
        differs += int(not torch.equal(own_picks, step.picked))
    assert differs > 0


def test_without_a_pick_the_objective_picks_over_its_rows_with_seed_zero():
    """policy_loss / gradient_coefficient called alone pick over the rows they are given."""
    objective = OBJECTIVES["clip-cov"]
    lp, old, adv, mask, _, _ = _batch(5)
    picks = gmts.objective_picks(objective, ObjectiveInputs.of(lp, old, adv, mask), seed=0)
    assert bool(picks.any())
    assert torch.equal(
        gmts.gradient_coefficient(objective, lp, old, adv, mask),
        gmts.gradient_coefficient(objective, lp, old, adv, mask, picked=picks),
    )
    assert gmts.objective_picks(gmts.ObjectiveConfig(), ObjectiveInputs.of(lp, old, adv)) is None


def test_the_cov_objectives_name_their_mistakes():
    for kwargs, match in (
        (dict(name="clip-cov", clip_cov_ratio=0.0), "clip_cov_ratio"),
        (dict(name="clip-cov", clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_lb must be <"),
        (dict(name="kl-cov", kl_cov_coef=-1.0), "kl_cov_coef"),
        (dict(name="kl-cov", clip_low=0.1), "does not read"),  # kl-cov has no clip
        (dict(name="ppo", kl_cov_ratio=0.1), "does not read"),
    ):
        with pytest.raises(ValueError, match=match):
            gmts.ObjectiveConfig(**kwargs)
