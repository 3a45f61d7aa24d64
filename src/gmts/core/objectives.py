"""The clipped token objective, its exact gradient coefficient omega, and the policy loss.

Per token (all tensors ``(B, T)``), with ``r = exp(logprobs - old_logprobs)``:

    surrogate  s = min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
               s = dual_clip * A        where A < 0 and r > dual_clip  (verl's clip_ratio_c)
    k3 KL      D = rho - log(rho) - 1,  rho = pi_ref / pi_theta = exp(ref_logprobs - logprobs)
               D <- min(D, kl_clamp)    when kl_clamp is set (verl clamps k3 to [-10, 10]; D >= 0)
               D <- r * D               when kl_ratio_correction (TRL's use_bias_correction_kl;
                                        r carries its gradient there, as in TRL 1.16)
    token objective   l = s - kl_coef * D,   token loss = -l

omega = d l / d log pi_theta(o_t) of exactly that l (see :func:`gradient_coefficient`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gmts.core import distributed as dist_utils
from gmts.core._config_utils import check_choice, from_preset
from gmts.core._config_utils import help_meta as _help

__all__ = [
    "AGGREGATIONS",
    "ObjectiveConfig",
    "gradient_coefficient",
    "token_objective",
    "policy_loss",
    "loss_denominator",
]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum")
NORMALIZE_MODES = ("selected", "all")
KL_TOKEN_MODES = ("selected", "all")


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
        check_choice("aggregation", self.aggregation, AGGREGATIONS)
        if not isinstance(self.kl_ratio_correction, bool):
            raise ValueError(
                f"kl_ratio_correction must be a bool, got {self.kl_ratio_correction!r}"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ObjectiveConfig:
        """Named presets: ``"grpo"`` (eq. 1: seq-mean-token-mean, k3 KL with beta 0.001) and
        ``"dapo"`` (token-mean, no KL). Both use the paper's clip 0.2 / 0.28 (Appendix A.3)."""
        return from_preset(cls, OBJECTIVE_PRESETS, "objective", name, overrides)

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`policy_loss` (and, minus aggregation, omega)."""
        return asdict(self)

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


def _surrogate_parts(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean (B, T) masks: ``active`` (I(r, A) = 1, gradient r*A) and ``dual`` (bounded at c*A).

    Strict inequalities: at r == 1 + clip_high exactly the clip is not active (torch.clamp
    passes the gradient on its boundary, so min(rA, clip(r)A) has gradient rA there too).
    """
    clipped = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
    if dual_clip is not None:
        dual = (adv < 0) & (ratio > dual_clip)
    else:
        dual = torch.zeros_like(clipped)
    active = ~clipped & ~dual
    return active, dual


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token ``(surrogate s, kl D, clipped)``, each ``(B, T)``; the objective is s - kl_coef*D.

    ``s`` is built with ``torch.where`` on the same conditions as omega, so autograd's gradient
    of ``s - kl_coef * D`` w.r.t. ``logprobs`` equals :func:`gradient_coefficient` everywhere,
    boundaries included. ``D`` is zeros when ``ref_logprobs`` is None. ``clipped`` is True
    where the policy gradient is zero because of clipping (I(r, A) = 0 or the dual clip).
    """
    _check_objective_args(clip_low, clip_high, dual_clip, kl_coef, kl_clamp)
    adv = _check_inputs(logprobs, old_logprobs, advantages, ref_logprobs, kl_coef)
    adv = adv.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    active, dual = _surrogate_parts(ratio.detach(), adv, clip_low, clip_high, dual_clip)
    const_ratio = ratio.detach().clamp(1 - clip_low, 1 + clip_high)  # value of the clipped branch
    if dual_clip is not None:
        const_ratio = torch.where(dual, torch.full_like(const_ratio, dual_clip), const_ratio)
    surrogate = torch.where(active, ratio * adv, const_ratio * adv)  # (B, T)
    kl = _k3_kl(logprobs, ratio, ref_logprobs, kl_ratio_correction, kl_clamp)
    return surrogate, kl, ~active


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
        active, _ = _surrogate_parts(ratio, adv, clip_low, clip_high, dual_clip)
        omega = torch.where(active, ratio * adv, torch.zeros_like(ratio))
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


# --------------------------------------------------------------------------------------------
# aggregation and the loss


def _check_mask(mask: torch.Tensor, reference: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {tuple(reference.shape)}")
    if tuple(mask.shape) != tuple(reference.shape):
        raise ValueError(
            f"{name} must have shape {tuple(reference.shape)} (like logprobs), "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or mask.is_complex():
            bad = (mask != 0) & (mask != 1)
            if bool(bad.any()):
                raise ValueError(f"{name} must be boolean or 0/1 valued")
        mask = mask != 0
    return mask


def _norm_set(mask: torch.Tensor, selected: torch.Tensor | None, normalize: str) -> torch.Tensor:
    """Tokens counted in the divisor: the selected tokens (normalize='selected') or all valid."""
    if selected is not None and normalize == "selected":
        return mask & selected
    return mask


def _denominator_from_set(count_set: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Local (uncommunicated) divisor as a float64 scalar tensor."""
    if aggregation == "token-mean":
        return count_set.sum().double()
    if aggregation in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return (count_set.sum(-1) > 0).sum().double()
    return torch.ones((), dtype=torch.float64, device=count_set.device)


