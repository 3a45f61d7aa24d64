"""Objectives of the form ``s = c * A * log pi`` (or close to it) with a detached coefficient c:
CISPO, GPG, DPPO (TV and binary-KL trust regions), DRO and VESPO.

Their policy gradient flows through ``log pi`` itself, never through a ratio, so omega is the
coefficient c times A (DRO adds its quadratic penalty's derivative), token by token; the
weights, masks and clips that shape c are computed without gradient, exactly as the engines do.
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


def _weights(inputs: ObjectiveInputs) -> torch.Tensor | float:
    return 1.0 if inputs.importance_weights is None else inputs.importance_weights


def _none(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(like.shape, dtype=torch.bool, device=like.device)


# --------------------------------------------------------------------------------------------
# CISPO: a clipped, stop-gradient importance weight times A times log pi


def _cispo_coefficient(
    inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = ratio.detached
    clipped = r.clamp(1 - config.clip_low, 1 + config.clip_high)
    return clipped * _weights(inputs), r < 1 - config.clip_low, r > 1 + config.clip_high


def _cispo_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    c, low, high = _cispo_coefficient(inputs, config, ratio)
    return Surrogate(c * inputs.advantages * inputs.logprobs, low, high, _none(low))


def _cispo_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    c, _, _ = _cispo_coefficient(inputs, config, ratio)
    return c * inputs.advantages


register_objective(
    Objective(
        "cispo",
        _cispo_surrogate,
        _cispo_omega,
        params=frozenset({"clip_low", "clip_high"}),
        ratio_levels=("token", "sequence"),
        formula="w clip(r, 1 - clip_low, 1 + clip_high) A (the clip bounds the weight; never 0)",
        engines=(
            "TRL loss_type cispo (clamp(r, max=epsilon_high): clip_low = 1, clip_high = "
            "epsilon_high - 1); verl loss_mode cispo (clip_ratio_low/high)"
        ),
    )
)


# --------------------------------------------------------------------------------------------
# GPG: plain policy gradient, A log pi


def _gpg_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    return Surrogate.unclipped(inputs.advantages * inputs.logprobs * _weights(inputs))


def _gpg_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    return inputs.advantages * _weights(inputs)


register_objective(
    Objective(
        "gpg",
        _gpg_surrogate,
        _gpg_omega,
        params=frozenset(),
        formula="w A",
        engines="verl loss_mode gpg",
    )
)


# --------------------------------------------------------------------------------------------
# DPPO: truncated IS weight times A log pi inside a divergence trust region


def _dppo_surrogate_of(valid_fn):  # type: ignore[no-untyped-def]
    def coefficient(
        inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = ratio.detached
        truncated = r if config.ratio_cap is None else r.clamp(max=config.ratio_cap)
        lp, old = inputs.logprobs.detach(), inputs.old_logprobs
        adv = inputs.advantages
        valid = valid_fn(lp, old, adv, config)  # (B, T) bool
        c = truncated * valid * _weights(inputs)
        return c, ~valid & (adv <= 0), ~valid & (adv > 0)

    def surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
        c, low, high = coefficient(inputs, config, ratio)
        return Surrogate(c * inputs.advantages * inputs.logprobs, low, high, _none(low))

    def omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
        c, _, _ = coefficient(inputs, config, ratio)
        return c * inputs.advantages

    return surrogate, omega


def _tv_valid(lp, old, adv, config):  # type: ignore[no-untyped-def]
    diff = torch.exp(lp) - torch.exp(old)
    return torch.where(adv > 0, diff <= config.clip_high, diff >= -config.clip_low)


def _binary_kl_valid(lp, old, adv, config):  # type: ignore[no-untyped-def]
    prob, old_prob = torch.exp(lp), torch.exp(old)
    binary_kl = old_prob * (old - lp) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    positive = (binary_kl <= config.clip_high) | (prob <= old_prob)
    negative = (binary_kl <= config.clip_low) | (prob >= old_prob)
    return torch.where(adv > 0, positive, negative)


for _name, _valid, _formula in (
    ("dppo-tv", _tv_valid, "w min(r, ratio_cap) A V; V = 0 outside the TV trust region"),
    ("dppo-kl", _binary_kl_valid, "w min(r, ratio_cap) A V; V = 0 outside the binary-KL region"),
):
    _surrogate, _omega = _dppo_surrogate_of(_valid)
    register_objective(
        Objective(
            _name,
            _surrogate,
            _omega,
            params=frozenset({"clip_low", "clip_high", "ratio_cap"}),
            formula=_formula,
            engines=(
                f"verl loss_mode {_name.replace('-', '_')} (clip_ratio_low/high: the "
                "divergence thresholds; clip_ratio_c: ratio_cap)"
            ),
        )
    )


# --------------------------------------------------------------------------------------------
# DRO: A log pi with a quadratic log-ratio penalty


def _dro_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    lp = inputs.logprobs
    log_ratio = lp - inputs.old_logprobs
    s = (lp * inputs.advantages - 0.5 * config.dro_beta * log_ratio * log_ratio) * _weights(inputs)
    return Surrogate.unclipped(s)


def _dro_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    log_ratio = inputs.logprobs - inputs.old_logprobs
    return (inputs.advantages - config.dro_beta * log_ratio) * _weights(inputs)


register_objective(
    Objective(
        "dro",
        _dro_surrogate,
        _dro_omega,
        params=frozenset({"dro_beta"}),
        formula="w (A - dro_beta log r)",
        engines="verl loss_mode dro (policy_loss.dro_beta)",
    )
)


# --------------------------------------------------------------------------------------------
# VESPO: a gamma-shaped weight of the sequence's importance ratio times A log pi

_LOG_MIN = math.log(1e-8)  # TRL's lower clamp of the log weights


def _clamped_log(weight: float) -> float:
    """``clamp(log weight, log 1e-8, 20)`` of one weight >= 0 (log 0 = -inf clamps to log 1e-8)."""
    return min(max(math.log(weight), _LOG_MIN), 20.0) if weight > 0 else _LOG_MIN


def _vespo_phi(inputs: ObjectiveInputs, config: ObjectiveConfig) -> torch.Tensor:
    """``(B, T)`` phi(w_seq) = exp(lambda + k log w - lambda w), detached; k and lambda by the
    sign of A (A >= 0: the positive pair). w_seq = prod_t r_t (times the importance weights),
    each log clamped as TRL clamps it; with ``vespo_padding_weight`` != 1, times that weight
    once per position outside the mask (TRL 1.16's sum over every position)."""
    with torch.no_grad():
        mask = inputs.mask
        zero = torch.zeros_like(inputs.logprobs)
        log_ratio = (inputs.logprobs.detach() - inputs.old_logprobs).clamp(-20.0, 20.0)
        seq = torch.where(mask, log_ratio, zero).sum(-1)  # (B,)
        if inputs.importance_weights is not None:
            log_w = torch.log(inputs.importance_weights).clamp(_LOG_MIN, 20.0)
            seq = seq + torch.where(mask, log_w, zero).sum(-1)
        if config.vespo_padding_weight != 1.0:
            outside = (~mask).sum(-1).to(seq.dtype)  # (B,) positions outside the mask
            seq = seq + outside * _clamped_log(config.vespo_padding_weight)
        log_w_seq = seq.clamp(_LOG_MIN, 20.0)[:, None]  # (B, 1)
        nonneg = inputs.advantages >= 0  # (B, T)
        k = torch.where(nonneg, config.vespo_k_pos, config.vespo_k_neg)
        lam = torch.where(nonneg, config.vespo_lambda_pos, config.vespo_lambda_neg).clamp(min=1e-4)
        log_phi = lam + k * log_w_seq - lam * torch.exp(log_w_seq)
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _vespo_surrogate(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> Surrogate:
    phi = _vespo_phi(inputs, config)
    return Surrogate.unclipped(phi * inputs.advantages * inputs.logprobs)


def _vespo_omega(inputs: ObjectiveInputs, config: ObjectiveConfig, ratio: Ratio) -> torch.Tensor:
    return _vespo_phi(inputs, config) * inputs.advantages


register_objective(
    Objective(
        "vespo",
        _vespo_surrogate,
        _vespo_omega,
        params=frozenset(
            {
                "vespo_k_pos",
                "vespo_lambda_pos",
                "vespo_k_neg",
                "vespo_lambda_neg",
                "vespo_padding_weight",
            }
        ),
        # its own weight reads the token ratios; ratio_level is the KL correction's ratio
        ratio_levels=("token", "sequence"),
        formula=(
            "phi_i A, phi_i = exp(lambda + k log w_i - lambda w_i) of the row's ratio w_i "
            "(importance weights folded into w_i, not multiplied)"
        ),
        engines="TRL loss_type vespo (vespo_k_pos/neg, vespo_lambda_pos/neg)",
    )
)
