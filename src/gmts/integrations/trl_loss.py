"""TRL's loss options as the core's objective, importance weights and divisors (TRL 1.16).

The one place that maps what ``GRPOTrainer._compute_loss`` reads to the core:

    TRL option                                   core
    loss_type grpo/bnpo/dr_grpo/dapo/luspo       objective ppo: clip_low = min(epsilon, 1),
                                                 clip_high = epsilon_high
    delta                                        ppo dual_clip = delta, dual_clip_all_signs
    loss_type cispo                              cispo: clip_low = 1, clip_high = epsilon_high - 1
    loss_type sapo                               sapo: sapo_tau_pos/neg = sapo_temperature_pos/neg
    loss_type vespo                              vespo: vespo_k_pos/neg, vespo_lambda_pos/neg
    gmts_vespo_trl_padding (vespo, token IS)     vespo_padding_weight (:func:`policy_factors`)
    importance_sampling_level token/sequence     ratio_level token/sequence (sequence = GSPO)
    beta, use_bias_correction_kl                 kl_coef (k3), kl_ratio_correction
    loss_type -> numerator                       aggregation (its :class:`TRLLossType`)
    loss_type -> divisor                         its divisor (:class:`DivisorInputs`)
    off_policy_mask_threshold, vLLM IS ratio     importance weights (:func:`policy_factors`)

Each ``loss_type`` is one :class:`TRLLossType` entry: its core objective (a
:class:`TRLObjective`: the objective's fields from the options, TRL's factors of the policy
term, the objective's own refusals), its aggregation and its divisor. Nothing here branches on
a loss-type name.

Why the mapping is exact where it is not literal: TRL clips the ratio below at
``1 - epsilon``; for ``epsilon >= 1`` that bound is <= 0 < r and never acts, as the core's
bound 0 at ``clip_low = 1``. TRL's cispo weight ``clamp(r, max=epsilon_high)`` has no lower
bound; the core's ``clamp(r, 1 - 1, epsilon_high)`` has the bound 0 < r, which never acts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gmts._registry import Registry
from gmts.core.objectives import ObjectiveConfig

__all__ = [
    "LOSS_TYPES",
    "LOSS_TYPE_TABLE",
    "VLLM_IS_MODES",
    "DivisorInputs",
    "PolicyFactors",
    "TRLLossOptions",
    "TRLLossType",
    "TRLObjective",
    "policy_factors",
    "vespo_padding_ratio",
]

VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL 1.16's ``vllm_importance_sampling_mode`` values."""


