"""The clipped token objective and its exact gradient coefficient omega.

Per token (all tensors ``(B, T)``), with ``r = exp(logprobs - old_logprobs)``:

    surrogate  s = min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
               s = dual_clip * A        where A < 0 and r > dual_clip  (verl's clip_ratio_c)
    k3 KL      D = rho - log(rho) - 1,  rho = pi_ref / pi_theta = exp(ref_logprobs - logprobs)
               D <- min(D, kl_clamp)    when kl_clamp is set (verl clamps k3 to [-10, 10]; D >= 0)
               D <- r * D               when kl_ratio_correction (TRL's use_bias_correction_kl;
                                        r carries its gradient there, as in TRL 1.16)
    token objective   l = s - kl_coef * D,   token loss = -l

omega = d l / d log pi_theta(o_t) of exactly that l (see :func:`gradient_coefficient`). How the
token losses of a batch become one loss (aggregation, divisors, KL tokens) is
:mod:`gmts.core.loss`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gmts.core._config_utils import from_preset
from gmts.core._config_utils import help_meta as _help
from gmts.core.aggregation import get_aggregation

__all__ = [
    "ObjectiveConfig",
    "OBJECTIVE_PRESETS",
    "TokenObjective",
    "gradient_coefficient",
    "token_objective",
]


# --------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class ObjectiveConfig:
    """Hyperparameters of the clipped token objective (GRPO eq. 1 / DAPO)."""

    clip_low: float = field(
        default=0.2, metadata=_help("PPO lower clip epsilon: r is clipped below at 1 - clip_low.")
    )
    clip_high: float = field(
        default=0.28,
        metadata=_help(
            "PPO upper clip epsilon (DAPO clip-higher): r clipped above at 1 + clip_high."
        ),
    )
    dual_clip: float | None = field(
        default=None,
        metadata=_help(
            "Dual-clip constant c > 1 (verl clip_ratio_c): for A < 0 the token loss is bounded "
            "by -c*A, so tokens with r > c get no policy gradient. None disables it."
        ),
    )
    kl_coef: float = field(
        default=0.0,
        metadata=_help("beta: weight of the k3 KL penalty to the reference policy (0 disables)."),
    )
    kl_ratio_correction: bool = field(
        default=False,
        metadata=_help(
            "Multiply the k3 KL by r = pi/pi_old (with its gradient), as TRL's "
            "use_bias_correction_kl (default True in TRL 1.16)."
        ),
    )
    kl_clamp: float | None = field(
        default=None,
        metadata=_help(
            "Clamp the k3 KL estimate at this value (verl low_var_kl uses 10). None: no clamp "
            "(the paper, TRL). Clamped tokens get no KL gradient."
        ),
    )
    aggregation: str = field(
        default="token-mean",
        metadata=_help(
            "How token losses become the batch loss: token-mean (DAPO), seq-mean-token-mean "
            "(GRPO eq. 1), seq-mean-token-sum, sum."
        ),
    )

    def __post_init__(self) -> None:
        _check_objective_args(
            self.clip_low, self.clip_high, self.dual_clip, self.kl_coef, self.kl_clamp
        )
        try:
            get_aggregation(self.aggregation)
        except ValueError as err:
            raise ValueError(f"aggregation: {err}") from None
        if not isinstance(self.kl_ratio_correction, bool):
            raise ValueError(
                f"kl_ratio_correction must be a bool, got {self.kl_ratio_correction!r}"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ObjectiveConfig:
        """Named presets: ``"grpo"`` (eq. 1: seq-mean-token-mean, k3 KL with beta 0.001) and
        ``"dapo"`` (token-mean, no KL). Both use the paper's clip 0.2 / 0.28 (Appendix A.3)."""
        return from_preset(cls, OBJECTIVE_PRESETS, "objective", name, overrides)

    def omega_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`gradient_coefficient`."""
        kwargs = asdict(self)
        kwargs.pop("aggregation")
        return kwargs


def _check_objective_args(
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    kl_coef: float,
    kl_clamp: float | None,
) -> None:
    for name, value in (("clip_low", clip_low), ("clip_high", clip_high)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if clip_low >= 1:
        raise ValueError(f"clip_low must be < 1 (the lower bound is 1 - clip_low), got {clip_low}")
    if dual_clip is not None and not (
        isinstance(dual_clip, (int, float)) and math.isfinite(dual_clip) and dual_clip > 1
    ):
        raise ValueError(f"dual_clip must be None or a finite number > 1, got {dual_clip!r}")
    if not (isinstance(kl_coef, (int, float)) and math.isfinite(kl_coef) and kl_coef >= 0):
        raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
    if kl_clamp is not None and not (
        isinstance(kl_clamp, (int, float)) and math.isfinite(kl_clamp) and kl_clamp > 0
    ):
        raise ValueError(f"kl_clamp must be None or a finite number > 0, got {kl_clamp!r}")


OBJECTIVE_PRESETS: dict[str, ObjectiveConfig] = {
    "grpo": ObjectiveConfig(
        clip_low=0.2, clip_high=0.28, kl_coef=0.001, aggregation="seq-mean-token-mean"
    ),
    "dapo": ObjectiveConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, aggregation="token-mean"),
}


# --------------------------------------------------------------------------------------------
# token objective and omega


def _broadcast_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    if not isinstance(advantages, torch.Tensor):
        raise ValueError("advantages must be a torch.Tensor of shape (B,) or (B, T)")
    if advantages.dim() == 1 and logprobs.dim() == 2:
        if advantages.shape[0] != logprobs.shape[0]:
            raise ValueError(
                f"advantages of shape (B,) must have B={logprobs.shape[0]}, "
                f"got {tuple(advantages.shape)}"
            )
        return advantages[:, None].expand_as(logprobs)
    if tuple(advantages.shape) != tuple(logprobs.shape):
        raise ValueError(
            f"advantages must have shape (B,) or (B, T) = {tuple(logprobs.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    return advantages


def _check_same_shape(reference: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape {tuple(reference.shape)}")
        if tuple(t.shape) != tuple(reference.shape):
            raise ValueError(
                f"{name} must have the shape of logprobs {tuple(reference.shape)}, "
                f"got {tuple(t.shape)}"
            )


def _check_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    kl_coef: float,
) -> torch.Tensor:
    if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
        raise ValueError("logprobs must be a torch.Tensor of shape (B, T)")
    _check_same_shape(logprobs, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs)
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs (B, T) are required when kl_coef > 0")
    return _broadcast_advantages(advantages, logprobs)


def _clip_masks(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boolean ``(B, T)`` masks ``(clipped_low, clipped_high, dual_clipped)``: where the policy
    gradient is zero because r fell below 1 - clip_low with A < 0, rose above 1 + clip_high with
    A > 0, or rose above the dual-clip constant with A < 0. I(r, A) = 1 elsewhere.

    Strict inequalities: at r == 1 + clip_high exactly the clip is not active (torch.clamp
    passes the gradient on its boundary, so min(rA, clip(r)A) has gradient rA there too).
    """
    low = (adv < 0) & (ratio < 1 - clip_low)
    high = (adv > 0) & (ratio > 1 + clip_high)
    if dual_clip is not None:
        dual = (adv < 0) & (ratio > dual_clip)
    else:
        dual = torch.zeros_like(low)
    return low, high, dual


