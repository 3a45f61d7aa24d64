"""select_for_update: the one selection step shared by the trainer and the integrations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gmts.core import distributed as dist_utils
from gmts.core.config import SelectionConfig
from gmts.core.loss import applied_aggregation
from gmts.core.objectives import ObjectiveConfig, gradient_coefficient
from gmts.core.scores import ScoreInputs, available_scores, compute_scores, score_requirements
from gmts.core.selection import select_tokens, selection_threshold

__all__ = ["SelectionResult", "select_for_update"]

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
    """

    selected: torch.Tensor | None
    scores: torch.Tensor | None
    threshold: float | None
    compared: torch.Tensor | None = None


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
) -> SelectionResult:
    """Score the tokens with ``config.score`` and select the top (or bottom) ``config.ratio``.

    omega is computed from the current ``logprobs`` (detached) with ``objective`` (its terms,
    KL and importance weights: :func:`gmts.gradient_coefficient`, by ``config.omega``'s method),
    so it is exactly the gradient coefficient of the loss that :func:`gmts.policy_loss` will
    compute with the same objective and weights (times the aggregation's per-token weight with
    ``config.omega_weighting``). Only the inputs the score needs
    (:func:`gmts.score_requirements`) are read; a missing one raises ValueError. With
    ``config.zero_scores == "skip"`` and ``config.largest`` a selected token whose score is
    exactly 0 is dropped from the selection (it carries no policy gradient and fills the count
    only); a bottom selection (``largest=False``) keeps them (docs/semantics.md section 4).

    This selects over exactly the rows it is given: a caller with ``config.unit ==
    "micro-batch"`` calls it once per micro-batch.

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
    """
    if not isinstance(config, SelectionConfig):
        raise ValueError(f"config must be a SelectionConfig, got {type(config).__name__}")
    if not isinstance(objective, ObjectiveConfig):
        raise ValueError(f"objective must be an ObjectiveConfig, got {type(objective).__name__}")
    if compare_with is not None and compare_with not in available_scores():
        raise ValueError(f"compare_with must be one of {available_scores()}, got {compare_with!r}")
    if not config.enabled:
        return SelectionResult(selected=None, scores=None, threshold=None)
    needs = score_requirements(config.score)
    if compare_with is not None:
        needs = needs | score_requirements(compare_with)
    omega = None
    if "omega" in needs:
        omega = gradient_coefficient(
            objective,
            logprobs.detach(),
            old_logprobs,
            advantages,
            response_mask,
            ref_logprobs=ref_logprobs if objective.kl_coef > 0 else None,
            importance_weights=importance_weights,
            method=config.omega,
        )
        if config.omega_weighting:  # the weight of the aggregation the loss applies
            aggregation = applied_aggregation(objective, config.normalize, selection=True)
            weights = aggregation.token_weights(response_mask.bool())
            omega = omega * weights.to(omega.dtype)  # (B, T)
    seed = config.seed + step
    if dist_utils.is_distributed(process_group):
        seed += _RANK_SEED_STRIDE * dist_utils.get_rank(process_group)
    inputs = ScoreInputs(
        entropy=entropy.detach() if entropy is not None and "entropy" in needs else None,
        omega=omega,
        logit_grad_norm=(
            logit_grad_norm.detach()
            if logit_grad_norm is not None and "logit_grad_norm" in needs
            else None
        ),
        mask=response_mask,
        seed=seed,
    )
    scores = compute_scores(config.score, inputs)
    selected = _top(config, scores, response_mask, group_ids, process_group)
    threshold = selection_threshold(
        scores, selected, largest=config.largest, process_group=process_group
    )
    compared = None
    if compare_with is not None:
        other = compute_scores(compare_with, inputs)
        compared = _top(config, other, response_mask, group_ids, process_group)
    return SelectionResult(selected=selected, scores=scores, threshold=threshold, compared=compared)


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