@dataclass(frozen=True)
class TRLLossOptions:
    """What TRL 1.16's ``_compute_loss`` reads to build the per-token loss.

    Build it from a ``GRPOConfig`` (:meth:`from_args`, before the trainer exists) or from a
    live trainer (:meth:`from_trainer`, the attributes TRL itself reads at every step).

    Attributes:
        vllm_is_mode: the vLLM importance-sampling mode when TRL multiplies the loss by its
            ratio (``use_vllm`` and ``vllm_importance_sampling_correction``), else None.
        vespo_trl_padding: ``gmts_vespo_trl_padding``: reproduce TRL's VESPO weight with a
            token IS range that excludes 1 (:func:`vespo_padding_ratio`).
    """

    loss_type: str
    importance_sampling_level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    off_policy_mask_threshold: float | None = None
    vllm_is_mode: str | None = None
    vllm_is_clip_min: float | None = None
    vllm_is_clip_max: float | None = None
    vespo_trl_padding: bool = False

    @classmethod
    def from_args(cls, args: Any) -> TRLLossOptions:
        """From a ``GRPOConfig`` (``epsilon_high=None`` means ``epsilon``, as TRL reads it)."""
        epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        return cls._of(args, args, epsilon_low=args.epsilon, epsilon_high=epsilon_high)

    @classmethod
    def from_trainer(cls, trainer: Any) -> TRLLossOptions:
        """From a ``GRPOTrainer``: the attributes its ``_compute_loss`` reads."""
        return cls._of(
            trainer,
            trainer.args,
            epsilon_low=trainer.epsilon_low,
            epsilon_high=trainer.epsilon_high,
        )

    @classmethod
    def _of(
        cls, owner: Any, args: Any, *, epsilon_low: float, epsilon_high: float
    ) -> TRLLossOptions:
        """``owner``: where TRL reads an option as ``self.<name>`` (the trainer), or the args."""
        corrected = bool(
            getattr(owner, "use_vllm", False)
            and getattr(owner, "vllm_importance_sampling_correction", False)
        )
        return cls(
            loss_type=owner.loss_type,
            importance_sampling_level=owner.importance_sampling_level,
            epsilon_low=float(epsilon_low),
            epsilon_high=float(epsilon_high),
            delta=None if args.delta is None else float(args.delta),
            beta=float(owner.beta),
            use_bias_correction_kl=bool(args.use_bias_correction_kl),
            sapo_temperature_pos=float(args.sapo_temperature_pos),
            sapo_temperature_neg=float(args.sapo_temperature_neg),
            vespo_k_pos=float(args.vespo_k_pos),
            vespo_lambda_pos=float(args.vespo_lambda_pos),
            vespo_k_neg=float(args.vespo_k_neg),
            vespo_lambda_neg=float(args.vespo_lambda_neg),
            off_policy_mask_threshold=owner.off_policy_mask_threshold,
            vllm_is_mode=owner.vllm_importance_sampling_mode if corrected else None,
            vllm_is_clip_min=owner.vllm_importance_sampling_clip_min,
            vllm_is_clip_max=owner.vllm_importance_sampling_clip_max,
            vespo_trl_padding=bool(getattr(args, "gmts_vespo_trl_padding", False)),
        )

    # ------------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Why these options cannot be expressed exactly by a core objective (empty: they can)."""
        if self.loss_type not in LOSS_TYPE_TABLE:
            return [f"loss_type={self.loss_type!r}: TRL 1.16's loss types are {list(LOSS_TYPES)}"]
        problems = []
        if self.importance_sampling_level not in ("token", "sequence"):
            problems.append(
                f"importance_sampling_level={self.importance_sampling_level!r}: TRL has 'token' "
                "and 'sequence'"
            )
        problems.extend(self.loss_type_entry.objective.checks(self))
        if self.off_policy_mask_threshold is not None and not math.isfinite(
            float(self.off_policy_mask_threshold)
        ):
            problems.append("off_policy_mask_threshold must be a finite number or None")
        if not problems:
            try:
                self._build()
            except ValueError as err:
                problems.append(f"{self.loss_type} maps to an invalid core objective: {err}")
        return problems

    def objective(self) -> ObjectiveConfig:
        """The core objective of TRL's per-token loss (ValueError listing :meth:`problems`)."""
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self._build()

    def _build(self) -> ObjectiveConfig:
        entry = self.loss_type_entry
        return ObjectiveConfig(
            name=entry.objective.name,
            ratio_level=self.importance_sampling_level,
            kl_coef=self.beta,
            kl_estimator="k3",
            kl_ratio_correction=bool(self.beta != 0.0 and self.use_bias_correction_kl),
            aggregation=entry.aggregation,
            **entry.objective.fields(self),
        )

    @property
    def loss_type_entry(self) -> TRLLossType:
        """This ``loss_type``'s table entry (ValueError listing the known ones)."""
        return LOSS_TYPE_TABLE.get(self.loss_type)


# ------------------------------------------------------------------------------------------
# divisors


@dataclass(frozen=True)
class DivisorInputs:
    """What TRL 1.16's divisor of one micro-batch's loss reads.

    Attributes:
        rows: ``B``, the micro-batch's local rows (every row, also those without a valid token).
        num_items_in_batch: TRL's global valid-token count of the generation batch.
        num_processes: accelerate's processes.
        accumulation: the gradient-accumulation steps of this optimizer step.
        steps_per_generation: micro-batches per generation batch.
        max_completion_length: TRL's response budget.
        train: a training micro-batch (in eval TRL neither splits nor accumulates).
    """

    rows: int
    num_items_in_batch: torch.Tensor | float | None
    num_processes: int
    accumulation: int
    steps_per_generation: int
    max_completion_length: int
    train: bool

    @property
    def steps(self) -> float:
        """TRL's division by the accumulation steps (1 in eval)."""
        return float(self.accumulation if self.train else 1)


