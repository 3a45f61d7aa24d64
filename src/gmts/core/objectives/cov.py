"""Clip-Cov and KL-Cov (arXiv 2505.22617): objectives that treat a few tokens apart, picked by
the covariance of advantage and log-prob over the whole batch, as verl 0.9.1's
``compute_policy_loss_clip_cov`` and ``compute_policy_loss_kl_cov`` do.

With ``x = log pi - log pi_old``, ``r = exp(x)``, ``w`` the importance weights and, over the
batch's valid tokens M (``N = |M|``), the centred covariance term

    c_t = (A_t - mean_M A) * (log pi_t - mean_M log pi)

- **clip-cov**: PPO's clipped term ``min(r A, clip(r) A)`` (``clip_low``, ``clip_high``), except
  at the picked tokens, whose term (and gradient) is 0. Candidates: valid tokens that PPO's clip
  left alone (``-A clip(r) > -A r`` is false) with ``clip_cov_lb < c_t < clip_cov_ub``; picked:
  ``min(max(1, int(clip_cov_ratio * N)), |candidates|)`` of them drawn uniformly without
  replacement (``torch.randperm`` over the candidates in row-major order, from a CPU generator
  seeded with the pick's seed: verl draws from the global RNG, so after
  ``torch.manual_seed(seed)`` verl draws exactly these). The means are verl's
  ``masked_mean``: ``sum_M / (N + 1e-8)``, the divisor in float32 as verl's.
  omega = ``w r A I(r, A) (1 - picked)``.
- **kl-cov**: the unclipped ``r A``, minus ``kl_cov_coef * |x|`` at the picked tokens (verl's
  ``ppo_kl_coef``), all times ``w``. Picked: the ``max(1, int(N * kl_cov_ratio))`` tokens of
  largest ``c_t`` (means: plain means over M; ties to the earliest in row-major order, where
  verl's ``torch.topk`` breaks them arbitrarily). omega = ``w (r A - kl_cov_coef sign(x)
  picked)`` (``sign(0) = 0``, as ``torch.abs``'s gradient at 0).

Over ranks the pick is global: the means over every rank's tokens, the count from the global
N, the draw over the global candidates (one permutation, the same on every rank) and the top-k
over the global batch: equal to the single-process pick of the ranks' batches concatenated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gmts.core import distributed as dist_utils
from gmts.core.objectives.clipped import ppo_masks, ppo_surrogate, weights_of
from gmts.core.objectives.inputs import ObjectiveInputs, Surrogate
from gmts.core.objectives.ratio import Ratio
from gmts.core.objectives.registry import Objective, register_objective
from gmts.core.selection import select_top_count

if TYPE_CHECKING:
    from gmts.core.objectives.config import ObjectiveConfig

__all__: list[str] = []


def _picked(inputs: ObjectiveInputs) -> torch.Tensor:
    """``(B, T)`` bool pick (filled by the registry before any surrogate or omega runs)."""
    assert inputs.picked is not None, "objective_terms / gradient_coefficient fill the pick"
    return inputs.picked


def _global_count(mask: torch.Tensor, process_group: Any) -> int:
    return int(dist_utils.all_reduce_sum(torch.count_nonzero(mask).reshape(1), process_group))


def _global_sum(values: torch.Tensor, mask: torch.Tensor, process_group: Any) -> torch.Tensor:
    """``sum_M values`` over every rank, a 0-d tensor in the dtype of ``values``."""
    local = torch.where(mask, values, torch.zeros_like(values)).sum()
    return dist_utils.all_reduce_sum(local.reshape(1), process_group)[0]


def _centred_covariance(
    inputs: ObjectiveInputs, divisor: torch.Tensor | int, process_group: Any
) -> torch.Tensor:
    """``(B, T)`` ``c_t = (A - sum_M A / divisor) (log pi - sum_M log pi / divisor)``."""
    mask, adv, logprobs = inputs.mask, inputs.advantages, inputs.logprobs.detach()
    mean_adv = _global_sum(adv, mask, process_group) / divisor
    mean_logprob = _global_sum(logprobs, mask, process_group) / divisor
    return (adv - mean_adv) * (logprobs - mean_logprob)  # (B, T)


def _draw(candidates: torch.Tensor, k: int, seed: int, process_group: Any) -> torch.Tensor:
    """``(B, T)`` bool: ``min(k, n)`` of the ``n`` global candidates, uniformly without
    replacement: the first ``k`` of ``torch.randperm(n)`` (a CPU generator seeded with
    ``seed``, the same on every rank) over the candidates in global row-major order."""
    flat = candidates.reshape(-1)
    n_local = torch.count_nonzero(flat).reshape(1)
    counts = dist_utils.all_gather_stack(n_local, process_group).reshape(-1).tolist()  # (W,)
    rank = dist_utils.get_rank(process_group) if dist_utils.is_distributed(process_group) else 0
    offset, total = sum(counts[:rank]), sum(counts)
    picked = torch.zeros_like(flat)
    take = min(k, total)
    if take == 0:
        return picked.view_as(candidates)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:take]
    mine = order[(order >= offset) & (order < offset + counts[rank])] - offset
    where = flat.nonzero().squeeze(1)  # (n_local,) flat indices in row-major order
    picked[where[mine.to(where.device)]] = True
    return picked.view_as(candidates)


# --------------------------------------------------------------------------------------------
# clip-cov


def _clip_cov_picks(
    inputs: ObjectiveInputs, config: ObjectiveConfig, seed: int, process_group: Any
) -> torch.Tensor:
    mask, adv = inputs.mask, inputs.advantages
    r = torch.exp(inputs.logprobs.detach() - inputs.old_logprobs)
    # verl's clip_by_origin: the tokens PPO's clip already removed
    clipped = (-adv * r.clamp(1 - config.clip_low, 1 + config.clip_high)) > (-adv * r)
    n = _global_count(mask, process_group)
    divisor = torch.tensor(n) + 1e-8  # verl's masked_mean: float32 divisor
    cov = _centred_covariance(inputs, divisor.to(inputs.logprobs.device), process_group)
    candidates = mask & ~clipped & (cov < config.clip_cov_ub) & (cov > config.clip_cov_lb)
    k = max(int(config.clip_cov_ratio * n), 1)
    return _draw(candidates, k, seed, process_group)


def _clip_cov_surrogate(
    inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio
) -> Surrogate:
    ppo = ppo_surrogate(inputs, config, ratio)
    kept = (~_picked(inputs)).to(ppo.value.dtype)
    return Surrogate(ppo.value * kept, ppo.clipped_low, ppo.clipped_high, ppo.dual_clipped)


def _clip_cov_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    low, high, _ = ppo_masks(ratio.detached, inputs.advantages, config)
    flows = ~(low | high | _picked(inputs))
    return ratio.coefficient(inputs, inputs.advantages * flows * weights_of(inputs))


register_objective(
    Objective(
        "clip-cov",
        _clip_cov_surrogate,
        _clip_cov_omega,
        params=frozenset({"clip_low", "clip_high", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"}),
        formula=(
            "w r A I(r, A) (1 - picked): picked = a random clip_cov_ratio of the tokens PPO's "
            "clip left whose centred covariance of A and log pi lies in (clip_cov_lb, "
            "clip_cov_ub); their term is 0"
        ),
        engines="verl loss_mode clip_cov (clip_ratio_low/high, policy_loss.clip_cov_*)",
        picks=_clip_cov_picks,
    )
)


# --------------------------------------------------------------------------------------------
# kl-cov


def _kl_cov_picks(
    inputs: ObjectiveInputs, config: ObjectiveConfig, seed: int, process_group: Any
) -> torch.Tensor:
    mask = inputs.mask
    n = _global_count(mask, process_group)
    if n == 0:
        return torch.zeros_like(mask)
    cov = _centred_covariance(inputs, n, process_group)
    k = max(1, int(n * config.kl_cov_ratio))
    return select_top_count(cov, mask, k, process_group=process_group)


def _kl_cov_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    log_ratio = inputs.logprobs - inputs.old_logprobs  # verl's negative_approx_kl, unclamped
    penalty = config.kl_cov_coef * log_ratio.abs() * _picked(inputs)
    return Surrogate.unclipped((ratio.value * inputs.advantages - penalty) * weights_of(inputs))


def _kl_cov_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    w = weights_of(inputs)
    sign = torch.sign(inputs.logprobs - inputs.old_logprobs)
    return ratio.coefficient(inputs, inputs.advantages * w) - (
        config.kl_cov_coef * sign * _picked(inputs) * w
    )


register_objective(
    Objective(
        "kl-cov",
        _kl_cov_surrogate,
        _kl_cov_omega,
        params=frozenset({"kl_cov_ratio", "kl_cov_coef"}),
        formula=(
            "w (r A - kl_cov_coef sign(log r) picked): picked = the kl_cov_ratio of the tokens "
            "of largest centred covariance of A and log pi; no clip"
        ),
        engines="verl loss_mode kl_cov (policy_loss.kl_cov_ratio, ppo_kl_coef)",
        picks=_kl_cov_picks,
    )
)
