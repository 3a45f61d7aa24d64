"""Rollout correction (rollout.correction): truncated importance weights min(pi_old/pi_engine,
C), per token or per answer, applied in the loss and folded into omega, so the GMTS score is
still the coefficient of each token's gradient (autograd proves it at both levels)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import gmts
from gmts.core.logprobs import TokenStatistics
from gmts.scale.distributed import DistInfo
from gmts.scale.precision import Precision
from gmts.scale.strategy import Replicate
from gmts.train.batch import ScoredBatch
from gmts.train.config import load_config
from gmts.train.correction import RolloutCorrection
from gmts.train.forward_plan import Positions
from gmts.train.update import select_minibatch, update_minibatch

B, T = 6, 7
F64 = torch.float64


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 1, 6, 4])[:, None]
    old = -0.3 - 2.0 * torch.rand(B, T, generator=g, dtype=F64)
    engine = old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)  # a mismatched sampler
    current = old + 0.2 * torch.randn(B, T, generator=g, dtype=F64)
    entropy = 0.05 + 2.0 * torch.rand(B, T, generator=g, dtype=F64)
    advantages = gmts.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]), 2).double()
    batch = ScoredBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.arange(B)[:, None].expand(B, T).contiguous(),
        response_mask=mask,
        rewards=torch.zeros(B),
        advantages=advantages,
        group_ids=torch.arange(B) // 2,
        engine_logprobs=engine,
        old_logprobs=old,
        old_entropy=entropy,
    )
    return batch, current


def test_weights_are_the_truncated_ratios():
    batch, _ = _batch()
    mask, old, engine = batch.response_mask, batch.old_logprobs, batch.engine_logprobs
    token = RolloutCorrection("token", 1.5).weights(old, engine, mask)
    expected = torch.where(mask, torch.exp(old - engine).clamp(max=1.5), 1.0)
    torch.testing.assert_close(token, expected)
    sequence = RolloutCorrection("sequence", 1.5).weights(old, engine, mask)
    for i in range(B):
        row = torch.exp((old[i] - engine[i])[mask[i]].sum()).clamp(max=1.5)
        torch.testing.assert_close(sequence[i][mask[i]], row.expand(int(mask[i].sum())))
    assert bool((token[mask] <= 1.5).all()) and bool((token[mask] == 1.5).any())  # cap acts
    assert RolloutCorrection().weights(old, engine, mask) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
@pytest.mark.parametrize("cap", [1.02, 1.5, 1.1])
def test_the_capped_fraction_counts_every_weight_at_the_cap(dtype, cap):
    """Caps that the weights' dtype cannot represent (1.02 in float32) count as well."""
    batch, _ = _batch()
    mask = batch.response_mask
    old, engine = batch.old_logprobs.to(dtype), batch.engine_logprobs.to(dtype)
    correction = RolloutCorrection("token", cap)
    weights = correction.weights(old, engine, mask)
    ratio = torch.exp(old.double() - engine.double())[mask]
    sums = correction.metrics(weights, mask)
    assert sums["tokens"] == int(mask.sum())
    assert 0 < sums["capped"] == int((ratio > cap).sum())
    with pytest.raises(ValueError, match="engine"):
        RolloutCorrection("token").weights(old, None, mask)


class _FixedScorer:
    """The trainer's forward replaced by fixed log-probs (the conformance matrix's seam)."""

    def __init__(self, leaf: torch.Tensor, entropy: torch.Tensor) -> None:
        self.leaf, self.entropy = leaf, entropy

    def __call__(self, model: Any, rows: Any, **_: Any) -> TokenStatistics:
        index = rows.response_ids[:, 0]
        return TokenStatistics(self.leaf[index], self.entropy[index], None)

    def no_grad(self, model: Any, rows: Any, **_: Any) -> TokenStatistics:
        stats = self(model, rows)
        return TokenStatistics(stats.logprobs.detach(), stats.entropy, None)

    def positions(self, rows: Any) -> Positions:
        return Positions(0, 0)  # no model runs


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("objective", ["dapo", "gspo-token"])
def test_the_score_is_the_coefficient_of_the_weighted_gradient(level, objective):
    """omega of the weighted loss (autograd of the engine's own composition: the trainer's
    update with the weights) times the entropy is the score the trainer selects by, and the
    update's gradient is -w omega / S on the selected tokens, 0 elsewhere."""
    batch, current = _batch(1)
    obj = gmts.ObjectiveConfig.preset("dapo")
    if objective == "gspo-token":
        obj = gmts.ObjectiveConfig(ratio_level="sequence-token", clip_low=0.05, clip_high=0.07)
    correction = RolloutCorrection(level, 1.4)
    weights = correction.weights(batch.old_logprobs, batch.engine_logprobs, batch.response_mask)
    weighted = dataclasses.replace(batch, importance_weights=weights)  # as rollout.scored does
    selection = gmts.SelectionConfig(ratio=0.3, zero_scores="select")
    info = DistInfo()
    leaf = current.clone().requires_grad_(True)
    scorer = _FixedScorer(leaf, batch.old_entropy)
    current_stats = scorer.no_grad(None, batch)
    chosen = select_minibatch(
        weighted,
        current_stats,
        selection,
        obj,
        micro_batch_size=2,
        info=info,
        step=0,
    )
    selected = chosen.selected
    mask = batch.response_mask

    # omega by autograd of the weighted per-token loss (token-mean, no selection): -dL/dlp * N
    def loss_fn(x):
        return gmts.policy_loss(
            x,
            batch.old_logprobs,
            batch.advantages,
            mask,
            gmts.LossConfig(obj),
            importance_weights=weights,
        )[0]

    omega = gmts.loss_omega(loss_fn, current, mask) * int(mask.sum())
    scores = (batch.old_entropy * omega).abs()
    expected = gmts.select_tokens(scores, mask, 0.3)
    assert torch.equal(selected, expected)
    model = torch.nn.Linear(1, 1)
    update_minibatch(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        weighted,
        chosen,
        scorer=scorer,
        loss=gmts.LossConfig.of(obj, selection),
        micro_batch_size=2,
        grad_clip=None,
        strategy=Replicate(info, Precision(), torch.device("cpu")),
    )
    s = int(selected.sum())
    torch.testing.assert_close(leaf.grad, torch.where(selected, -omega / s, 0.0))
    # the weights changed the selection: without them it would differ here
    plain = select_minibatch(
        batch, current_stats, selection, obj, micro_batch_size=2, info=info, step=0
    ).selected
    assert not torch.equal(plain, selected)


def test_correction_needs_an_engine_and_a_positive_cap(tmp_path):
    with pytest.raises(ValueError, match="rollout.correction: needs a separate inference engine"):
        load_config(None, [f"logging.output_dir={tmp_path}", "rollout.correction=token"])
    with pytest.raises(ValueError, match="rollout.correction_cap"):
        load_config(
            None, ["rollout.engine=vllm", "rollout.correction=token", "rollout.correction_cap=0"]
        )
    with pytest.raises(ValueError, match="correction"):
        load_config(None, ["rollout.engine=vllm", "rollout.correction=row"])
