"""One mini-batch update: select the tokens once, then one optimizer step over micro-batches.

The order matters for exactness; :func:`train_minibatch` is what
:meth:`gmts.train.trainer.Trainer.train_step` runs for every mini-batch of every epoch:

1. the scores come from the CURRENT policy: the rollout policy's statistics (the batch's
   ``old``) while the policy has not changed since the rollout; otherwise one no-grad pass;
2. :func:`select_minibatch`: the core's one selection step (:func:`gmts.core.step.
   selection_step`, which TRL and verl call too): ONE selection over the whole mini-batch,
   global across ranks (per micro-batch when ``selection.unit == "micro-batch"``, as TRL), its
   global token counts and the loss divisors for the whole mini-batch, and, when logged, its
   overlap with the GMTS/ETS partner's selection from the same score inputs (one more top-k);
3. :func:`update_minibatch`: micro-batch losses with those divisors add up to the mini-batch
   loss, so accumulation is exact; gradients summed over ranks, checked for finiteness,
   clipped and applied once.

When the step is one update on one micro-batch, the trainer makes that micro-batch's forward
with gradients first: it gives the old log-probs (the policy IS the rollout policy) and the
update's loss reuses it (``forward=``), so no separate no-grad pass runs. The rollout
correction's weights travel in the batch (``ScoredBatch.importance_weights``), computed once.
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
from gmts.core.step import SelectionOverlap, SelectionStep, UpdateBatch, UpdateLayout
from gmts.core.step import selection_step as core_selection_step
from gmts.scale.distributed import DistInfo
from gmts.scale.strategy import Strategy
from gmts.train.batch import ScoredBatch
from gmts.train.forward_plan import Positions
from gmts.train.scoring import TokenScorer, micro_slices, needs_logit_grad_norm

OVERLAP_PARTNER = {"gmts": "entropy", "entropy": "gmts"}
"""The selection compared with for ``select/gmts_ets_jaccard``: GMTS with ETS and back."""

Overlap = SelectionOverlap  # the name this module gave it before the core owned it


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
        positions: the positions the loss forwards computed and the real ones (global;
            :meth:`gmts.train.scoring.TokenScorer.positions`).
        overlap: the selection's overlap with its GMTS/ETS partner's (:data:`OVERLAP_PARTNER`),
            or None (not logged, or another score).
        picked: the tokens the objective's batch-level pick took (clip-cov, kl-cov; global),
            or None for an objective without one.
    """

    loss: float
    grad_norm: float
    applied: bool
    sums: TokenSums
    positions: Positions
    overlap: SelectionOverlap | None = None
    picked: float | None = None


def train_minibatch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: ScoredBatch,
    *,
    scorer: TokenScorer,
    selection: SelectionConfig,
    loss: LossConfig,
    micro_batch_size: int,
    grad_clip: float | None,
    strategy: Strategy,
    step: int,
    policy_changed: bool,
    overlap: bool,
    forward: TokenStatistics | None = None,
) -> UpdateResult:
    """Steps 1-3 of the module docstring on this rank's rows of one mini-batch.

    Args:
        selection: ``loss.selection`` (the one owner of the selection settings; a different
            one is an error).
        policy_changed: an update has run since the rollout: the selection scores come from a
            no-grad pass of the current policy instead of the rollout policy's statistics.
        overlap: also measure the selection's overlap with its GMTS/ETS partner's.
        forward: see :func:`update_minibatch`.
        step: the optimizer step (seeds the random score).
    """
    if selection != loss.selection:
        raise ValueError(
            "selection differs from loss.selection: build the loss with "
            "LossConfig.of(objective, selection)"
        )
    current = batch.old
    if policy_changed and selection.enabled:
        current = scorer.no_grad(
            model,
            batch,
            micro_batch_size=micro_batch_size,
            logit_grad_norm=needs_logit_grad_norm(selection),
        )
    chosen = select_minibatch(
        batch,
        current,
        selection,
        loss.objective,
        micro_batch_size=micro_batch_size,
        info=strategy.info,
        step=step,
        overlap=overlap,
        horizon=loss.horizon,
    )
    result = update_minibatch(
        model,
        optimizer,
        batch,
        chosen,
        scorer=scorer,
        loss=loss,
        micro_batch_size=micro_batch_size,
        grad_clip=grad_clip,
        strategy=strategy,
        forward=forward,
    )
    picked = None
    if chosen.picked is not None:
        count = chosen.picked.sum().double().reshape(1)
        picked = float(all_reduce_sum(count, strategy.info.group)[0])
    return dataclasses.replace(result, overlap=chosen.overlap, picked=picked)


def select_minibatch(
    batch: ScoredBatch,
    current: TokenStatistics,
    selection: SelectionConfig,
    objective: ObjectiveConfig,
    *,
    micro_batch_size: int,
    info: DistInfo,
    step: int,
    overlap: bool = False,
    horizon: int | None = None,
) -> SelectionStep:
    """The core's selection step (:func:`gmts.core.step.selection_step`) on this rank's rows
    of the mini-batch, scored with the current policy's ``(B, T)`` ``current`` statistics and
    the batch's correction weights: the selection (global over ranks; each micro-batch of
    ``micro_batch_size`` rows on its own with ``selection.unit == "micro-batch"``), the
    mini-batch's global counts and the loss divisors (``horizon``: ``LossConfig.horizon``).
    With ``overlap``, a GMTS or ETS selection is also compared with the partner score's
    selection under the same settings, from the same inputs (one more score and top-k)."""
    partner = OVERLAP_PARTNER.get(selection.score) if overlap else None
    update = UpdateBatch(
        logprobs=current.logprobs,
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages,
        response_mask=batch.response_mask,
        entropy=current.entropy,
        ref_logprobs=batch.ref_logprobs,
        logit_grad_norm=current.logit_grad_norm,
        group_ids=batch.group_ids,
        importance_weights=batch.importance_weights,
    )
    # (normalize='per-group': every question group is whole on its rank)
    return core_selection_step(
        LossConfig.of(objective, selection, horizon=horizon),
        update,
        layout=UpdateLayout(process_group=info.group, unit_rows=micro_batch_size),
        step=step,
        compare_with=partner,
    )