def loss_denominator(
    mask: torch.Tensor,
    selected: torch.Tensor | None = None,
    aggregation: str = "token-mean",
    normalize: str = "selected",
    process_group: Any = None,
) -> float:
    """The aggregation's divisor for a whole mini-batch (summed over ranks with a process group).

    Call it once on the full mini-batch, before splitting into micro-batches, and pass the
    result as ``policy_loss(..., denominator=...)`` to every micro-batch: the micro-batch losses
    then add up to the loss of the whole mini-batch (values and gradients). With a process
    group the per-rank losses add up to the global loss, so gradients must be SUMMED over
    ranks; DDP averages them, so under DDP multiply the loss by the world size.

    Counting set C = ``mask & selected`` if ``selected`` is given and ``normalize='selected'``,
    else ``mask``. token-mean: |C|; seq-mean-*: number of rows with at least one token in C;
    sum: 1. The result is at least 1 (an empty set contributes a zero loss).

    Args:
        mask: ``(B, T)`` bool response mask. selected: ``(B, T)`` bool or None.
    """
    _check_agg_args(aggregation, normalize, "selected")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("mask must be a torch.Tensor of shape (B, T)")
    mask = _check_mask(mask, mask, "mask")
    if selected is not None:
        selected = _check_mask(selected, mask, "selected")
    den = _denominator_from_set(_norm_set(mask, selected, normalize), aggregation)
    if aggregation != "sum":
        den = dist_utils.all_reduce_sum(den, process_group)
    return max(float(den), 1.0)


def _check_agg_args(aggregation: str, normalize: str, kl_tokens: str) -> None:
    check_choice("aggregation", aggregation, AGGREGATIONS)
    check_choice("normalize", normalize, NORMALIZE_MODES)
    check_choice("kl_tokens", kl_tokens, KL_TOKEN_MODES)


