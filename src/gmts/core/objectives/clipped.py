"""Objectives whose policy term is a function of the importance ratio: PPO's clip, SAPO's soft
gate, and GMPO's clipped geometric mean.

Notation: ``r`` the importance ratio at ``ratio_level`` (:mod:`.ratio`), ``A`` the advantage,
``w`` the importance weights (1 without), ``I`` the clip indicator (1 where the policy gradient
flows). omega of a ratio objective ``s = w f(r)`` is ``w f'(r) r`` per token at the token levels
and ``s_i mean_{t in M_i}(w f'(s_i))`` at the sequence level (:meth:`Ratio.coefficient`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from gmts.core.objectives.inputs import ObjectiveInputs, Surrogate
from gmts.core.objectives.ratio import Ratio
from gmts.core.objectives.registry import Objective, register_objective

if TYPE_CHECKING:
    from gmts.core.objectives.config import ObjectiveConfig

__all__: list[str] = []


def weights_of(inputs: ObjectiveInputs) -> torch.Tensor | float:
    return 1.0 if inputs.importance_weights is None else inputs.importance_weights


# --------------------------------------------------------------------------------------------
# PPO's clipped surrogate (GRPO, DAPO, Dr.GRPO, dual clip / two-sided clip, GSPO, GSPO-token)


def ppo_masks(
    r: torch.Tensor, adv: torch.Tensor, config: ObjectiveConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boolean ``(B, T)`` masks ``(clipped_low, clipped_high, dual_clipped)``: where the policy
    gradient is zero because r fell below 1 - clip_low with A < 0, rose above 1 + clip_high
    with A > 0, or rose above the dual-clip constant with A < 0 (any A != 0 with
    ``dual_clip_all_signs``). Strict inequalities: on a boundary the clip is not active
    (torch.clamp passes the gradient there)."""
    low = (adv < 0) & (r < 1 - config.clip_low)
    high = (adv > 0) & (r > 1 + config.clip_high)
    if config.dual_clip is not None:
        negative_cap, positive_cap = _dual_caps(config)
        dual = ((adv < 0) & (r > negative_cap)) | ((adv > 0) & (r > positive_cap))
    else:
        dual = torch.zeros_like(low)
    return low, high, dual


def _dual_caps(config: ObjectiveConfig) -> tuple[float, float]:
    """The ratio above which the dual clip removes the gradient, for A < 0 and for A > 0.

    verl's clip_ratio_c (A < 0 only): c and inf. TRL's delta clamps coef_1 = r at c before
    min(coef_1 A, clip(r) A): for A > 0 that caps r at c; for A < 0 the min keeps clip(r) A
    until r exceeds 1 + clip_high, so the cap is max(c, 1 + clip_high)."""
    c = float(config.dual_clip)  # type: ignore[arg-type]
    if not config.dual_clip_all_signs:
        return c, math.inf
    return max(c, 1 + config.clip_high), c


def ppo_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    r, adv = ratio.value, inputs.advantages
    low, high, dual = ppo_masks(ratio.detached, adv, config)
    active = ~(low | high | dual)
    # the value of the clipped branch, a constant: min(rA, clip(r)A), bounded by c A (for
    # A > 0 under dual_clip_all_signs: min(c, clip(r)) A)
    const = ratio.detached.clamp(1 - config.clip_low, 1 + config.clip_high)
    if config.dual_clip is not None:
        negative_cap, positive_cap = _dual_caps(config)
        cap = torch.where(
            adv > 0,
            torch.minimum(torch.full_like(const, positive_cap), const),
            torch.full_like(const, negative_cap),
        )
        const = torch.where(dual, cap, const)
    s = torch.where(active, r * adv, const * adv) * weights_of(inputs)
    return Surrogate(s, low, high, dual)


def _ppo_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    low, high, dual = ppo_masks(ratio.detached, inputs.advantages, config)
    g = inputs.advantages * ~(low | high | dual) * weights_of(inputs)  # w df/dr
    return ratio.coefficient(inputs, g)


register_objective(
    Objective(
        "ppo",
        ppo_surrogate,
        _ppo_omega,
        params=frozenset({"clip_low", "clip_high", "dual_clip", "dual_clip_all_signs"}),
        ratio_levels=("token", "sequence", "sequence-token"),
        formula="w r A I(r, A); I = 0 where the clip (or dual clip) removed the gradient",
        engines=(
            "TRL loss_type grpo / bnpo / dr_grpo / dapo / luspo (delta = dual_clip; "
            "importance_sampling_level='sequence' = ratio_level sequence, GSPO); verl "
            "loss_mode vanilla (clip_ratio_c = dual_clip) and gspo (ratio_level "
            "sequence-token)"
        ),
    )
)