@dataclass(frozen=True)
class TokenObjective:
    """Per-token parts of the objective ``l = surrogate - kl_coef * kl``; every field ``(B, T)``.

    Attributes:
        surrogate: the clipped surrogate ``s`` (carries the gradient of ``logprobs``).
        kl: the k3 KL estimate ``D`` (zeros without ``ref_logprobs``; carries its gradient).
        clipped_low, clipped_high, dual_clipped: bool masks of the tokens whose policy
            gradient the clip removed (A < 0 and r < 1 - clip_low; A > 0 and r > 1 + clip_high;
            A < 0 and r > dual_clip).
    """

    surrogate: torch.Tensor
    kl: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    dual_clipped: torch.Tensor

    @property
    def clipped(self) -> torch.Tensor:
        """``(B, T)`` bool: the policy gradient is zero because of any clip (I(r, A) = 0)."""
        return self.clipped_low | self.clipped_high | self.dual_clipped


def token_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_ratio_correction: bool = False,
    kl_clamp: float | None = None,
) -> TokenObjective:
    """The per-token surrogate ``s``, KL ``D`` and clip masks; the objective is s - kl_coef*D.

    ``s`` is built with ``torch.where`` on the same conditions as omega, so autograd's gradient
    of ``s - kl_coef * D`` w.r.t. ``logprobs`` equals :func:`gradient_coefficient` everywhere,
    boundaries included. ``D`` is zeros when ``ref_logprobs`` is None.

    Args:
        logprobs, old_logprobs, ref_logprobs: ``(B, T)``. advantages: ``(B,)`` or ``(B, T)``.
    """
    _check_objective_args(clip_low, clip_high, dual_clip, kl_coef, kl_clamp)
    adv = _check_inputs(logprobs, old_logprobs, advantages, ref_logprobs, kl_coef)
    adv = adv.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    low, high, dual = _clip_masks(ratio.detach(), adv, clip_low, clip_high, dual_clip)
    active = ~(low | high | dual)
    const_ratio = ratio.detach().clamp(1 - clip_low, 1 + clip_high)  # value of the clipped branch
    if dual_clip is not None:
        const_ratio = torch.where(dual, torch.full_like(const_ratio, dual_clip), const_ratio)
    surrogate = torch.where(active, ratio * adv, const_ratio * adv)  # (B, T)
    kl = _k3_kl(logprobs, ratio, ref_logprobs, kl_ratio_correction, kl_clamp)
    return TokenObjective(surrogate, kl, low, high, dual)


