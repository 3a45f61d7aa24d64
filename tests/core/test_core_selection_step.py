"""``selection_step``, the one selection step of every engine, against a slow reference on
random batches (random lengths, groups, padding, ties): the mask is each unit's own
``select_for_update``, the counts are counted by hand, the divisors follow the rule written out
per aggregation (eq. 2's S, N, rows, rows times H), divided by the processes that average
gradients, and the engine's own divisor takes over exactly where the rule keeps the
objective's aggregation. Then what a new selection rule reads (the log-probs, advantages) and
a condition rule as a 0/1 score."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import gmts
from gmts.core.step import OwnDivisor, UpdateBatch, UpdateLayout, selection_step

B, T, G, H = 8, 7, 2, 9


def _batch(seed: int) -> UpdateBatch:
    """Random lengths (an all-padding row among them), quantised scores (ties, exact zeros),
    correction weights, a KL reference, 4 question groups of 2 rows."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[int(torch.randint(0, B, (1,), generator=g))] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -(torch.randint(1, 8, (B, T), generator=g) / 4.0).double()
    current = old + torch.randint(-1, 2, (B, T), generator=g).double() / 8.0
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    return UpdateBatch(
        logprobs=current,
        old_logprobs=old,
        advantages=gmts.group_advantages(rewards, G),
        response_mask=mask,
        entropy=(torch.randint(0, 5, (B, T), generator=g) / 4.0).double(),
        ref_logprobs=old - 0.125,
        group_ids=torch.arange(B) // G,
        importance_weights=(torch.randint(2, 7, (B, T), generator=g) / 4.0).double(),
    )


def _reference_units(loss: gmts.LossConfig, batch: UpdateBatch, unit_rows):
    """Each unit's own select_for_update (the low-level call every engine made before)."""
    selection = loss.selection
    rows = batch.num_rows
    size = unit_rows if selection.unit == "micro-batch" and unit_rows else rows
    results = []
    for start in range(0, rows, size):
        s = slice(start, min(start + size, rows))
        results.append(
            gmts.select_for_update(
                selection,
                loss.objective,
                logprobs=batch.logprobs[s],
                old_logprobs=batch.old_logprobs[s],
                advantages=batch.advantages[s],
                response_mask=batch.response_mask[s],
                entropy=batch.entropy[s],
                ref_logprobs=batch.ref_logprobs[s],
                group_ids=batch.group_ids[s],
                importance_weights=batch.importance_weights[s],
            )
        )
    return results


def _reference_divisors(aggregation, normalize, kl_tokens, mask, selected):
    """(policy, kl) written out per case: eq. 2 divides by S (KL by S or N), otherwise the
    aggregation's count: N (token-mean), rows with a valid token (seq-mean-*), times H
    (seq-mean-token-sum-norm), or 1 (sum); each at least 1."""
    n = int(mask.sum())
    s = int((mask & selected).sum()) if selected is not None else n
    rows = int(mask.any(-1).sum())
    if selected is not None and normalize == "selected":
        return max(s, 1), max(n if kl_tokens == "all" else s, 1)
    count = {
        "token-mean": n,
        "seq-mean-token-mean": rows,
        "seq-mean-token-sum": rows,
        "seq-mean-token-sum-norm": rows,
        "sum": 1,
    }[aggregation]
    scale = H if aggregation == "seq-mean-token-sum-norm" else 1
    return max(count, 1) * scale, max(count, 1) * scale


CASES = list(
    itertools.product(
        ("gmts", "entropy", "random", "none"),
        ("mini-batch", "micro-batch"),
        ("selected", "all"),
        ("selected", "all"),
        ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "sum"),
    )
)