# --------------------------------------------------------------------------------------------
# SAPO: a soft gate instead of the clip


def _sapo_gate(
    r: torch.Tensor, adv: torch.Tensor, config: ObjectiveConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sigma, tau)``: sigma = sigmoid(tau (r - 1)), tau = tau_pos for A > 0 else tau_neg."""
    tau = torch.where(
        adv > 0,
        torch.as_tensor(config.sapo_tau_pos, dtype=r.dtype, device=r.device),
        torch.as_tensor(config.sapo_tau_neg, dtype=r.dtype, device=r.device),
    )
    return torch.sigmoid(tau * (r - 1)), tau


def _sapo_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    sigma, tau = _sapo_gate(ratio.value, inputs.advantages, config)
    s = sigma * (4.0 / tau) * inputs.advantages * weights_of(inputs)
    return Surrogate.unclipped(s)


def _sapo_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    sigma, _ = _sapo_gate(ratio.detached, inputs.advantages, config)
    g = 4.0 * sigma * (1 - sigma) * inputs.advantages * weights_of(inputs)
    return ratio.coefficient(inputs, g)


register_objective(
    Objective(
        "sapo",
        _sapo_surrogate,
        _sapo_omega,
        params=frozenset({"sapo_tau_pos", "sapo_tau_neg"}),
        ratio_levels=("token", "sequence", "sequence-token"),
        formula="w A 4 sigma (1 - sigma) r, sigma = sigmoid(tau (r - 1)), tau by the sign of A",
        engines="TRL loss_type sapo (sapo_temperature_pos/neg); verl loss_mode sapo (tau_pos/neg)",
    )
)


# --------------------------------------------------------------------------------------------
# GMPO (verl geo_mean): the geometric mean of token ratios clipped in log space

_GMPO_EPS = 1e-8  # verl divides by |o_i| + 1e-8
_GMPO_WEIGHT_EPS = 1e-10  # verl takes log(w + 1e-10) for the per-row geometric-mean weight


def _gmpo_parts(
    inputs: ObjectiveInputs, config: ObjectiveConfig, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(row value A_i R_i W_i (B,), x_min (B, T), low (B, T), high (B, T), denominator (B,))``."""
    adv, mask = inputs.advantages, inputs.mask
    sign = torch.sign(adv)
    clamped = torch.clamp(x, -config.clip_low, config.clip_high)
    x_min = sign * torch.min(sign * x, sign * clamped)  # (B, T)
    denominator = inputs.lengths + _GMPO_EPS  # (B,)
    zero = torch.zeros_like(x)
    ratio = torch.exp(torch.where(mask, x_min, zero).sum(-1) / denominator)  # (B,)
    row_adv = torch.where(mask, adv, zero).sum(-1) / denominator  # (B,)
    value = row_adv * ratio
    if inputs.importance_weights is not None:
        log_w = torch.log(inputs.importance_weights + _GMPO_WEIGHT_EPS)
        value = value * torch.exp(torch.where(mask, log_w, zero).sum(-1) / denominator)
    xd = x.detach()
    low = (adv < 0) & (xd < -config.clip_low)
    high = (adv > 0) & (xd > config.clip_high)
    return value, x_min, low, high, denominator


def _gmpo_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    x = inputs.logprobs - inputs.old_logprobs
    value, _, low, high, _ = _gmpo_parts(inputs, config, x)
    s = value[:, None].expand_as(x)  # every token of a row carries the row's term
    return Surrogate(s, low, high, torch.zeros_like(low))


def _gmpo_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    x = inputs.logprobs - inputs.old_logprobs
    value, _, low, high, denominator = _gmpo_parts(inputs, config, x)
    flows = ~(low | high) & (inputs.advantages != 0)  # d x_min / d x
    # d/dlog pi_t sum_{t' in M_i} value_i = |o_i| value_i * flows_t / (|o_i| + eps)
    scale = value * inputs.lengths / denominator  # (B,)
    return scale[:, None] * flows


register_objective(
    Objective(
        "gmpo",
        _gmpo_surrogate,
        _gmpo_omega,
        params=frozenset({"clip_low", "clip_high"}),
        ratio_levels=("token",),
        formula=(
            "W_i A_i R_i I_t: R_i = exp(mean_t clip_log(x_t)) the row's geometric-mean ratio "
            "(x = log r clipped to [-clip_low, clip_high] by the sign of A), A_i the row's mean "
            "advantage, W_i the geometric mean of its weights; shared by the row up to I_t"
        ),
        engines="verl loss_mode geo_mean (GMPO; clip_ratio_low/high are log-space bounds)",
    )
)
