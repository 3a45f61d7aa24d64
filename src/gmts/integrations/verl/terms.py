"""The policy term of one micro-batch with a selection, computed by verl's own loss functions.

The composition rule (every loss mode): verl's function runs on the FULL response mask of the
micro-batch, so whatever it computes over a row or the micro-batch (GSPO's sequence ratio,
GMPO's geometric mean, clip_cov's covariance and draw, kl_cov's top-k, bypass_mode's IS
weights and rejections) is what verl computes without GMTS; the unselected tokens' loss is
zeroed and the sum divided by the core's divisor (``gmts.core.loss.LossConfig``):

- :func:`weighted_term`, for the losses that multiply ``rollout_is_weights`` into the per-token
  loss: a 0/1 factor in those weights;
- :func:`geo_mean_term`: GMPO's row term (shared by every token of the row, its weights taken
  as a geometric mean) scaled through the row's advantages by the row's selected share: the
  core's gmpo with a selection (each selected token carries the row's term);
- :func:`picking_term` (clip_cov, kl_cov): verl's own function (its pick per micro-batch), or,
  when the mini-batch carries a pick made before the selection (an omega score), the core's
  clip-cov / kl-cov terms with that pick (equal to verl's function given the same pick: tested),
  aggregated by verl's ``agg_loss``.

verl is imported inside the functions (the module imports without verl).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gmts.core.aggregation import Aggregation, get_aggregation
from gmts.core.objectives import ObjectiveConfig, ObjectiveInputs, objective_terms

__all__ = ["MicroBatch", "PolicyTermFn", "geo_mean_term", "picking_term", "weighted_term"]


@dataclass(frozen=True)
class MicroBatch:
    """What a loss mode's policy term reads; tensors padded ``(B, R)``.

    Attributes:
        config: verl's ``ActorConfig`` (the term sets its ``global_batch_info``).
        log_prob: current log-probs, with gradient. old_log_prob, advantages: the batch's.
        response_mask: bool, every valid response token (the mask verl's function sees).
        keep: 0/1 in the dtype of ``log_prob``: the selected valid tokens.
        rollout_is_weights: the batch's rollout-correction weights, or None.
        aggregation: the aggregation the core applies (eq. 2's token-mean or the objective's).
        divisor: the core's policy divisor for ``aggregation`` (global over ranks).
        normalize: ``SelectionConfig.normalize`` ('selected' or 'all').
        info: verl's aggregation keywords (dp_size, batch_num_tokens, global_batch_size,
            loss_scale_factor) as the engine set them.
        picked: bool, the batch-level pick of clip_cov / kl_cov made over the mini-batch
            before the selection (``gmts_cov_picked``), or None (verl's function picks).
    """

    config: Any
    log_prob: torch.Tensor
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    keep: torch.Tensor
    rollout_is_weights: torch.Tensor | None
    aggregation: Aggregation
    divisor: float
    normalize: str
    info: dict[str, Any]
    picked: torch.Tensor | None = None

    def verl_info(self, function_aggregation: Aggregation) -> dict[str, Any]:
        """verl's aggregation keywords with the core's divisor in the slot that a verl function
        aggregating by ``function_aggregation`` divides by."""
        if function_aggregation.divisor == "tokens":
            return {**self.info, "batch_num_tokens": self.divisor}
        if function_aggregation.divisor == "rows":
            return {**self.info, "global_batch_size": self.divisor}
        raise ValueError(f"aggregation {function_aggregation.name!r} has no verl counterpart")


PolicyTermFn = Callable[[MicroBatch], tuple[torch.Tensor, dict[str, Any]]]


def weighted_term(verl_name: str, forced_aggregation: str | None = None) -> PolicyTermFn:
    """verl's registered loss ``verl_name`` (one that multiplies ``rollout_is_weights`` into its
    per-token loss) on the full mask, the unselected tokens' loss zeroed through the weights.

    ``forced_aggregation``: the aggregation the function uses whatever it is told (sapo:
    seq-mean-token-mean); when the core's has no per-row 1/|o_i| (eq. 2's token-mean), the
    weights carry |o_i| to undo it, and the core's divisor goes in the row-count slot.
    """

    def term(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Any]]:
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        weights = mb.keep if mb.rollout_is_weights is None else mb.rollout_is_weights * mb.keep
        function_aggregation = get_aggregation(forced_aggregation or mb.aggregation.name)
        if function_aggregation.row_mean and not mb.aggregation.row_mean:
            lengths = mb.response_mask.sum(-1, keepdim=True).to(weights.dtype)  # (B, 1)
            weights = weights * lengths
        elif mb.aggregation.row_mean and not function_aggregation.row_mean:
            raise ValueError(f"verl's {verl_name} cannot aggregate by {mb.aggregation.name}")
        mb.config.global_batch_info.update(mb.verl_info(function_aggregation))
        return get_policy_loss_fn(verl_name)(
            old_log_prob=mb.old_log_prob,
            log_prob=mb.log_prob,
            advantages=mb.advantages,
            response_mask=mb.response_mask,
            loss_agg_mode=function_aggregation.name,
            config=mb.config,
            rollout_is_weights=weights,
        )

    return term


def geo_mean_term(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's geo_mean (GMPO) with row i's advantages scaled by c_i, the sum of the applied
    aggregation's token weights over its selected tokens (|S_i| under eq. 2, |S_i| / |o_i|
    under seq-mean-token-mean).

    GMPO's row term times c_i is the core's gmpo with a selection (every selected token carries
    the row's term); c_i >= 0 keeps the sign of A that GMPO's clip reads, and c_i = 0 leaves the
    row no term and no gradient. verl divides by the micro-batch's row count (``torch.mean``,
    ignoring ``loss_agg_mode`` and verl's global batch info): normalize='all' keeps that;
    eq. 2 (normalize='selected') divides by the core's global S instead.
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    token_weights = mb.aggregation.token_weights(mb.response_mask).to(mb.keep.dtype)  # (B, R)
    share = (mb.keep * token_weights).sum(-1, keepdim=True)  # (B, 1)
    mb.config.global_batch_info.update(mb.info)
    pg_loss, metrics = get_policy_loss_fn("geo_mean")(
        old_log_prob=mb.old_log_prob,
        log_prob=mb.log_prob,
        advantages=mb.advantages * share,
        response_mask=mb.response_mask,
        loss_agg_mode=mb.aggregation.name,
        config=mb.config,
        rollout_is_weights=mb.rollout_is_weights,
    )
    if mb.normalize == "selected":  # undo verl's mean over the micro-batch's rows
        rows = mb.log_prob.shape[0]
        pg_loss = pg_loss * rows / mb.divisor * mb.info.get("dp_size", 1)
    return pg_loss, metrics


def picking_term(verl_name: str, objective: Callable[[Any], ObjectiveConfig]) -> PolicyTermFn:
    """clip_cov / kl_cov: verl's registered ``verl_name`` (:func:`weighted_term`, its own pick
    over each micro-batch) when the micro-batch carries no pick; with ``mb.picked`` (made over
    the mini-batch before an omega score's selection), the per-token loss ``-s`` of the core
    objective ``objective(config)`` with that pick, the unselected tokens' loss zeroed through
    the weights as verl's ``rollout_is_weights`` would be, aggregated by verl's ``agg_loss``.
    """
    own = weighted_term(verl_name)

    def term(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Any]]:
        if mb.picked is None:
            return own(mb)
        from verl.trainer.ppo.core_algos import agg_loss

        weights = mb.keep if mb.rollout_is_weights is None else mb.rollout_is_weights * mb.keep
        inputs = ObjectiveInputs.of(
            mb.log_prob,
            mb.old_log_prob,
            mb.advantages,
            mb.response_mask,
            importance_weights=weights.detach(),
            picked=mb.picked,
        )
        parts = objective_terms(objective(mb.config), inputs)  # (B, R) each
        mb.config.global_batch_info.update(mb.verl_info(mb.aggregation))
        loss = agg_loss(
            loss_mat=-parts.surrogate,
            loss_mask=mb.response_mask,
            loss_agg_mode=mb.aggregation.name,
            **mb.config.global_batch_info,
        )
        valid = mb.response_mask
        log_ratio = (mb.log_prob - mb.old_log_prob).detach()
        metrics = {
            "actor/ppo_kl": float(-log_ratio[valid].mean()) if bool(valid.any()) else 0.0,
            "actor/pg_clipfrac": float(mb.picked[valid].float().mean())
            if bool(valid.any())
            else 0.0,
        }
        return loss, metrics

    return term
