"""One mini-batch update: select the tokens once, then one optimizer step over micro-batches.

The order matters for exactness, and :meth:`gmts.train.trainer.Trainer.train_step` shows it:

1. the scores come from the CURRENT policy (the rollout policy's statistics while the policy
   has not changed since the rollout; otherwise one no-grad pass);
2. :func:`select_minibatch`: ONE selection over the whole mini-batch, global across ranks
   (per micro-batch when ``selection.unit == "micro-batch"``, as TRL);
3. :func:`update_minibatch`: the loss divisors once for the whole mini-batch, global across
   ranks (``LossConfig.denominators``), so micro-batch losses add up to the mini-batch loss
   and accumulation is exact; gradients summed over ranks, checked for finiteness, clipped and
   applied once.

:func:`update_in_one_pass` is the same update when the policy IS the rollout policy and the
batch is one micro-batch (one update per rollout): the loss's own forward gives the old
log-probs, so no separate scoring pass runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from gmts.core.config import SelectionConfig
from gmts.core.distributed import all_reduce_sum
from gmts.core.logprobs import TokenStatistics
from gmts.core.loss import LossConfig, TokenSums, policy_loss
from gmts.core.objectives import ObjectiveConfig
from gmts.core.step import select_for_update
from gmts.scale.distributed import DistInfo
from gmts.scale.strategy import Strategy
from gmts.train.batch import ScoredBatch, TrainBatch
from gmts.train.correction import RolloutCorrection
from gmts.train.scoring import TokenScorer, micro_slices, needs_logit_grad_norm

OVERLAP_PARTNER = {"gmts": "entropy", "entropy": "gmts"}
"""The selection compared with for ``select/gmts_ets_jaccard``: GMTS with ETS and back."""


@dataclass(frozen=True)
class UpdateResult:
    """What one mini-batch update did (global over ranks).

    Attributes:
        loss: the mini-batch loss (nan when the step was skipped).
        grad_norm: the global gradient norm before clipping.
        applied: False when the loss or a gradient was not finite: the step was skipped and
            the weights are untouched.
        sums: the loss's :class:`gmts.core.loss.TokenSums`, summed over micro-batches and
            ranks (counts, clipping, entropy, KL, positive advantages).
    """

    loss: float
    grad_norm: float
    applied: bool
    sums: TokenSums


@dataclass(frozen=True)
class Overlap:
    """Tokens in both / either of the run's selection and its partner's (global counts)."""

    both: float
    either: float

    def __add__(self, other: Overlap) -> Overlap:
        return Overlap(self.both + other.both, self.either + other.either)


def select_minibatch(
    batch: ScoredBatch,
    current: TokenStatistics,
    selection: SelectionConfig,
    objective: ObjectiveConfig,
    *,
    micro_batch_size: int,
    info: DistInfo,
    step: int,
    correction: RolloutCorrection | None = None,
) -> torch.Tensor | None:
    """The ``(B, T)`` bool selection of this rank's rows of the mini-batch (global over ranks),
    scored with the current policy's ``current`` statistics; None for score 'none'.

    With ``selection.unit == "micro-batch"`` each micro-batch (the i-th of every rank together)
    is selected on its own; otherwise the whole mini-batch at once (the paper).
    """
    if not selection.enabled:
        return None
    size = micro_batch_size if selection.unit == "micro-batch" else batch.num_rows
    parts = []
    for s in micro_slices(batch.num_rows, size):
        rows = batch.rows(s)
        result = select_for_update(
            selection,
            objective,
            logprobs=current.logprobs[s],
            old_logprobs=rows.old_logprobs,
            advantages=rows.advantages,
            response_mask=rows.response_mask,
            entropy=current.entropy[s],
            ref_logprobs=rows.ref_logprobs,
            logit_grad_norm=(
                None if current.logit_grad_norm is None else current.logit_grad_norm[s]
            ),
            group_ids=rows.group_ids,
            process_group=info.group,
            step=step,
            importance_weights=_weights(correction, rows),
        )
        parts.append(result.selected)
    return torch.cat(parts)


def selection_overlap(
    batch: ScoredBatch,
    current: TokenStatistics,
    selected: torch.Tensor,
    selection: SelectionConfig,
    objective: ObjectiveConfig,
    *,
    micro_batch_size: int,
    info: DistInfo,
    step: int,
    correction: RolloutCorrection | None = None,
) -> Overlap | None:
    """How much ``selected`` (a GMTS or ETS selection) overlaps the partner method's
    selection with the same settings: one extra selection. None for other scores."""
    partner = OVERLAP_PARTNER.get(selection.score)
    if partner is None:
        return None
    other = select_minibatch(
        batch,
        current,
        dataclasses.replace(selection, score=partner),
        objective,
        micro_batch_size=micro_batch_size,
        info=info,
        step=step,
        correction=correction,
    )
    assert other is not None
    counts = torch.stack([(selected & other).sum(), (selected | other).sum()]).double()
    both, either = all_reduce_sum(counts, info.group).tolist()
    return Overlap(both, either)


def update_minibatch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: ScoredBatch,
    selected: torch.Tensor | None,
    *,
    scorer: TokenScorer,
    loss: LossConfig,
    micro_batch_size: int,
    grad_clip: float | None,
    strategy: Strategy,
    correction: RolloutCorrection | None = None,
) -> UpdateResult:
    """One optimizer step on this rank's rows of a mini-batch, trained on ``selected``
    (``(B, T)`` bool; None: every valid token).

    The divisors come from the whole mini-batch's token counts over every rank, once; the
    micro-batches of ``micro_batch_size`` rows then each back-propagate their share of one
    global loss, and the gradients are summed over ranks by the strategy.
    """
    group = strategy.info.group
    counts = TokenSums.count(batch.response_mask, selected).all_reduce(group)
    # (normalize='per-group': every question group is whole on its rank)
    denominators = loss.denominators(counts, mask=batch.response_mask, group_ids=batch.group_ids)
    # the optimizer's own list: under FSDP, model.parameters() can be the gathered (unsharded)
    # tensors between a forward and its backward; the sharded ones hold the gradients
    params = [p for param_group in optimizer.param_groups for p in param_group["params"]]
    optimizer.zero_grad(set_to_none=True)
    total_loss, total_sums, finite = 0.0, None, True
    for s in micro_slices(batch.num_rows, micro_batch_size):
        rows = batch.rows(s)
        stats = scorer(model, rows)  # the current policy, with gradients
        micro_loss, sums = policy_loss(
            stats.logprobs,
            rows.old_logprobs,
            rows.advantages,
            rows.response_mask,
            loss,
            selected=None if selected is None else selected[s],
            ref_logprobs=rows.ref_logprobs,
            entropy=stats.entropy,
            denominators=denominators,
            group_ids=rows.group_ids,
            importance_weights=_weights(correction, rows),
        )
        # backward even when not finite: every rank must reach the same collectives (FSDP's
        # reduce-scatters run inside backward); the step is then skipped on every rank
        finite = finite and bool(torch.isfinite(micro_loss))
        micro_loss.backward()
        total_loss += float(micro_loss.detach())
        total_sums = sums if total_sums is None else total_sums + sums
    assert total_sums is not None, "a mini-batch has at least one row"
    return _apply(optimizer, params, total_loss, total_sums, finite, grad_clip, strategy)


def update_in_one_pass(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    ref_logprobs: torch.Tensor | None,
    *,
    scorer: TokenScorer,
    selection: SelectionConfig,
    loss: LossConfig,
    grad_clip: float | None,
    strategy: Strategy,
    step: int,
    correction: RolloutCorrection | None = None,
) -> tuple[UpdateResult, ScoredBatch, torch.Tensor | None]:
    """The update of a one-micro-batch mini-batch right after the rollout, in one forward.

    The policy is the rollout policy, so its statistics ARE the old statistics: one forward
    with gradients gives the old log-probs (detached), the selection scores and the loss. The
    same update as scoring first and then :func:`update_minibatch` (a test checks it).

    Returns:
        ``(result, scored, selected)``: the update, the batch with its old statistics, and
        this rank's ``(B, T)`` selection (None for score 'none').
    """
    params = [p for param_group in optimizer.param_groups for p in param_group["params"]]
    optimizer.zero_grad(set_to_none=True)
    stats = scorer(model, batch, logit_grad_norm=needs_logit_grad_norm(selection))
    scored = batch.scored(stats, ref_logprobs)  # old log-probs: the detached current ones
    info = strategy.info
    selected = select_minibatch(
        scored,
        scored.old,
        selection,
        loss.objective,
        micro_batch_size=batch.num_rows,
        info=info,
        step=step,
        correction=correction,
    )
    counts = TokenSums.count(batch.response_mask, selected).all_reduce(info.group)
    batch_loss, sums = policy_loss(
        stats.logprobs,
        scored.old_logprobs,
        batch.advantages,
        batch.response_mask,
        loss,
        selected=selected,
        ref_logprobs=ref_logprobs,
        entropy=stats.entropy,
        denominators=loss.denominators(counts, mask=batch.response_mask, group_ids=batch.group_ids),
        group_ids=batch.group_ids,
        importance_weights=_weights(correction, scored),
    )
    finite = bool(torch.isfinite(batch_loss))
    batch_loss.backward()
    result = _apply(
        optimizer, params, float(batch_loss.detach()), sums, finite, grad_clip, strategy
    )
    return result, scored, selected


def _weights(correction: RolloutCorrection | None, rows: ScoredBatch) -> torch.Tensor | None:
    """The rollout correction's ``(B, T)`` importance weights of ``rows`` (None when off)."""
    if correction is None or not correction.enabled:
        return None
    return correction.weights(rows.old_logprobs, rows.engine_logprobs, rows.response_mask)