def _k3_kl(
    logprobs: torch.Tensor,
    ratio: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    kl_ratio_correction: bool,
    kl_clamp: float | None,
) -> torch.Tensor:
    if ref_logprobs is None:
        return torch.zeros_like(logprobs)
    log_rho = ref_logprobs - logprobs  # log(pi_ref / pi)
    kl = torch.exp(log_rho) - log_rho - 1  # (B, T), >= 0
    if kl_clamp is not None:
        # torch.clamp passes the gradient on the boundary; omega matches that (D <= kl_clamp).
        kl = kl.clamp(max=kl_clamp)
    if kl_ratio_correction:
        kl = kl * ratio
    return kl


def gradient_coefficient(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_ratio_correction: bool = False,
    kl_clamp: float | None = None,
) -> torch.Tensor:
    """omega = d l / d log pi_theta(o_t) of the token objective l = s - kl_coef * D.

    Closed form (r = pi/pi_old, rho = pi_ref/pi, D = rho - log rho - 1):

        policy part  r * A * I(r, A)   (0 where clipped or dual-clipped)
        KL part      kl_coef * (rho - 1)            plain k3   (= -kl_coef * dD/dlog pi)
                     kl_coef * r * log(rho)         kl_ratio_correction (d(rD)/dlog pi = -r log rho)
                     with kl_clamp and D > kl_clamp: 0, or -kl_coef * r * kl_clamp with the
                     ratio correction (only r's gradient remains)

    Args:
        logprobs, old_logprobs: ``(B, T)`` log pi_theta and log pi_old of the sampled tokens.
        advantages: ``(B,)`` or ``(B, T)``.
        ref_logprobs: ``(B, T)`` log pi_ref, required when ``kl_coef > 0``.

    Returns:
        omega ``(B, T)`` in the dtype of ``logprobs``, detached (it never carries gradients).
        Aggregation weights (1/|o_i|, 1/S) are not part of omega.
    """
    _check_objective_args(clip_low, clip_high, dual_clip, kl_coef, kl_clamp)
    with torch.no_grad():
        logprobs = logprobs.detach()
        adv = _check_inputs(logprobs, old_logprobs, advantages, ref_logprobs, kl_coef)
        adv = adv.to(logprobs.dtype)
        ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
        low, high, dual = _clip_masks(ratio, adv, clip_low, clip_high, dual_clip)
        omega = torch.where(low | high | dual, torch.zeros_like(ratio), ratio * adv)
        if kl_coef > 0:
            log_rho = ref_logprobs - logprobs
            rho = torch.exp(log_rho)
            d_kl = 1.0 - rho  # dD/dlog pi, (B, T)
            kl = rho - log_rho - 1
            if kl_clamp is not None:
                over = kl > kl_clamp
                d_kl = torch.where(over, torch.zeros_like(d_kl), d_kl)
                kl = kl.clamp(max=kl_clamp)
            if kl_ratio_correction:
                d_kl = ratio * (kl + d_kl)  # product rule: dr/dlog pi = r
            omega = omega - kl_coef * d_kl
    return omega