@pytest.mark.parametrize("score,unit,normalize,kl_tokens,aggregation", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_step_equals_the_reference(score, unit, normalize, kl_tokens, aggregation, seed):
    batch = _batch(seed)
    selection = gmts.SelectionConfig(
        score=score, ratio=0.3, unit=unit, normalize=normalize, kl_tokens=kl_tokens
    )
    objective = gmts.ObjectiveConfig(kl_coef=0.05, aggregation=aggregation)
    loss = gmts.LossConfig.of(objective, selection, horizon=H)
    for averaged_over, accumulated in ((1, 1), (4, 3)):
        layout = UpdateLayout(unit_rows=3, averaged_over=averaged_over, accumulated=accumulated)
        step = selection_step(loss, batch, layout=layout, step=0)
        mask = batch.response_mask
        if score == "none":
            assert step.selected is None and step.threshold is None
        else:
            want = torch.cat([r.selected for r in _reference_units(loss, batch, 3)])
            assert torch.equal(step.selected, want)
        selected = step.selected
        n = int(mask.sum())
        s = n if selected is None else int((selected & mask).sum())
        assert step.counts["valid_tokens"] == n and step.counts["selected_tokens"] == s
        assert step.counts["valid_rows"] == int(mask.any(-1).sum())
        policy, kl = _reference_divisors(aggregation, normalize, kl_tokens, mask, selected)
        assert step.denominators.policy == policy / averaged_over
        assert step.denominators.kl == kl / averaged_over
        assert step.scale == accumulated
        assert step.unit_divisor == (selected is not None and normalize == "selected")
        m = step.metrics()
        assert (m["selected_tokens"], m["valid_tokens"]) == (s, n)
        assert m["selected_fraction"] == pytest.approx(s / n)


@pytest.mark.parametrize("normalize", ["selected", "all"])
def test_micro_batch_losses_with_the_step_divisors_add_up_to_the_batch_loss(normalize):
    """The divisors are the whole batch's: micro-batch losses with them sum to the loss of
    the batch at once, values and gradients."""
    batch = _batch(3)
    selection = gmts.SelectionConfig(score="gmts", ratio=0.4, normalize=normalize)
    loss = gmts.LossConfig.of(gmts.ObjectiveConfig(kl_coef=0.1), selection)
    step = selection_step(loss, batch)

    def loss_of(lp, rows, denominators):
        return gmts.policy_loss(
            lp[rows],
            batch.old_logprobs[rows],
            batch.advantages[rows],
            batch.response_mask[rows],
            loss,
            selected=step.selected[rows],
            ref_logprobs=batch.ref_logprobs[rows],
            denominators=denominators,
            importance_weights=batch.importance_weights[rows],
        )[0]

    whole = batch.logprobs.clone().requires_grad_(True)
    full = loss_of(whole, slice(None), None)
    (g_full,) = torch.autograd.grad(full, whole)
    parts = batch.logprobs.clone().requires_grad_(True)
    total = sum(loss_of(parts, slice(i, i + 3), step.denominators) for i in range(0, B, 3))
    (g_parts,) = torch.autograd.grad(total, parts)
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g_parts, g_full, rtol=1e-12, atol=1e-15)


def test_an_engines_own_divisor_replaces_the_objectives_never_eq2():
    batch = _batch(4)
    own = OwnDivisor(divisor=5.0, scale=2.0)
    layout = UpdateLayout(own_divisor=own, averaged_over=2)
    objective = gmts.ObjectiveConfig(kl_coef=0.05)
    for normalize, score in (("all", "gmts"), ("selected", "none"), ("selected", "gmts")):
        selection = gmts.SelectionConfig(score=score, ratio=0.3, normalize=normalize)
        step = selection_step(gmts.LossConfig.of(objective, selection), batch, layout=layout)
        if score == "gmts" and normalize == "selected":  # eq. 2: the unit's S over processes
            s = step.counts["selected_tokens"]
            assert (step.denominators.policy, step.scale) == (s / 2, 1.0)
        else:
            assert (step.denominators.policy, step.denominators.kl, step.scale) == (5.0, 5.0, 2.0)
    local = selection_step(
        gmts.LossConfig.of(objective, gmts.SelectionConfig(score="none")),
        batch,
        layout=UpdateLayout(own_divisor=OwnDivisor(None, 3.0)),
    )
    assert local.denominators is None and local.scale == 3.0  # policy_loss's own count


def test_part_of_a_unit_keeps_eq2_and_takes_the_engines_divisor_otherwise():
    """A unit spanning several micro-batches (TRL's optimizer step): each micro-batch's part
    has its rows of the mask and the unit's counts; eq. 2 keeps the unit's divisors, the
    objective's aggregation takes the micro-batch's own divisor."""
    batch = _batch(5)
    objective = gmts.ObjectiveConfig()
    for normalize in ("selected", "all"):
        selection = gmts.SelectionConfig(score="gmts", ratio=0.3, normalize=normalize)
        step = selection_step(gmts.LossConfig.of(objective, selection), batch)
        part = step.part(slice(2, 5), OwnDivisor(7.0, 2.0))
        assert torch.equal(part.selected, step.selected[2:5])
        assert part.counts is step.counts and part.threshold == step.threshold
        if normalize == "selected":
            assert (part.denominators, part.scale) == (step.denominators, step.scale)
        else:
            assert (part.denominators.policy, part.scale) == (7.0, 2.0)


