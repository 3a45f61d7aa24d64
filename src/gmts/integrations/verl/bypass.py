"""verl's ``bypass_mode`` loss (``old_log_probs`` = the rollout's log-probs) composed with GMTS.

verl's ``compute_policy_loss_bypass_mode`` computes, inside the loss and without gradient,
rollout-correction IS weights and a rejection mask from the current log-probs against the
rollout's (``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``), then runs
PPO's clip (``loss_type=ppo_clip``: vanilla, IS weights not applied) or REINFORCE
(``reinforce``: -A log pi w) on the kept tokens. The batch's own ``rollout_is_weights`` are
ignored. Here the same helper runs on the full mask; the rejections (and, for reinforce, the IS
weights) become per-token weights, which is exact wherever the aggregation has no per-answer
1/|o_i| (verl divides each answer by its count of KEPT tokens there; refused). Each weight
depends only on its token or its row, so the selection knows them exactly from the current
log-probs, except with ``rollout_is_batch_normalize`` (a mean over each micro-batch).
"""

from __future__ import annotations

from typing import Any

import torch

from gmts.core.aggregation import get_aggregation
from gmts.integrations.verl.actor_config import field_of, rollout_correction
from gmts.integrations.verl.terms import MicroBatch

__all__ = ["LOSS_TYPES", "bypass_checks", "bypass_term", "bypass_weights"]

LOSS_TYPES = ("ppo_clip", "reinforce")


def _correction(
    config: Any, logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, Any]]:
    """verl's helper as bypass_mode calls it: ``(IS weights (B, R) or None, kept tokens (B, R)
    0/1 in the dtype of logprobs, metrics)``."""
    from verl.trainer.ppo.rollout_corr_helper import (
        compute_rollout_correction_and_rejection_mask,
    )

    rc = rollout_correction(config)
    with torch.no_grad():
        proto, kept, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=logprobs.detach(),
            rollout_log_prob=rollout_logprobs,
            response_mask=mask,
            rollout_is=rc["rollout_is"],
            rollout_is_threshold=rc["rollout_is_threshold"],
            rollout_is_batch_normalize=rc["rollout_is_batch_normalize"],
            rollout_rs=rc["rollout_rs"],
            rollout_rs_threshold=rc["rollout_rs_threshold"],
        )
    weights = proto.batch["rollout_is_weights"] if proto is not None else None
    return weights, kept.to(logprobs.dtype), metrics


def _reinforce(config: Any) -> bool:
    return rollout_correction(config)["loss_type"] == "reinforce"


def bypass_weights(
    config: Any,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor | None:
    """``(B, R)`` weights bypass_mode's loss applies to the policy term: the rejections (0/1),
    times verl's IS weights for reinforce; None when neither acts. ``rollout_is_weights`` of the
    batch are ignored, as verl does."""
    weights, kept, _ = _correction(config, logprobs, old_logprobs, response_mask)
    if _reinforce(config) and weights is not None:
        return kept * weights.to(kept.dtype)
    return kept if rollout_correction(config)["rollout_rs"] is not None else None


def bypass_term(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's bypass_mode loss on the full mask with the rejected and the unselected tokens'
    loss zeroed (module docstring); verl's metrics and its rollout-correction metrics."""
    from verl.trainer.ppo.core_algos import (
        compute_policy_loss_reinforce,
        compute_policy_loss_vanilla,
    )

    is_weights, kept, rc_metrics = _correction(
        mb.config, mb.log_prob, mb.old_log_prob, mb.response_mask
    )
    weights = mb.keep * kept
    reinforce = _reinforce(mb.config)
    if reinforce and is_weights is not None:
        weights = weights * is_weights.to(weights.dtype)
    mb.config.global_batch_info.update(mb.verl_info(mb.aggregation))
    common = {
        "log_prob": mb.log_prob,
        "advantages": mb.advantages,
        "response_mask": mb.response_mask,
        "loss_agg_mode": mb.aggregation.name,
        "config": mb.config,
        "rollout_is_weights": weights,
    }
    if reinforce:
        pg_loss, metrics = compute_policy_loss_reinforce(rollout_log_prob=mb.old_log_prob, **common)
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(old_log_prob=mb.old_log_prob, **common)
    return pg_loss, {**metrics, **rc_metrics}


def bypass_checks(config: Any, settings: Any) -> list[str]:
    """What bypass_mode with GMTS refuses, each with its reason."""
    rc = rollout_correction(config)
    problems = []
    if rc["loss_type"] not in LOSS_TYPES:
        problems.append(
            f"policy_loss.rollout_correction.loss_type={rc['loss_type']!r}: verl's bypass_mode "
            f"knows {list(LOSS_TYPES)}"
        )
    normalize = settings.selection.normalize
    applied = "token-mean" if normalize == "selected" else field_of(config, "loss_agg_mode")
    row_mean = applied in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum") and (
        get_aggregation(applied).row_mean
    )
    if rc["rollout_rs"] is not None and row_mean:
        problems.append(
            f"bypass_mode with rollout_rs={rc['rollout_rs']!r} and loss_agg_mode={applied} "
            f"(normalize={normalize!r}): verl removes the rejected tokens from the response "
            "mask inside the loss, so each answer is divided by its count of kept tokens "
            "(decided by the current log-probs), while the core divides each answer by its "
            "|o_i|; use normalize='selected' (eq. 2), another loss_agg_mode, or no rollout_rs"
        )
    if bool(rc["rollout_is_batch_normalize"]) and settings.needs_omega:
        problems.append(
            "bypass_mode with rollout_is_batch_normalize=true: verl normalises the IS weights to "
            "mean 1 over each micro-batch inside the loss (all-reduced over ranks for token "
            "weights), and verl forms the micro-batches after the selection, so a token's omega "
            "depends on rows it does not know yet; use score=entropy or random, or no batch "
            "normalisation"
        )
    return problems