def update_minibatch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: ScoredBatch,
    chosen: SelectionStep,
    *,
    scorer: TokenScorer,
    loss: LossConfig,
    micro_batch_size: int,
    grad_clip: float | None,
    strategy: Strategy,
    forward: TokenStatistics | None = None,
) -> UpdateResult:
    """One optimizer step on this rank's rows of a mini-batch, trained on ``chosen``'s
    selection with its divisors (:func:`select_minibatch`).

    The divisors come from the whole mini-batch's token counts over every rank, once; the
    micro-batches of ``micro_batch_size`` rows then each back-propagate their share of one
    global loss, and the gradients are summed over ranks by the strategy.

    Args:
        forward: the current policy's ``(B, T)`` statistics of the whole mini-batch WITH
            gradients, from a forward already made (one micro-batch only): the loss reuses it
            instead of running the model again. None: each micro-batch runs its forward.
    """
    if not isinstance(chosen, SelectionStep):
        raise ValueError(
            f"chosen must be the SelectionStep of select_minibatch, got {type(chosen).__name__}"
        )
    if forward is not None and batch.num_rows > micro_batch_size:
        raise ValueError(
            f"forward= is one micro-batch's statistics, but the mini-batch has "
            f"{batch.num_rows} rows > micro_batch_size={micro_batch_size}"
        )
    selected = chosen.selected
    # the optimizer's own list: under FSDP, model.parameters() can be the gathered (unsharded)
    # tensors between a forward and its backward; the sharded ones hold the gradients
    params = [p for param_group in optimizer.param_groups for p in param_group["params"]]
    optimizer.zero_grad(set_to_none=True)
    total_loss, total_sums, finite = 0.0, None, True
    positions = Positions(0, 0)
    for s in micro_slices(batch.num_rows, micro_batch_size):
        rows = batch.rows(s)
        stats = forward if forward is not None else scorer(model, rows)  # with gradients
        positions = positions + scorer.positions(rows)
        micro_loss, sums = policy_loss(
            stats.logprobs,
            rows.old_logprobs,
            rows.advantages,
            rows.response_mask,
            loss,
            selected=None if selected is None else selected[s],
            ref_logprobs=rows.ref_logprobs,
            entropy=stats.entropy,
            denominators=chosen.denominators,
            group_ids=rows.group_ids,
            importance_weights=rows.importance_weights,
            picked=None if chosen.picked is None else chosen.picked[s],
        )
        if chosen.scale != 1.0:
            micro_loss = micro_loss / chosen.scale
        # backward even when not finite: every rank must reach the same collectives (FSDP's
        # reduce-scatters run inside backward); the step is then skipped on every rank
        finite = finite and bool(torch.isfinite(micro_loss))
        micro_loss.backward()
        total_loss += float(micro_loss.detach())
        total_sums = sums if total_sums is None else total_sums + sums
    assert total_sums is not None, "a mini-batch has at least one row"
    return _apply(optimizer, params, total_loss, total_sums, positions, finite, grad_clip, strategy)


def _apply(
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    local_loss: float,
    local_sums: TokenSums,
    local_positions: Positions,
    finite: bool,
    grad_clip: float | None,
    strategy: Strategy,
) -> UpdateResult:
    """Sum the gradients over ranks, clip, and step unless anything on any rank was not
    finite; the loss, the token sums and the positions reduced over ranks."""
    strategy.reduce_gradients(params)
    grad_norm = strategy.clip_grad_norm(params, grad_clip)
    flags = all_reduce_sum(
        torch.tensor(
            [
                0.0 if finite else 1.0,
                local_loss,
                local_positions.computed,
                local_positions.real,
            ],
            dtype=torch.float64,
        ),
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
        positions=Positions(int(flags[2].item()), int(flags[3].item())),
    )


def update_metrics(results: list[UpdateResult]) -> dict[str, float]:
    """The ``update/*`` and ``select/*`` rows of one step's mini-batch updates.

    Loss and gradient norm are means over the mini-batches (the loss over applied steps only);
    fractions and entropies pool the token sums of every mini-batch, the GMTS/ETS Jaccard
    overlap (when measured) the overlap counts; the positions are summed over the loss
    forwards.
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
        "update/positions_computed": float(sum(r.positions.computed for r in results)),
        "update/positions_real": float(sum(r.positions.real for r in results)),
        "update/clip_fraction": m["clip_fraction"],
        "select/fraction": m["selected_fraction"],
        "select/entropy_all": m["entropy_mean"],
        "select/entropy_selected": m["entropy_selected_mean"],
        "select/positive_adv_fraction": m["positive_advantage_fraction_selected"],
        "select/clip_fraction": m["clip_fraction_selected"],
    }
    if "kl_mean" in m:
        out["update/kl_mean"] = m["kl_mean"]
    overlaps = [r.overlap for r in results if r.overlap is not None]
    picks = [r.picked for r in results if r.picked is not None]
    if picks:  # the share of tokens a batch-level pick (clip-cov, kl-cov) treated apart
        out["update/picked_fraction"] = sum(picks) / max(sums["valid_tokens"], 1.0)
    if overlaps:
        out["select/gmts_ets_jaccard"] = sum(overlaps[1:], overlaps[0]).jaccard
    return out