def test_threshold_and_overlap_over_several_units():
    """The threshold of micro-batch units is the whole selection's (its smallest selected
    score); the overlap counts equal those of two full selection steps."""
    batch = _batch(6)
    for largest in (True, False):
        selection = gmts.SelectionConfig(
            score="gmts", ratio=0.3, unit="micro-batch", largest=largest, zero_scores="select"
        )
        loss = gmts.LossConfig.of(gmts.ObjectiveConfig(kl_coef=0.05), selection)
        layout = UpdateLayout(unit_rows=3)
        step = selection_step(loss, batch, layout=layout, compare_with="entropy")
        scores = [r.scores for r in _reference_units(loss, batch, 3)]
        want = gmts.selection_threshold(torch.cat(scores), step.selected, largest=largest)
        assert step.threshold == want
        partner = dataclasses.replace(selection, score="entropy")
        ets = selection_step(
            gmts.LossConfig.of(loss.objective, partner), batch, layout=layout
        ).selected
        both = int((step.selected & ets).sum())
        either = int((step.selected | ets).sum())
        assert (step.overlap.both, step.overlap.either) == (both, either)
        assert step.metrics()["overlap_jaccard"] == both / either


def test_bad_layouts_and_arguments_are_refused():
    for kwargs, match in (
        (dict(averaged_over=0), "averaged_over"),
        (dict(accumulated=1.5), "accumulated"),
        (dict(unit_rows=0), "unit_rows"),
    ):
        with pytest.raises(ValueError, match=match):
            UpdateLayout(**kwargs)
    with pytest.raises(ValueError, match="LossConfig"):
        selection_step(gmts.SelectionConfig(), _batch(0))
    with pytest.raises(ValueError, match="UpdateBatch"):
        selection_step(gmts.LossConfig(), {"logprobs": None})


# ------------------------------------------------------------------------------------------
# what a new selection rule reads


def test_a_registered_rule_reads_logprobs_and_advantages():
    """A score that reads the log-probs and advantages gets them from every engine's step
    (detached, advantages broadcast to (B, T)): the selection is the top-k of its formula."""

    @gmts.register_score("test-advantage-surprise", requires={"logprobs", "advantages", "mask"})
    def surprise(inputs):
        assert inputs.selection.score == "test-advantage-surprise"  # its parameters' place
        assert inputs.advantages.shape == inputs.mask.shape
        assert not inputs.logprobs.requires_grad
        return (-inputs.logprobs * inputs.advantages).abs()

    try:
        batch = _batch(7)
        batch = UpdateBatch(
            **{**batch.__dict__, "logprobs": batch.logprobs.clone().requires_grad_(True)}
        )
        selection = gmts.SelectionConfig(score="test-advantage-surprise", ratio=0.25)
        step = selection_step(gmts.LossConfig.of(gmts.ObjectiveConfig(), selection), batch)
        score = (-batch.logprobs.detach() * batch.advantages[:, None]).abs()
        want = gmts.select_tokens(score, batch.response_mask, 0.25)
        assert torch.equal(step.selected, want & (score != 0))  # zero scores skipped
    finally:
        gmts.core.scores._SCORES.remove("test-advantage-surprise")


def test_a_condition_rule_is_a_zero_one_score_with_ratio_one():
    """A rule that keeps the tokens meeting a condition (STAPO-like: drop low-probability,
    low-entropy tokens of positive answers) is a 0/1 score at ratio 1 with zero scores
    skipped: the selection is exactly the condition."""

    def keep(lp, entropy, adv):
        return ~((lp.exp() < 0.3) & (entropy < 0.5) & (adv > 0))

    @gmts.register_score("test-condition", requires={"logprobs", "entropy", "advantages"})
    def condition(inputs):
        return keep(inputs.logprobs, inputs.entropy, inputs.advantages).double()

    try:
        dropped = 0
        for seed in range(4):
            batch = _batch(seed)
            selection = gmts.SelectionConfig(score="test-condition", ratio=1.0)
            step = selection_step(gmts.LossConfig.of(gmts.ObjectiveConfig(), selection), batch)
            want = batch.response_mask & keep(
                batch.logprobs, batch.entropy, batch.advantages[:, None].expand(B, T)
            )
            assert torch.equal(step.selected, want)
            dropped += int(batch.response_mask.sum()) - int(want.sum())
        assert dropped > 0  # the condition acted
    finally:
        gmts.core.scores._SCORES.remove("test-condition")


def test_score_help_lists_the_registered_scores():
    text = gmts.SelectionConfig.__dataclass_fields__["score"].metadata["help"]
    for name in gmts.available_scores():
        assert f"{name} (" in text  # each with its own line of help