DivisorFn = Callable[[DivisorInputs], tuple[float | None, float]]
"""``(divisor, scale)`` of one micro-batch: the loss is the numerator divided by ``divisor``
(None: the micro-batch's own valid-token count, TRL's ``mask.sum()``) and then by ``scale``."""


def _rows(d: DivisorInputs) -> tuple[float | None, float]:
    """The micro-batch's local rows."""
    return float(d.rows), d.steps


def _local_tokens(d: DivisorInputs) -> tuple[float | None, float]:
    """The micro-batch's local valid tokens (``mask.sum()``)."""
    return None, d.steps


def _rows_horizon(d: DivisorInputs) -> tuple[float | None, float]:
    """``B * max_completion_length``, a constant."""
    return float(d.rows * d.max_completion_length), d.steps


def _window_tokens(d: DivisorInputs) -> tuple[float | None, float]:
    """The window's share of ``num_items_in_batch`` per process; no accumulation scaling."""
    if d.num_items_in_batch is None:
        raise ValueError("this loss type divides by num_items_in_batch, missing from inputs")
    divisor = float(torch.as_tensor(d.num_items_in_batch).clamp(min=1.0)) / d.num_processes
    if d.train:  # the generation batch's count, rescaled to one accumulation window
        divisor *= d.accumulation / d.steps_per_generation
    return divisor, 1.0


# ------------------------------------------------------------------------------------------
# importance weights


@dataclass(frozen=True)
class PolicyFactors:
    """What TRL multiplies into the policy term, as the core takes it.

    Attributes:
        advantages: the advantages the objective reads, ``(B,)`` or ``(B, T)``.
        importance_weights: ``(B, 1)`` or ``(B, T)`` detached weights >= 0, or None.
        vespo_padding_weight: VESPO with ``gmts_vespo_trl_padding``: TRL's IS ratio at the
            micro-batch's positions outside the mask (the core's ``vespo_padding_weight``);
            None otherwise, or when every position is valid.
    """

    advantages: torch.Tensor
    importance_weights: torch.Tensor | None
    vespo_padding_weight: float | None = None


def vespo_padding_ratio(ratio: torch.Tensor, mask: torch.Tensor) -> float | None:
    """TRL 1.16's token IS ratio at the positions outside ``mask`` (padding, tool tokens).

    TRL builds the ratio from ``(old - sampling) * mask``: 0 outside the mask, so exp(0) = 1
    there, which its truncate modes then clip to ``[C_min, C_max]`` and its mask modes set to
    0 outside that range, in the ratio's own dtype. Its VESPO weight (``get_gamma_weights``)
    adds ``clamp(log ratio, log 1e-8, 20)`` over every position; each position outside the
    mask thus adds the log of this one value. Read from the tensor itself (so its dtype's
    rounding of C is TRL's); None when every position is valid.

    Args:
        ratio: ``(B, T)`` TRL's ``importance_sampling_ratio`` (a token mode).
        mask: ``(B, T)`` bool, TRL's ``completion_mask * tool_mask``.
    """
    outside = ratio.detach()[~mask]
    if outside.numel() == 0:
        return None
    value = outside[0]
    if not bool((outside == value).all()):
        raise ValueError(
            "TRL's importance_sampling_ratio differs between positions outside the mask; "
            "TRL 1.16 gives them all the same value (exp(0) clipped or masked)"
        )
    return float(value)


