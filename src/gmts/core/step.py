"""The one selection step every engine calls at its update: :func:`selection_step`.

The standalone trainer (``gmts.train.update``), TRL's ``GMTSGRPOTrainer`` and the verl plugin
each hand it what they hold at the update (an :class:`UpdateBatch`: log-probs, old log-probs,
advantages, masks, group ids, entropy, importance weights) and how their update is laid out (an
:class:`UpdateLayout`: the process group and collective, the selection unit's rows, the
processes that average gradients, the accumulated batches, the engine's own divisor), and get
back a :class:`SelectionStep`: the selection mask, the global token counts, the loss divisors
and the metrics. Underneath, :func:`select_for_update` scores and selects one unit of rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from gmts.core import distributed as dist_utils
from gmts.core.config import SelectionConfig
from gmts.core.loss import LossConfig, LossDenominators, TokenSums, applied_aggregation
from gmts.core.objectives import (
    ObjectiveConfig,
    ObjectiveInputs,
    get_objective,
    gradient_coefficient,
    objective_picks,
)
from gmts.core.scores import ScoreInputs, available_scores, compute_scores, score_requirements
from gmts.core.selection import select_tokens, selection_threshold

__all__ = [
    "OwnDivisor",
    "SelectionOverlap",
    "SelectionResult",
    "SelectionStep",
    "UpdateBatch",
    "UpdateLayout",
    "select_for_update",
    "selection_step",
]

# Seeds of the random score on different ranks are this far apart.
_RANK_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class SelectionResult:
    """Output of :func:`select_for_update`.

    Attributes:
        selected: ``(B, T)`` bool selection mask, or None for score='none' (train on all tokens).
        scores: ``(B, T)`` detached scores, or None for score='none'.
        threshold: the global score threshold (smallest selected score; largest for bottom
            selection), nan if nothing was selected, None for score='none'.
        compared: ``(B, T)`` bool: the selection score ``compare_with`` makes with the same
            settings and inputs (None when none was asked for, and for score='none').
        picked: ``(B, T)`` bool: the objective's batch-level pick over these rows (clip-cov,
            kl-cov: :func:`gmts.objective_picks`), which omega used and the loss must use
            (``policy_loss(picked=...)``); None for an objective without one.
    """

    selected: torch.Tensor | None
    scores: torch.Tensor | None
    threshold: float | None
    compared: torch.Tensor | None = None
    picked: torch.Tensor | None = None


def select_for_update(
    config: SelectionConfig,
    objective: ObjectiveConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    logit_grad_norm: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    process_group: Any = None,
    step: int = 0,
    importance_weights: torch.Tensor | None = None,
    compare_with: str | None = None,
    picked: torch.Tensor | None = None,
) -> SelectionResult:
    """Score the tokens with ``config.score`` and select the top (or bottom) ``config.ratio``
    of exactly the rows given (one selection unit: :func:`selection_step` slices the units).

    omega is computed from the current ``logprobs`` (detached) with ``objective`` (its terms,
    KL and importance weights: :func:`gmts.gradient_coefficient`, by ``config.omega``'s method),
    so it is exactly the gradient coefficient of the loss that :func:`gmts.policy_loss` will
    compute with the same objective and weights (times the aggregation's per-token weight with
    ``config.omega_weighting``). Only the inputs the score needs
    (:func:`gmts.score_requirements`) are read; a missing one raises ValueError. With
    ``config.zero_scores == "skip"`` a top selection drops a selected token whose score is
    exactly 0 (it fills the count only); a bottom selection keeps them (docs/semantics.md 4).

    Args:
        logprobs, old_logprobs, ref_logprobs, entropy, logit_grad_norm: ``(B, T)``.
        advantages: ``(B,)`` or ``(B, T)``. response_mask: ``(B, T)`` bool.
        group_ids: ``(B,)`` global question-group ids (required for scope='group').
        process_group: selection is global over its ranks (every rank must call).
        step: training step; the random score is seeded with ``config.seed + step`` (plus a
            per-rank offset under a process group).
        importance_weights: ``(B,)``/``(B, 1)``/``(B, T)`` rollout-correction weights that the
            loss multiplies into the policy term (folded into omega), or None.
        compare_with: another score name: ``compared`` is then the selection that
            ``config`` with that score would make (for an overlap metric), from the same
            inputs (omega computed once when both read it): one more score and top-k, equal to
            a second call with ``dataclasses.replace(config, score=compare_with)``.
        picked: ``(B, T)`` bool, the objective's batch-level pick of these rows
            (:func:`gmts.objective_picks`); None: made here over these rows (global over
            ``process_group``, its draw seeded with ``config.seed + step``) when the objective
            has one. Returned as ``picked``, for the loss.
    """
    _check_arguments(config, objective, compare_with)
    batch = UpdateBatch(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        entropy=entropy,
        ref_logprobs=ref_logprobs,
        logit_grad_norm=logit_grad_norm,
        importance_weights=importance_weights,
    )
    if picked is None:
        picked = _unit_picks(config, objective, batch, step, process_group)
    if not config.enabled:
        return SelectionResult(selected=None, scores=None, threshold=None, picked=picked)
    needs = score_requirements(config.score)
    if compare_with is not None:
        needs = needs | score_requirements(compare_with)
    omega = _omega(config, objective, batch, picked) if "omega" in needs else None
    inputs = _score_inputs(config, batch, needs, omega, step, process_group)
    scores = compute_scores(config.score, inputs)
    selected = _top(config, scores, response_mask, group_ids, process_group)
    threshold = selection_threshold(
        scores, selected, largest=config.largest, process_group=process_group
    )
    compared = None
    if compare_with is not None:
        other = compute_scores(compare_with, inputs)
        compared = _top(config, other, response_mask, group_ids, process_group)
    return SelectionResult(
        selected=selected, scores=scores, threshold=threshold, compared=compared, picked=picked
    )


def _unit_picks(
    config: SelectionConfig,
    objective: ObjectiveConfig,
    b: UpdateBatch,
    step: int,
    process_group: Any,
) -> torch.Tensor | None:
    """The objective's batch-level pick of one unit (None without one): over the unit's rows
    of every rank, from the current (detached) log-probs, drawn with ``config.seed + step``
    (the same seed on every rank: the draw is one global permutation)."""
    if get_objective(objective.name).picks is None:
        return None
    inputs = ObjectiveInputs.of(b.logprobs.detach(), b.old_logprobs, b.advantages, b.response_mask)
    return objective_picks(objective, inputs, seed=config.seed + step, process_group=process_group)


def _check_arguments(
    config: SelectionConfig, objective: ObjectiveConfig, compare_with: str | None
) -> None:
    if not isinstance(config, SelectionConfig):
        raise ValueError(f"config must be a SelectionConfig, got {type(config).__name__}")
    if not isinstance(objective, ObjectiveConfig):
        raise ValueError(f"objective must be an ObjectiveConfig, got {type(objective).__name__}")
    if compare_with is not None and compare_with not in available_scores():
        raise ValueError(f"compare_with must be one of {available_scores()}, got {compare_with!r}")


def _omega(
    config: SelectionConfig,
    objective: ObjectiveConfig,
    b: UpdateBatch,
    picked: torch.Tensor | None,
) -> torch.Tensor:
    """``(B, T)`` omega of ``objective`` at the current (detached) log-probs (with the unit's
    ``picked``), times the aggregation's per-token weight with ``config.omega_weighting``."""
    omega = gradient_coefficient(
        objective,
        b.logprobs.detach(),
        b.old_logprobs,
        b.advantages,
        b.response_mask,
        ref_logprobs=b.ref_logprobs if objective.kl_coef > 0 else None,
        importance_weights=b.importance_weights,
        method=config.omega,
        picked=picked,
    )
    if config.omega_weighting:  # the weight of the aggregation the loss applies
        aggregation = applied_aggregation(objective, config.normalize, selection=True)
        weights = aggregation.token_weights(b.response_mask.bool())
        omega = omega * weights.to(omega.dtype)  # (B, T)
    return omega


def _score_inputs(
    config: SelectionConfig,
    b: UpdateBatch,
    needs: frozenset[str],
    omega: torch.Tensor | None,
    step: int,
    process_group: Any,
) -> ScoreInputs:
    """What the scores read of ``b`` (``needs``; detached), and only that."""

    def given(name: str, value: torch.Tensor | None) -> torch.Tensor | None:
        return value.detach() if value is not None and name in needs else None

    return ScoreInputs(
        entropy=given("entropy", b.entropy),
        omega=omega,
        logit_grad_norm=given("logit_grad_norm", b.logit_grad_norm),
        mask=b.response_mask,
        logprobs=given("logprobs", b.logprobs),
        old_logprobs=given("old_logprobs", b.old_logprobs),
        ref_logprobs=given("ref_logprobs", b.ref_logprobs),
        advantages=given("advantages", _per_token(b.advantages, b.response_mask)),
        seed=_seed(config, step, process_group),
        process_group=process_group,
        selection=config,
    )


def _seed(config: SelectionConfig, step: int, process_group: Any) -> int:
    """The random score's seed: ``config.seed + step``, apart by rank under a process group."""
    seed = config.seed + step
    if dist_utils.is_distributed(process_group):
        seed += _RANK_SEED_STRIDE * dist_utils.get_rank(process_group)
    return seed


def _top(
    config: SelectionConfig,
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor | None,
    process_group: Any,
) -> torch.Tensor:
    """The ``(B, T)`` bool selection of ``scores`` by ``config``'s ratio, scope, count, ties
    and zero-score rule (global over ``process_group``)."""
    selected = select_tokens(
        scores,
        response_mask,
        config.ratio,
        largest=config.largest,
        scope=config.scope,
        group_ids=group_ids,
        process_group=process_group,
        count=config.count,
        ties=config.ties,
    )
    if config.zero_scores == "skip" and config.largest:
        # a top selection reaches a zero score only to fill its count (fewer than k tokens
        # carry gradient); a bottom selection takes zeros first, as the smallest gradients
        # there are, and eq. 2 counts them in S (docs/semantics.md section 4)
        selected = selected & (scores != 0)
    return selected


def _per_token(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B,)``, ``(B, 1)`` or ``(B, T)`` advantages as ``(B, T)`` (a view)."""
    per_row = advantages[:, None] if advantages.dim() == 1 else advantages
    return per_row.expand(mask.shape)  # (B, T)


# ------------------------------------------------------------------------------------------
# the step every engine calls


@dataclass(frozen=True)
class UpdateBatch:
    """What an engine holds at its update, for one selection step; ``B`` rows, ``T`` positions.

    Attributes:
        logprobs: ``(B, T)`` the current policy's log-probs (detached by the step).
        old_logprobs: ``(B, T)`` the rollout policy's (or the current ones: r = 1).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        response_mask: ``(B, T)`` bool, the tokens the loss sees.
        entropy, ref_logprobs, logit_grad_norm: ``(B, T)``, or None where the engine has none
            (a score that reads a missing one raises).
        group_ids: ``(B,)`` global question-group ids (scope 'group', normalize 'per-group').
        importance_weights: ``(B,)``, ``(B, 1)`` or ``(B, T)`` detached weights >= 0 that the
            loss multiplies into the policy term (folded into omega), or None.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    entropy: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    logit_grad_norm: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    importance_weights: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.response_mask.shape[0])

    def rows(self, index: slice) -> UpdateBatch:
        """The rows ``index`` of every tensor (views)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return UpdateBatch(**{k: None if v is None else v[index] for k, v in values.items()})


@dataclass(frozen=True)
class OwnDivisor:
    """An engine's own divisor of the objective's aggregation (TRL's ``loss_type`` divisor).

    The core's rule keeps the objective's own aggregation where there is no selection or
    ``normalize != 'selected'``; an engine that aggregates by its own rule there passes it.

    Attributes:
        divisor: the policy and KL divisor; None: the batch's own count (``policy_loss``
            without ``denominators``).
        scale: the loss is divided by it afterwards (the engine's accumulation normaliser).
    """

    divisor: float | None
    scale: float = 1.0


@dataclass(frozen=True)
class UpdateLayout:
    """How an engine's update is laid out around one selection step.

    Attributes:
        process_group: the ranks the selection and its counts are global over (every rank
            calls); None: this process.
        reduce_sum: the engine's own sum collective for the counts (``(F,) -> (F,)``, e.g.
            ``accelerator.reduce``); None: an all-reduce over ``process_group``.
        unit_rows: with ``selection.unit == 'micro-batch'``, each run of ``unit_rows`` rows
            (the engine's micro-batch) is selected on its own; None: the step's rows are one
            unit.
        averaged_over: processes whose gradients the engine averages (DDP, accelerate): the
            divisors are divided by it, so the averaged gradient is the global loss's. 1 where
            gradients are summed (the standalone trainer; verl's aggregation scales by its
            data-parallel size itself).
        accumulated: how many batches of this step's kind add up to one optimizer step, each
            divided by its own counts (TRL's micro-batch unit): the loss is divided by it too.
        own_divisor: the engine's own divisor where the core's rule keeps the objective's
            aggregation (:class:`OwnDivisor`), or None (the core's counts).
    """

    process_group: Any = None
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None
    unit_rows: int | None = None
    averaged_over: int = 1
    accumulated: int = 1
    own_divisor: OwnDivisor | None = None

    def __post_init__(self) -> None:
        for name in ("averaged_over", "accumulated"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.unit_rows is not None and (
            isinstance(self.unit_rows, bool) or not isinstance(self.unit_rows, int)
        ):
            raise ValueError(f"unit_rows must be None or an int >= 1, got {self.unit_rows!r}")
        if self.unit_rows is not None and self.unit_rows < 1:
            raise ValueError(f"unit_rows must be None or an int >= 1, got {self.unit_rows!r}")

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` over the engine's processes."""
        if self.reduce_sum is not None:
            return self.reduce_sum(values)
        return dist_utils.all_reduce_sum(values, self.process_group)


@dataclass(frozen=True)
class SelectionOverlap:
    """Tokens in both / either of two selections (global counts); they add over batches."""

    both: float
    either: float

    def __add__(self, other: SelectionOverlap) -> SelectionOverlap:
        return SelectionOverlap(self.both + other.both, self.either + other.either)

    @property
    def jaccard(self) -> float:
        """``both / either`` (0 when neither selected anything)."""
        return self.both / max(self.either, 1.0)


@dataclass(frozen=True)
class SelectionStep:
    """What :func:`selection_step` gives an engine for its loss.

    Attributes:
        selected: ``(B, T)`` bool, the tokens that carry the policy term (within the response
            mask), or None for score 'none' (every valid token).
        counts: the batch's token counts (:meth:`TokenSums.count`), summed over the engine's
            processes.
        denominators: the divisors to pass to ``policy_loss(denominators=...)``; None: the
            batch's own (an engine's own divisor counting its local batch).
        scale: divide the loss by it after the divisors (1.0, or the engine's accumulation).
        threshold: the score threshold (the smallest selected score; the largest for a bottom
            selection; nan if nothing was selected), None without a selection.
        overlap: with the ``compare_with`` score's selection, or None.
        unit_divisor: the divisors are eq. 2's over the selection unit (a selection with
            ``normalize='selected'``): every part of the unit keeps them (:meth:`part`).
        picked: ``(B, T)`` bool, the objective's batch-level pick of each unit (clip-cov,
            kl-cov), which omega used: pass it to ``policy_loss(picked=...)``; None for an
            objective without one.
    """

    selected: torch.Tensor | None
    counts: TokenSums
    denominators: LossDenominators | None
    scale: float = 1.0
    threshold: float | None = None
    overlap: SelectionOverlap | None = None
    unit_divisor: bool = False
    picked: torch.Tensor | None = None

    def part(self, rows: slice, own_divisor: OwnDivisor | None = None) -> SelectionStep:
        """The step restricted to ``rows`` of its batch (one micro-batch of a unit that spans
        several): the same counts, threshold and divisors, except that ``own_divisor`` (the
        engine's divisor of that micro-batch) replaces divisors the core's rule leaves to the
        objective's aggregation."""
        selected = None if self.selected is None else self.selected[rows]
        picked = None if self.picked is None else self.picked[rows]
        denominators, scale = self.denominators, self.scale
        if own_divisor is not None and not self.unit_divisor:
            denominators, scale = _own(own_divisor)
        return replace(
            self, selected=selected, picked=picked, denominators=denominators, scale=scale
        )

    def metrics(self) -> dict[str, float]:
        """``selected_tokens``, ``valid_tokens``, ``selected_fraction`` (global counts), and
        ``score_threshold`` (with a selection) and ``overlap_jaccard`` (when compared)."""
        n, s = self.counts["valid_tokens"], self.counts["selected_tokens"]
        out = {
            "selected_tokens": s,
            "valid_tokens": n,
            "selected_fraction": self.counts.metrics()["selected_fraction"],
        }
        if self.threshold is not None:
            out["score_threshold"] = float(self.threshold)
        if self.overlap is not None:
            out["overlap_jaccard"] = self.overlap.jaccard
        return out


def selection_step(
    loss: LossConfig,
    batch: UpdateBatch,
    *,
    layout: UpdateLayout | None = None,
    step: int = 0,
    compare_with: str | None = None,
) -> SelectionStep:
    """Select the tokens of one update, count them and give the loss's divisors.

    1. the selection (``loss.selection``) of each unit of ``batch``'s rows (the whole batch,
       or each ``layout.unit_rows`` rows when ``selection.unit == 'micro-batch'``), scored with
       ``loss.objective``'s omega (:func:`select_for_update`), global over
       ``layout.process_group``; none for score 'none';
    2. the counts (valid, selected, rows) summed over the engine's processes, once;
    3. the divisors by the core's rule (:meth:`LossConfig.denominators`: eq. 2's selected
       count with ``normalize='selected'``, else the objective's aggregation or, where given,
       the engine's own divisor), divided by ``layout.averaged_over``; the loss's extra
       ``scale`` is ``layout.accumulated`` (or the own divisor's);
    4. with ``compare_with`` (another score), the overlap with the selection that score would
       make under the same settings and inputs (one more score and top-k per unit).

    Args:
        loss: the objective and the selection (``LossConfig.of(objective, selection)``).
        batch: ``(B, T)`` tensors (:class:`UpdateBatch`).
        layout: the engine's update layout (:class:`UpdateLayout`); None: one process, one
            unit, gradients summed.
        step: the optimizer step (seeds the random score).
    """
    if not isinstance(loss, LossConfig):
        raise ValueError(f"loss must be a LossConfig, got {type(loss).__name__}")
    if not isinstance(batch, UpdateBatch):
        raise ValueError(f"batch must be an UpdateBatch, got {type(batch).__name__}")
    layout = UpdateLayout() if layout is None else layout
    selection = loss.selection
    selected, compared, threshold, picked = None, None, None, None
    if selection.enabled or get_objective(loss.objective.name).picks is not None:
        selected, compared, threshold, picked = _select_units(
            loss, batch, layout, step, compare_with
        )
    mask = batch.response_mask.bool()
    counts = TokenSums.count(mask, selected).reduced(layout.reduce)
    eq2 = selected is not None and selection.normalize == "selected"
    if layout.own_divisor is not None and not eq2:
        denominators, scale = _own(layout.own_divisor)
    else:
        denominators = loss.denominators(counts, mask=mask, group_ids=batch.group_ids)
        denominators = _averaged(denominators, layout.averaged_over)
        scale = float(layout.accumulated)
    overlap = None
    if compared is not None:
        both_either = torch.stack([(selected & compared).sum(), (selected | compared).sum()])
        both, either = layout.reduce(both_either.double()).tolist()
        overlap = SelectionOverlap(both, either)
    return SelectionStep(
        selected=selected,
        counts=counts,
        denominators=denominators,
        scale=scale,
        threshold=threshold,
        overlap=overlap,
        unit_divisor=eq2,
        picked=picked,
    )


def _select_units(
    loss: LossConfig,
    batch: UpdateBatch,
    layout: UpdateLayout,
    step: int,
    compare_with: str | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, float | None, torch.Tensor | None]:
    """``(selected, compared, threshold, picked)``: each unit of ``batch``'s rows selected
    (and the objective's batch-level pick made) on its own (:func:`select_for_update`), the
    masks ``(B, T)`` concatenated; the selection's are None for score 'none'."""
    selection = loss.selection
    parts, others, thresholds, picks = [], [], [], []
    for rows in _units(selection, batch.num_rows, layout.unit_rows):
        unit = batch if rows is None else batch.rows(rows)
        result = select_for_update(
            selection,
            loss.objective,
            logprobs=unit.logprobs,
            old_logprobs=unit.old_logprobs,
            advantages=unit.advantages,
            response_mask=unit.response_mask,
            entropy=unit.entropy,
            ref_logprobs=unit.ref_logprobs,
            logit_grad_norm=unit.logit_grad_norm,
            group_ids=unit.group_ids,
            process_group=layout.process_group,
            step=step,
            importance_weights=unit.importance_weights,
            compare_with=compare_with,
        )
        parts.append(result.selected)
        others.append(result.compared)
        thresholds.append(result.threshold)
        picks.append(result.picked)
    picked = _joined(picks)
    if not selection.enabled:
        return None, None, None, picked
    compared = _joined(others) if compare_with is not None else None
    return _joined(parts), compared, _threshold(thresholds, selection.largest), picked


def _joined(masks: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The units' ``(B_u, T)`` masks as one ``(B, T)`` (None when the units have none)."""
    if masks[0] is None:
        return None
    return masks[0] if len(masks) == 1 else torch.cat(masks)  # (B, T)


def _units(selection: SelectionConfig, num_rows: int, unit_rows: int | None) -> list[slice | None]:
    """The row slices selected on their own (None: the whole batch, one unit)."""
    if selection.unit != "micro-batch" or unit_rows is None:
        return [None]
    return [
        slice(start, min(start + unit_rows, num_rows)) for start in range(0, num_rows, unit_rows)
    ]


def _own(own: OwnDivisor) -> tuple[LossDenominators | None, float]:
    divisor = None if own.divisor is None else LossDenominators(own.divisor, own.divisor)
    return divisor, float(own.scale)


def _averaged(denominators: LossDenominators, processes: int) -> LossDenominators:
    """The divisors of a loss whose gradients the engine averages over ``processes``."""
    if processes == 1:
        return denominators
    groups = denominators.group_divisors
    return LossDenominators(
        denominators.policy / processes,
        denominators.kl / processes,
        group_ids=denominators.group_ids,
        group_divisors=None if groups is None else groups / processes,
    )


def _threshold(thresholds: list[float], largest: bool) -> float:
    """The threshold of several units' selections: the smallest (largest for a bottom
    selection) of their thresholds; nan when none selected anything."""
    found = [t for t in thresholds if not math.isnan(t)]
    if not found:
        return math.nan
    return min(found) if largest else max(found)