def _aggregate(
    token_loss: torch.Tensor,
    sum_set: torch.Tensor,
    count_set: torch.Tensor,
    aggregation: str,
    denominator: float | None,
) -> torch.Tensor:
    """Aggregate ``token_loss`` (B, T) over ``sum_set`` with divisors counted on ``count_set``."""
    summed = torch.where(sum_set, token_loss, torch.zeros_like(token_loss))  # (B, T)
    if aggregation == "seq-mean-token-mean":
        row_counts = count_set.sum(-1).clamp_min(1).to(token_loss.dtype)  # (B,)
        per_row = summed.sum(-1) / row_counts  # (B,)
        total = per_row.sum()
    else:
        total = summed.sum()
    if denominator is None:
        denominator = max(float(_denominator_from_set(count_set, aggregation)), 1.0)
    return total / denominator


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_ratio_correction: bool = False,
    kl_clamp: float | None = None,
    selected: torch.Tensor | None = None,
    aggregation: str = "token-mean",
    normalize: str = "selected",
    kl_tokens: str = "selected",
    entropy: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    largest: bool = True,
    denominator: float | None = None,
    kl_denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The (token-selective) clipped policy loss and its metrics.

    Token loss -l = -s + kl_coef * D (see :func:`token_objective`). With P the tokens that carry
    the policy term (``mask & selected``, or ``mask`` when ``selected`` is None) and C the
    counting set (``mask & selected`` when ``normalize='selected'``, else ``mask``):

        loss = AGG(-s; sum over P, divisor from C)
             + kl_coef * AGG(D; sum over P, divisor from C)        kl_tokens='selected'
             + kl_coef * AGG(D; sum over mask, divisor from mask)  kl_tokens='all'

    where AGG is ``aggregation``: token-mean sum/|C|; seq-mean-token-mean
    (1/#rows of C) sum_i (1/|C_i|) sum_t; seq-mean-token-sum (1/#rows of C) sum_i sum_t;
    sum: plain sum. With ``selected``, ``normalize='selected'`` and ``kl_tokens='selected'``
    token-mean is the paper's eq. 2; with ``selected=None`` seq-mean-token-mean is GRPO eq. 1
    and token-mean is DAPO.

    Args:
        logprobs: ``(B, T)`` log pi_theta (with gradient). old_logprobs, ref_logprobs: ``(B, T)``.
        advantages: ``(B,)`` or ``(B, T)``. mask: ``(B, T)`` bool response mask.
        selected: ``(B, T)`` bool selection mask or None (train on all valid tokens).
        entropy, scores: optional ``(B, T)`` tensors used only for metrics.
        largest: whether ``selected`` holds the top (True) or bottom scores (for the threshold).
        denominator: divisor of the policy term from :func:`loss_denominator` on the whole
            mini-batch (for micro-batching); None computes it from this batch.
        kl_denominator: divisor of the KL term when ``kl_tokens='all'`` and the counting sets
            differ (``normalize='selected'`` with a selection); required then if ``denominator``
            is given and kl_coef > 0. Compute it with ``loss_denominator(mask, None, aggregation,
            'all')``.

    Returns:
        ``(loss, metrics)``: a scalar loss to minimise and a dict of Python floats:
        selected_fraction, clip_fraction, clip_fraction_selected, positive_advantage_fraction_selected,
        and when given entropy_mean / entropy_selected_mean, score_threshold, kl_mean. Means
        over an empty set are nan.
    """
    _check_agg_args(aggregation, normalize, kl_tokens)
    for name, value in (("denominator", denominator), ("kl_denominator", kl_denominator)):
        if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
            raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
    _check_objective_args(clip_low, clip_high, dual_clip, kl_coef, kl_clamp)
    _check_inputs(logprobs, old_logprobs, advantages, ref_logprobs, kl_coef)
    mask = _check_mask(mask, logprobs, "mask")
    if selected is not None:
        selected = _check_mask(selected, logprobs, "selected")
    _check_same_shape(logprobs, entropy=entropy, scores=scores)

    # Padding never reaches the objective (r = 1, D = 0 there), so garbage log-probs at
    # masked positions (inf, nan, huge ratios) cannot leak nan into the gradients.
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    surrogate, kl, clipped = token_objective(
        torch.where(mask, logprobs, zero),
        torch.where(mask, old_logprobs.to(logprobs.dtype), zero),
        advantages,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        ref_logprobs=(
            torch.where(mask, ref_logprobs.to(logprobs.dtype), zero)
            if ref_logprobs is not None
            else None
        ),
        kl_coef=kl_coef,
        kl_ratio_correction=kl_ratio_correction,
        kl_clamp=kl_clamp,
    )

    policy_set = mask & selected if selected is not None else mask  # P
    count_set = _norm_set(mask, selected, normalize)  # C
    loss = _aggregate(-surrogate, policy_set, count_set, aggregation, denominator)
    if kl_coef > 0:
        if kl_tokens == "selected":
            loss = loss + kl_coef * _aggregate(kl, policy_set, count_set, aggregation, denominator)
        else:
            same_counts = selected is None or normalize == "all"
            kl_den = kl_denominator
            if kl_den is None and same_counts:
                kl_den = denominator
            if kl_den is None and denominator is not None:
                raise ValueError(
                    "kl_denominator is required when denominator is given, kl_tokens='all', "
                    "normalize='selected', a selection is given and kl_coef > 0 (compute it "
                    "with loss_denominator(mask, None, aggregation, 'all'))"
                )
            loss = loss + kl_coef * _aggregate(kl, mask, mask, aggregation, kl_den)

    metrics = _metrics(
        mask,
        selected,
        clipped,
        _broadcast_advantages(advantages, logprobs),
        entropy,
        scores,
        kl,
        ref_logprobs is not None,
        largest,
    )
    return loss, metrics


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def _metrics(
    mask: torch.Tensor,
    selected: torch.Tensor | None,
    clipped: torch.Tensor,
    adv: torch.Tensor,
    entropy: torch.Tensor | None,
    scores: torch.Tensor | None,
    kl: torch.Tensor,
    has_ref: bool,
    largest: bool,
) -> dict[str, float]:
    """All metric reductions stacked into one tensor: a single device sync."""
    with torch.no_grad():
        sel = mask & selected if selected is not None else mask
        zero = torch.zeros((), dtype=torch.float64, device=mask.device)

        def masked_sum(x: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
            return torch.where(where, x.detach().double(), zero).sum()

        parts = {
            "n_valid": mask.sum(),
            "n_sel": sel.sum(),
            "clip_all": (clipped & mask).sum(),
            "clip_sel": (clipped & sel).sum(),
            "pos_sel": ((adv > 0) & sel).sum(),
        }
        if entropy is not None:
            parts["ent_all"] = masked_sum(entropy, mask)
            parts["ent_sel"] = masked_sum(entropy, sel)
        if scores is not None:
            s = scores.detach().double()
            if largest:
                parts["thr"] = torch.where(sel, s, math.inf).amin() if s.numel() else zero
            else:
                parts["thr"] = torch.where(sel, s, -math.inf).amax() if s.numel() else zero
        if has_ref:
            parts["kl"] = masked_sum(kl, mask)
        values = dict(zip(parts, torch.stack([v.double() for v in parts.values()]).tolist()))
    n_valid, n_sel = values["n_valid"], values["n_sel"]
    metrics: dict[str, float] = {
        "selected_fraction": _ratio(n_sel, n_valid),
        "clip_fraction": _ratio(values["clip_all"], n_valid),
        "clip_fraction_selected": _ratio(values["clip_sel"], n_sel),
        "positive_advantage_fraction_selected": _ratio(values["pos_sel"], n_sel),
    }
    if entropy is not None:
        metrics["entropy_mean"] = _ratio(values["ent_all"], n_valid)
        metrics["entropy_selected_mean"] = _ratio(values["ent_sel"], n_sel)
    if scores is not None:
        metrics["score_threshold"] = values["thr"] if n_sel else float("nan")
    if has_ref:
        metrics["kl_mean"] = _ratio(values["kl"], n_valid)
    return metrics