def _first_valid(mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` bool: the first valid token of each row."""
    return mask & (mask.long().cumsum(-1) == 1)


def _weighted_factors(
    options: TRLLossOptions,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    off_policy_mask: torch.Tensor | None,
) -> PolicyFactors:
    """ppo, cispo, sapo: TRL multiplies the policy term by the off-policy mask and (with vLLM
    correction) the IS ratio; their product is the core's importance weights."""
    weights = None
    if options.vllm_is_mode is not None:
        if importance_sampling_ratio is None:
            raise ValueError(
                "vLLM importance-sampling correction is on but inputs lack importance_sampling_ratio"
            )
        weights = importance_sampling_ratio.detach()
    if off_policy_mask is not None:
        keep = off_policy_mask.detach().to(torch.float32 if weights is None else weights.dtype)
        weights = keep if weights is None else weights * keep
    return PolicyFactors(advantages, weights)


def _vespo_factors(
    options: TRLLossOptions,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    off_policy_mask: torch.Tensor | None,
) -> PolicyFactors:
    """vespo: the IS ratio enters the gamma weight phi (a ``(B, 1)`` sequence ratio on the
    first valid token of its row), never multiplies the loss; the off-policy mask zeroes the
    advantages of the rows it drops (:func:`policy_factors`)."""
    weights, padding = None, None
    if importance_sampling_ratio is not None:
        ratio = importance_sampling_ratio.detach()
        if ratio.dim() == 2 and ratio.shape[1] == 1 and mask.shape[1] != 1:
            ratio = torch.where(_first_valid(mask), ratio, torch.ones_like(ratio))
        elif options.vespo_trl_padding:
            padding = vespo_padding_ratio(ratio, mask)
        weights = ratio
    if off_policy_mask is not None:
        adv = advantages[:, None] if advantages.dim() == 1 else advantages
        advantages = adv * off_policy_mask.to(adv.dtype)
    return PolicyFactors(advantages, weights, padding)


def policy_factors(
    options: TRLLossOptions,
    *,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    off_policy_mask: torch.Tensor | None,
) -> PolicyFactors:
    """TRL's multiplicative factors of the policy term as core importance weights.

    TRL multiplies ``per_token_loss`` (the policy term, before the KL is added) by the
    off-policy sequence mask ``(B, 1)`` and, with vLLM importance-sampling correction, by
    ``inputs["importance_sampling_ratio"]`` (``(B, T)`` in the token modes, ``(B, 1)`` in the
    sequence modes). For ppo, cispo and sapo both are the core's importance weights (their
    product), which multiply the policy term and are folded into omega.

    VESPO is different, as in TRL: the IS ratio enters its gamma weight phi (the core's vespo
    sums the logs of per-token weights over the valid tokens, so a ``(B, 1)`` sequence ratio is
    put on the first valid token of its row, exactly its log once), and TRL does not multiply
    the loss by it. TRL also sums the token ratio's log over the positions outside the mask;
    with ``options.vespo_trl_padding`` their ratio is returned as ``vespo_padding_weight``. The
    off-policy mask, which VESPO still multiplies, is 0 only for rows with A < 0 (TRL keeps
    A >= 0); VESPO's term is proportional to A, so zeroing those rows' advantages is exactly
    the product.

    Args:
        mask: ``(B, T)`` bool valid tokens (TRL's ``completion_mask * tool_mask``).
        importance_sampling_ratio: TRL's ratio when TRL applies it (vespo: whenever present).
        off_policy_mask: TRL's ``get_off_policy_mask`` ``(B, 1)``, or None.
    """
    factors = options.loss_type_entry.objective.factors
    return factors(options, advantages, mask, importance_sampling_ratio, off_policy_mask)


# ------------------------------------------------------------------------------------------
# the table: each TRL objective and each loss_type


def _ppo_fields(o: TRLLossOptions) -> dict[str, Any]:
    return dict(
        clip_low=min(o.epsilon_low, 1.0),
        clip_high=o.epsilon_high,
        dual_clip=o.delta,
        dual_clip_all_signs=o.delta is not None,
    )


def _cispo_fields(o: TRLLossOptions) -> dict[str, Any]:
    return dict(clip_low=1.0, clip_high=o.epsilon_high - 1.0)


def _sapo_fields(o: TRLLossOptions) -> dict[str, Any]:
    return dict(sapo_tau_pos=o.sapo_temperature_pos, sapo_tau_neg=o.sapo_temperature_neg)


def _vespo_fields(o: TRLLossOptions) -> dict[str, Any]:
    # its weight reads the token ratios whatever the level (TRL's log_ratio); the level is the
    # ratio of TRL's bias-corrected KL (coef_1)
    return dict(
        vespo_k_pos=o.vespo_k_pos,
        vespo_lambda_pos=o.vespo_lambda_pos,
        vespo_k_neg=o.vespo_k_neg,
        vespo_lambda_neg=o.vespo_lambda_neg,
    )


def _no_vespo_padding(o: TRLLossOptions) -> list[str]:
    """Every objective but vespo: ``gmts_vespo_trl_padding`` does not apply."""
    if not o.vespo_trl_padding:
        return []
    return [f"gmts_vespo_trl_padding=True applies to loss_type='vespo' only, not {o.loss_type!r}"]


def _vespo_checks(o: TRLLossOptions) -> list[str]:
    """vespo: a token IS range that excludes 1 only with ``gmts_vespo_trl_padding``."""
    if o.vllm_is_mode not in ("token_truncate", "token_mask") or o.vespo_trl_padding:
        return []
    low = -math.inf if o.vllm_is_clip_min is None else o.vllm_is_clip_min
    high = math.inf if o.vllm_is_clip_max is None else o.vllm_is_clip_max
    if low <= 1.0 <= high:
        return []
    what = "clipped to it" if o.vllm_is_mode == "token_truncate" else "masked to 0"
    return [
        "loss_type='vespo' with a vLLM importance-sampling range "
        f"[{o.vllm_is_clip_min}, {o.vllm_is_clip_max}] that excludes 1: TRL "
        "1.16's get_gamma_weights sums log(ratio) over every position of the "
        "micro-batch, padding included, where TRL's ratio is exp(0) = 1 "
        f"{what}, so each row's VESPO weight depends on how much padding its "
        "micro-batch gives it. Set gmts_vespo_trl_padding=True to reproduce "
        "TRL's loss exactly, or use a range that contains 1"
    ]


FactorsFn = Callable[
    [TRLLossOptions, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    PolicyFactors,
]


@dataclass(frozen=True)
class TRLObjective:
    """A core objective as TRL's loss types use it.

    Attributes:
        name: the core objective.
        fields: ``options -> {ObjectiveConfig field: value}``, its own settings.
        factors: TRL's factors of its policy term (:func:`policy_factors`).
        checks: ``options -> problems``, its own refusals.
        clip_metrics: TRL logs ``clip_ratio/*`` for it.
    """

    name: str
    fields: Callable[[TRLLossOptions], dict[str, Any]]
    factors: FactorsFn = _weighted_factors
    checks: Callable[[TRLLossOptions], list[str]] = _no_vespo_padding
    clip_metrics: bool = False


_PPO = TRLObjective("ppo", _ppo_fields, clip_metrics=True)
_CISPO = TRLObjective("cispo", _cispo_fields)
_SAPO = TRLObjective("sapo", _sapo_fields)
_VESPO = TRLObjective("vespo", _vespo_fields, factors=_vespo_factors, checks=_vespo_checks)


@dataclass(frozen=True)
class TRLLossType:
    """One TRL ``loss_type``: its core objective, the aggregation of its numerator and its
    divisor."""

    name: str
    objective: TRLObjective
    aggregation: str
    divisor: DivisorFn


LOSS_TYPE_TABLE = Registry[TRLLossType]("TRL loss_type")
for _entry in (
    # (per_token_loss * mask).sum(-1) / mask.sum(-1), mean over the local rows
    TRLLossType("grpo", _PPO, "seq-mean-token-mean", _rows),
    TRLLossType("sapo", _SAPO, "seq-mean-token-mean", _rows),
    # (per_token_loss * mask).sum() / mask.sum(): the micro-batch's local tokens
    TRLLossType("bnpo", _PPO, "token-mean", _local_tokens),
    # (per_token_loss * mask).sum() / (B * max_completion_length)
    TRLLossType("dr_grpo", _PPO, "token-mean", _rows_horizon),
    # (per_token_loss * mask).sum() / the window's share of num_items_in_batch
    TRLLossType("dapo", _PPO, "token-mean", _window_tokens),
    TRLLossType("cispo", _CISPO, "token-mean", _window_tokens),
    TRLLossType("vespo", _VESPO, "token-mean", _window_tokens),
    # (per_token_loss * mask).sum(-1).mean(): each row's token sum, mean over ALL local rows
    TRLLossType("luspo", _PPO, "seq-mean-token-sum", _rows),
):
    LOSS_TYPE_TABLE.register(_entry)

LOSS_TYPES: tuple[str, ...] = tuple(LOSS_TYPE_TABLE)
"""Every TRL 1.16 ``loss_type``, all supported."""
