"""The GMTS-vs-ETS overlap costs one more top-k, not a second selection: the partner's
selection from the run's own score inputs (``select_for_update(compare_with=...)``) equals a
full second ``select_for_update`` with the partner score (the slow reference), for every scope,
count and tie rule, top and bottom, with ties and zero scores; and the trainer's logged overlap
(``select_minibatch(overlap=True)``) equals the one counted from two full selections, per
mini-batch and per micro-batch."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import gmts
from gmts.core.logprobs import TokenStatistics
from gmts.scale.distributed import DistInfo
from gmts.train.batch import ScoredBatch
from gmts.train.update import OVERLAP_PARTNER, select_minibatch

B, T, G = 8, 9, 2


def _inputs(seed: int) -> dict:
    """Quantised entropies and log-probs (many ties, exact zeros), a rollout correction's
    weights, a KL reference, 4 groups of 2 rows."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -(torch.randint(1, 8, (B, T), generator=g) / 4.0)
    current = old + torch.randint(-1, 2, (B, T), generator=g) / 8.0
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    return dict(
        logprobs=current,
        old_logprobs=old,
        advantages=gmts.group_advantages(rewards, G),
        response_mask=mask,
        entropy=torch.randint(0, 5, (B, T), generator=g) / 4.0,  # 0, 0.25, ..., 1: ties
        ref_logprobs=old - 0.125,
        group_ids=torch.arange(B) // G,
        importance_weights=torch.randint(2, 7, (B, T), generator=g) / 4.0,
    )


def _configs():
    for score, scope, count, ties, largest, zeros in itertools.product(
        ("gmts", "entropy"),
        ("batch", "group", "sequence"),
        ("ceil", "floor", "quantile", "index"),
        ("first", "last"),
        (True, False),
        ("skip", "select"),
    ):
        if count in ("quantile", "index") and scope != "batch":
            continue
        yield gmts.SelectionConfig(
            score=score,
            ratio=0.3,
            scope=scope,
            count=count,
            ties=ties,
            largest=largest,
            zero_scores=zeros,
        )


CONFIGS = list(_configs())


@pytest.mark.parametrize("seed", [0, 1])
def test_compared_equals_a_second_full_selection(seed):
    objective = gmts.ObjectiveConfig.preset("grpo", kl_coef=0.05)
    inputs = _inputs(seed)
    some_differ = False
    for config in CONFIGS:
        partner = OVERLAP_PARTNER[config.score]
        result = gmts.select_for_update(config, objective, **inputs, compare_with=partner)
        full = gmts.select_for_update(config, objective, **inputs)
        reference = gmts.select_for_update(
            dataclasses.replace(config, score=partner), objective, **inputs
        )
        assert torch.equal(result.selected, full.selected), config
        assert torch.equal(result.compared, reference.selected), config
        some_differ |= not torch.equal(result.selected, result.compared)
    assert some_differ  # the two scores do pick different tokens here


def test_compare_with_names_a_score():
    objective = gmts.ObjectiveConfig.preset("dapo")
    with pytest.raises(ValueError, match="compare_with must be one of"):
        gmts.select_for_update(
            gmts.SelectionConfig(), objective, **_inputs(0), compare_with="entrpy"
        )
    none = gmts.select_for_update(
        gmts.SelectionConfig(score="none"), objective, **_inputs(0), compare_with="entropy"
    )
    assert none.selected is None and none.compared is None


def _batch(seed: int) -> tuple[ScoredBatch, TokenStatistics]:
    x = _inputs(seed)
    batch = ScoredBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.zeros(B, T, dtype=torch.long),
        response_mask=x["response_mask"],
        rewards=torch.zeros(B),
        advantages=x["advantages"],
        group_ids=x["group_ids"],
        old_logprobs=x["old_logprobs"],
        old_entropy=x["entropy"],
        ref_logprobs=x["ref_logprobs"],
        importance_weights=x["importance_weights"],
    )
    return batch, TokenStatistics(x["logprobs"], x["entropy"], None)


@pytest.mark.parametrize("unit", ["mini-batch", "micro-batch"])
@pytest.mark.parametrize("score", ["gmts", "entropy"])
@pytest.mark.parametrize(
    ("scope", "count"), [("batch", "ceil"), ("group", "floor"), ("batch", "quantile")]
)
def test_logged_overlap_equals_two_full_selections(unit, score, scope, count):
    objective = gmts.ObjectiveConfig.preset("grpo", kl_coef=0.05)
    config = gmts.SelectionConfig(score=score, ratio=0.3, unit=unit, scope=scope, count=count)
    partner = dataclasses.replace(config, score=OVERLAP_PARTNER[score])
    kw = dict(micro_batch_size=4, info=DistInfo(), step=3)
    for seed in range(3):
        batch, current = _batch(seed)
        got = select_minibatch(batch, current, config, objective, overlap=True, **kw)
        selected = select_minibatch(batch, current, config, objective, **kw).selected
        other = select_minibatch(batch, current, partner, objective, **kw).selected
        assert torch.equal(got.selected, selected)
        assert got.overlap.both == int((selected & other).sum())
        assert got.overlap.either == int((selected | other).sum())
        assert 0 < got.overlap.both < got.overlap.either


def test_no_overlap_unless_asked_or_without_a_partner():
    objective = gmts.ObjectiveConfig.preset("dapo")
    batch, current = _batch(0)
    kw = dict(micro_batch_size=4, info=DistInfo(), step=0)
    assert select_minibatch(batch, current, gmts.SelectionConfig(), objective, **kw).overlap is None
    omega = gmts.SelectionConfig(score="omega")
    assert select_minibatch(batch, current, omega, objective, overlap=True, **kw).overlap is None
    none = gmts.SelectionConfig(score="none")
    assert select_minibatch(batch, current, none, objective, overlap=True, **kw).selected is None