def _apply(
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    local_loss: float,
    local_sums: TokenSums,
    finite: bool,
    grad_clip: float | None,
    strategy: Strategy,
) -> UpdateResult:
    """Sum the gradients over ranks, clip, and step unless anything on any rank was not
    finite; the loss and the token sums reduced over ranks."""
    strategy.reduce_gradients(params)
    grad_norm = strategy.clip_grad_norm(params, grad_clip)
    flags = all_reduce_sum(
        torch.tensor([0.0 if finite else 1.0, local_loss], dtype=torch.float64),
        strategy.info.group,
    )
    applied = flags[0].item() == 0 and math.isfinite(grad_norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateResult(
        loss=flags[1].item() if applied else float("nan"),
        grad_norm=grad_norm,
        applied=applied,
        sums=local_sums.all_reduce(strategy.info.group),
    )


def update_metrics(results: list[UpdateResult]) -> dict[str, float]:
    """The ``update/*`` and ``select/*`` rows of one step's mini-batch updates.

    Loss and gradient norm are means over the mini-batches (the loss over applied steps only);
    fractions and entropies pool the token sums of every mini-batch.
    """
    applied = [r for r in results if r.applied]
    norms = [r.grad_norm for r in results if math.isfinite(r.grad_norm)]
    sums = results[0].sums
    for r in results[1:]:
        sums = sums + r.sums
    m = sums.metrics()
    out = {
        "update/loss": sum(r.loss for r in applied) / len(applied) if applied else math.nan,
        "update/grad_norm": sum(norms) / len(norms) if norms else math.nan,
        "update/skipped_nonfinite": float(len(results) - len(applied)),
        "update/clip_fraction": m["clip_fraction"],
        "select/fraction": m["selected_fraction"],
        "select/entropy_all": m["entropy_mean"],
        "select/entropy_selected": m["entropy_selected_mean"],
        "select/positive_adv_fraction": m["positive_advantage_fraction_selected"],
    }
    if "kl_mean" in m:
        out["update/kl_mean"] = m["kl_mean"]
    return out
