"""The loss of a batch: one configuration, one divisor rule, one record of token sums.

Everything an engine needs to turn per-token objectives into the loss it back-propagates lives
here, so the standalone trainer, TRL and verl compute it the same way:

- :class:`LossConfig`: the objective plus the selection the loss trains on, whose
  ``normalize`` (how the loss is normalised) and ``kl_tokens`` (which tokens carry the KL) are
  read from it: :class:`~gmts.core.config.SelectionConfig` is their one owner;
- :class:`TokenSums`: a small float64 vector of per-token sums (counts, clip counts, entropy,
  KL) of a batch. Sums add up over micro-batches and over ranks, so an engine reduces them with
  its own collective, once, and reads divisors and metrics from the result;
- :meth:`LossConfig.denominators`: the divisors of the policy and KL terms, the one place that
  rule is written;
- :func:`policy_loss`: the loss of a (micro-)batch given those divisors.

The rule (P = tokens that carry the policy term, ``mask & selected``, or ``mask`` without a
selection; N = valid tokens; S = selected valid tokens):

    selection and normalize='selected'  (the paper's eq. 2, whatever the objective's aggregation)
        loss = sum_P (-s) / S  +  kl_coef * sum_P D / S            kl_tokens='selected'
                               +  kl_coef * sum_M D / N            kl_tokens='all'
    normalize='per-group'  (the authors' standalone code, with or without a selection)
        loss = sum_g [A_g(-s over P_g) + kl_coef * A_g(D over P_g or M_g)]
        A_g: the objective's aggregation within question group g, its divisor counting g's
        valid tokens (token-mean) or rows (seq-mean-*); the groups' losses are summed
    otherwise (normalize='all', or no selection): the objective's aggregation A, counting N
        loss = A(-s over P)  +  kl_coef * A(D over P)              kl_tokens='selected'
                             +  kl_coef * A(D over M)              kl_tokens='all'

where A divides by N (token-mean), by the rows with a valid token (seq-mean-*, each row first
by its |o_i| for seq-mean-token-mean; seq-mean-token-sum-norm also by the horizon H) or by 1
(sum). Without a selection P = M, so ``normalize`` (but 'per-group') and ``kl_tokens`` make no
difference and GRPO's aggregation gives eq. 1, DAPO's gives DAPO's token-mean.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gmts.core import distributed as dist_utils
from gmts.core._config_utils import help_meta as _help
from gmts.core.aggregation import Aggregation, get_aggregation
from gmts.core.config import KL_TOKEN_MODES, NORMALIZE_MODES, SelectionConfig
from gmts.core.objectives import ObjectiveConfig, ObjectiveInputs, TokenObjective
from gmts.core.objectives import objective_terms as _objective_terms
from gmts.core.objectives.inputs import as_mask

__all__ = [
    "applied_aggregation",
    "KL_TOKEN_MODES",
    "NORMALIZE_MODES",
    "LossConfig",
    "LossDenominators",
    "TokenSums",
    "policy_loss",
]

_EQ2 = get_aggregation("token-mean")


@dataclass(frozen=True)
class LossDenominators:
    """The divisors of one mini-batch's loss (global over ranks), computed once before
    micro-batching and passed to every :func:`policy_loss` call of that mini-batch.

    Attributes:
        policy, kl: the divisors of the policy and KL terms.
        group_ids, group_divisors: ``normalize='per-group'`` only: the sorted question-group
            ids ``(U,)`` of the mini-batch and each group's divisor ``(U,)`` float64 (then
            ``policy`` and ``kl`` are 1).
    """

    policy: float
    kl: float
    group_ids: torch.Tensor | None = None
    group_divisors: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("policy", "kl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (
                isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            ):
                raise ValueError(f"denominators.{name} must be a finite number > 0, got {value!r}")
        if (self.group_ids is None) != (self.group_divisors is None):
            raise ValueError("group_ids and group_divisors go together")

    def row_scale(self, group_ids: torch.Tensor) -> torch.Tensor:
        """``(B,)`` float64: 1 / the divisor of each row's group (``normalize='per-group'``)."""
        assert self.group_ids is not None and self.group_divisors is not None
        ids = self.group_ids.to(group_ids.device)
        where = torch.searchsorted(ids, group_ids).clamp(max=max(len(ids) - 1, 0))
        if ids.numel() == 0 or bool((ids[where] != group_ids).any()):
            raise ValueError("group_ids has a group the mini-batch's denominators do not know")
        return 1.0 / self.group_divisors.to(group_ids.device)[where]


# ------------------------------------------------------------------------------------------
# token sums


_SUM_FIELDS = (
    "valid_tokens",
    "selected_tokens",
    "valid_rows",
    "clipped_low",
    "clipped_high",
    "dual_clipped",
    "clipped_selected",
    "positive_selected",
    "entropy",
    "entropy_selected",
    "kl",
)
_GROUPS = {  # optional groups of fields: measured only when the inputs were given
    "objective": ("clipped_low", "clipped_high", "dual_clipped", "clipped_selected"),
    "advantages": ("positive_selected",),
    "entropy": ("entropy", "entropy_selected"),
    "kl": ("kl",),
}


@dataclass(frozen=True)
class TokenSums:
    """Per-token sums over a batch, as one float64 vector that adds over micro-batches and ranks.

    Build it with :meth:`count` (counts only: enough for the divisors) or get it from
    :func:`policy_loss` (counts plus clip, advantage, entropy and KL sums for metrics). Reduce
    it over ranks with :meth:`all_reduce` (a torch.distributed group) or :meth:`reduced` (any
    collective, e.g. ``accelerator.reduce``), then read :meth:`denominators` via
    :class:`LossConfig` or :meth:`metrics`.

    Attributes:
        values: ``(F,)`` float64, one entry per name in :attr:`FIELDS`.
        selection: whether a selection mask was given (else selected == valid).
        measured: which optional groups were measured ("objective", "advantages", "entropy",
            "kl"); metrics of the others are not reported.
    """

    values: torch.Tensor
    selection: bool
    measured: frozenset[str] = frozenset()

    FIELDS = _SUM_FIELDS

    def __post_init__(self) -> None:
        if tuple(self.values.shape) != (len(_SUM_FIELDS),) or self.values.dtype != torch.float64:
            raise ValueError(f"values must be float64 of shape ({len(_SUM_FIELDS)},)")
        unknown = set(self.measured) - set(_GROUPS)
        if unknown:
            raise ValueError(f"unknown measured groups {sorted(unknown)}")

    @classmethod
    def count(cls, mask: torch.Tensor, selected: torch.Tensor | None = None) -> TokenSums:
        """Only the counts of a batch: valid tokens, selected valid tokens, rows with a valid
        token. ``mask``: ``(B, T)`` bool; ``selected``: ``(B, T)`` bool or None."""
        mask = as_mask(mask, mask, "mask")
        if selected is not None:
            selected = as_mask(selected, mask, "selected")
        return cls._build(mask, selected)

    @classmethod
    def _build(
        cls,
        mask: torch.Tensor,
        selected: torch.Tensor | None,
        *,
        parts: TokenObjective | None = None,
        advantages: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        kl: torch.Tensor | None = None,
    ) -> TokenSums:
        with torch.no_grad():
            carriers = mask & selected if selected is not None else mask  # (B, T)
            zero = torch.zeros((), dtype=torch.float64, device=mask.device)
            sums = dict.fromkeys(_SUM_FIELDS, zero)
            sums["valid_tokens"] = mask.sum()
            sums["selected_tokens"] = carriers.sum()
            sums["valid_rows"] = mask.any(-1).sum()
            measured = set()

            def masked_sum(x: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
                return torch.where(where, x.detach().double(), zero).sum()

            if parts is not None:
                measured.add("objective")
                sums["clipped_low"] = (parts.clipped_low & mask).sum()
                sums["clipped_high"] = (parts.clipped_high & mask).sum()
                sums["dual_clipped"] = (parts.dual_clipped & mask).sum()
                sums["clipped_selected"] = (parts.clipped & carriers).sum()
            if advantages is not None:
                measured.add("advantages")
                sums["positive_selected"] = ((advantages > 0) & carriers).sum()
            if entropy is not None:
                measured.add("entropy")
                sums["entropy"] = masked_sum(entropy, mask)
                sums["entropy_selected"] = masked_sum(entropy, carriers)
            if kl is not None:
                measured.add("kl")
                sums["kl"] = masked_sum(kl, mask)
            values = torch.stack([sums[k].double() for k in _SUM_FIELDS])
        return cls(values, selected is not None, frozenset(measured))

    def __getitem__(self, name: str) -> float:
        """One sum by field name, as a Python float."""
        return float(self.values[_SUM_FIELDS.index(name)])

    def __add__(self, other: TokenSums) -> TokenSums:
        """Sums of two disjoint parts of one batch (e.g. two micro-batches)."""
        if not isinstance(other, TokenSums):
            return NotImplemented
        if other.selection != self.selection:
            raise ValueError("cannot add TokenSums with and without a selection")
        values = self.values + other.values.to(self.values.device)
        return TokenSums(values, self.selection, self.measured & other.measured)

    def reduced(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> TokenSums:
        """The sums over every rank, with ``reduce_sum`` the engine's sum collective
        (a function ``(F,) tensor -> (F,) tensor``)."""
        values = reduce_sum(self.values.clone())
        return TokenSums(values.to(torch.float64), self.selection, self.measured)

    def all_reduce(self, process_group: Any = None) -> TokenSums:
        """The sums over the ranks of ``process_group`` (None: this process only)."""
        return self.reduced(lambda v: dist_utils.all_reduce_sum(v, process_group))

    def metrics(self) -> dict[str, float]:
        """Fractions and means (Python floats; a mean over an empty set is nan).

        selected_fraction; with the objective: clip_fraction (of valid tokens, any clip),
        clip_low_fraction, clip_high_fraction, dual_clip_fraction, clip_fraction_selected; with
        advantages: positive_advantage_fraction_selected; with entropy: entropy_mean,
        entropy_selected_mean; with the KL: kl_mean (of D over valid tokens).
        """
        v = dict(zip(_SUM_FIELDS, self.values.tolist()))
        n, s = v["valid_tokens"], v["selected_tokens"]
        out = {"selected_fraction": _ratio(s, n)}
        if "objective" in self.measured:
            clipped = v["clipped_low"] + v["clipped_high"] + v["dual_clipped"]
            out["clip_fraction"] = _ratio(clipped, n)
            out["clip_low_fraction"] = _ratio(v["clipped_low"], n)
            out["clip_high_fraction"] = _ratio(v["clipped_high"], n)
            out["dual_clip_fraction"] = _ratio(v["dual_clipped"], n)
            out["clip_fraction_selected"] = _ratio(v["clipped_selected"], s)
        if "advantages" in self.measured:
            out["positive_advantage_fraction_selected"] = _ratio(v["positive_selected"], s)
        if "entropy" in self.measured:
            out["entropy_mean"] = _ratio(v["entropy"], n)
            out["entropy_selected_mean"] = _ratio(v["entropy_selected"], s)
        if "kl" in self.measured:
            out["kl_mean"] = _ratio(v["kl"], n)
        return out


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


# ------------------------------------------------------------------------------------------
# configuration and divisors


def applied_aggregation(objective: ObjectiveConfig, normalize: str, selection: bool) -> Aggregation:
    """The aggregation a loss applies: eq. 2's token-mean with a selection and
    ``normalize='selected'``, else the objective's own (the one place this rule is written)."""
    if selection and normalize == "selected":
        return _EQ2
    return get_aggregation(objective.aggregation)


@dataclass(frozen=True, init=False)
class LossConfig:
    """Everything that turns per-token objectives into one loss (see the module docstring).

    ``LossConfig(objective, selection, horizon)``; ``normalize`` and ``kl_tokens`` are the
    selection's (read-only here: :class:`SelectionConfig` owns them). The keywords
    ``normalize=`` and ``kl_tokens=`` of older versions still work, with a DeprecationWarning
    naming the new spelling.
    """

    objective: ObjectiveConfig = field(
        default_factory=ObjectiveConfig,
        metadata=_help("The policy objective: its terms, KL and aggregation."),
    )
    selection: SelectionConfig = field(
        default_factory=SelectionConfig,
        metadata=_help(
            "The selection the loss trains on: its normalize and kl_tokens are the loss's "
            "divisor rule and KL tokens (with a selection mask; without one they do not apply, "
            "but normalize='per-group')."
        ),
    )
    horizon: int | None = field(
        default=None,
        metadata=_help(
            "H of the seq-mean-token-sum-norm aggregation (Dr.GRPO: the maximum response "
            "length); required by it, unused otherwise."
        ),
    )

    def __init__(
        self,
        objective: ObjectiveConfig | None = None,
        selection: SelectionConfig | None = None,
        horizon: int | None = None,
        *,
        normalize: str | None = None,
        kl_tokens: str | None = None,
    ) -> None:
        objective = ObjectiveConfig() if objective is None else objective
        selection = SelectionConfig() if selection is None else selection
        if not isinstance(selection, SelectionConfig):
            raise ValueError(
                f"selection must be a SelectionConfig, got {type(selection).__name__} (since "
                "normalize and kl_tokens belong to SelectionConfig, LossConfig's second "
                "argument is the selection)"
            )
        moved = {k: v for k, v in (("normalize", normalize), ("kl_tokens", kl_tokens)) if v}
        if moved:
            old = ", ".join(f"{k}={v!r}" for k, v in moved.items())
            verb = "belongs" if len(moved) == 1 else "belong"
            warnings.warn(
                f"LossConfig({old}) is deprecated: {' and '.join(moved)} {verb} to "
                f"SelectionConfig; write LossConfig(objective, SelectionConfig({old})) or "
                "LossConfig.of(objective, selection)",
                DeprecationWarning,
                stacklevel=2,
            )
            selection = replace(selection, **moved)
        object.__setattr__(self, "objective", objective)
        object.__setattr__(self, "selection", selection)
        object.__setattr__(self, "horizon", horizon)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not isinstance(self.objective, ObjectiveConfig):
            raise ValueError(
                f"objective must be an ObjectiveConfig, got {type(self.objective).__name__}"
            )
        if self.horizon is not None and (
            isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or self.horizon < 1
        ):
            raise ValueError(f"horizon must be null or an int >= 1, got {self.horizon!r}")
        if get_aggregation(self.objective.aggregation).horizon and self.horizon is None:
            raise ValueError(
                f"aggregation {self.objective.aggregation!r} divides by a fixed horizon: set "
                "LossConfig.horizon (the maximum response length)"
            )

    @property
    def normalize(self) -> str:
        """``selection.normalize``: the loss's divisor rule with a selection."""
        return self.selection.normalize

    @property
    def kl_tokens(self) -> str:
        """``selection.kl_tokens``: the tokens that carry the KL."""
        return self.selection.kl_tokens

    @classmethod
    def of(
        cls, objective: ObjectiveConfig, selection: SelectionConfig, *, horizon: int | None = None
    ) -> LossConfig:
        """The loss of ``objective`` trained on ``selection``'s tokens."""
        return cls(objective, selection, horizon)

    def aggregation(self, selection: bool) -> Aggregation:
        """The aggregation applied (:func:`applied_aggregation`)."""
        return applied_aggregation(self.objective, self.normalize, selection)

    def denominators(
        self,
        sums: TokenSums,
        *,
        mask: torch.Tensor | None = None,
        group_ids: torch.Tensor | None = None,
    ) -> LossDenominators:
        """The policy and KL divisors for a batch whose (reduced) counts are ``sums``.

        Every divisor is at least 1 (an empty batch gives a zero loss). With
        ``normalize='per-group'`` the divisors are per question group and need the whole
        mini-batch's ``mask`` ``(B, T)`` and ``group_ids`` ``(B,)`` (every group's rows on
        this rank: groups may not span ranks).
        """
        if not isinstance(sums, TokenSums):
            raise ValueError(f"sums must be TokenSums, got {type(sums).__name__}")
        aggregation = self.aggregation(sums.selection)
        scale = float(self.horizon) if aggregation.horizon else 1.0  # __post_init__ checked it
        if self.normalize == "per-group":
            return self._group_denominators(aggregation, scale, mask, group_ids)
        eq2 = sums.selection and self.normalize == "selected"
        if aggregation.divisor == "tokens":
            policy = sums["selected_tokens"] if eq2 else sums["valid_tokens"]
        elif aggregation.divisor == "rows":
            policy = sums["valid_rows"]
        else:
            policy = 1.0
        kl = sums["valid_tokens"] if eq2 and self.kl_tokens == "all" else policy
        return LossDenominators(policy=max(policy, 1.0) * scale, kl=max(kl, 1.0) * scale)

    def _group_denominators(
        self,
        aggregation: Aggregation,
        scale: float,
        mask: torch.Tensor | None,
        group_ids: torch.Tensor | None,
    ) -> LossDenominators:
        if mask is None or group_ids is None:
            raise ValueError("normalize='per-group' needs the mini-batch's mask and group_ids")
        mask = as_mask(mask, mask, "mask")
        if not isinstance(group_ids, torch.Tensor) or tuple(group_ids.shape) != (mask.shape[0],):
            raise ValueError(f"group_ids must be a tensor of shape (B,) = ({mask.shape[0]},)")
        ids, row_group = torch.unique(group_ids.long(), return_inverse=True)  # (U,), (B,)
        if aggregation.divisor == "tokens":
            per_row = mask.sum(-1).double()
        elif aggregation.divisor == "rows":
            per_row = mask.any(-1).double()
        else:
            per_row = torch.zeros(mask.shape[0], dtype=torch.float64, device=mask.device)
        counts = torch.zeros(len(ids), dtype=torch.float64, device=mask.device)
        counts.scatter_add_(0, row_group, per_row)
        if aggregation.divisor == "none":
            counts = torch.ones_like(counts)
        divisors = counts.clamp_min(1.0) * scale
        return LossDenominators(1.0, 1.0, group_ids=ids, group_divisors=divisors)


# ------------------------------------------------------------------------------------------
# the loss


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig | None = None,
    *,
    selected: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    denominators: LossDenominators | None = None,
    importance_weights: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    picked: torch.Tensor | None = None,
) -> tuple[torch.Tensor, TokenSums]:
    """The (token-selective) policy loss of a batch, and its token sums.

    Args:
        logprobs: ``(B, T)`` log pi_theta of the sampled tokens (with gradient).
        old_logprobs: ``(B, T)`` log pi_old. advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` bool response mask.
        config: the objective, and the selection's ``normalize`` and ``kl_tokens`` (default:
            ``LossConfig()``, DAPO's clip range without KL, eq. 2 normalisation).
        selected: ``(B, T)`` bool selection, or None (train on every valid token).
        ref_logprobs: ``(B, T)`` log pi_ref, required when the objective's kl_coef > 0.
        entropy: ``(B, T)``, only for the entropy sums of the returned record.
        denominators: the mini-batch's divisors (:meth:`LossConfig.denominators` on its
            reduced :class:`TokenSums`, or :func:`gmts.selection_step`'s): micro-batch and rank
            losses then add up to the global loss (gradients SUMMED over ranks; the step's
            ``averaged_over`` for DDP). None: this batch's own divisors.
        importance_weights: ``(B,)``/``(B, 1)``/``(B, T)`` detached rollout-correction weights
            >= 0 that multiply the policy term (as the objective applies them; never the KL),
            or None.
        group_ids: ``(B,)`` question-group ids, required by ``normalize='per-group'``.
        picked: ``(B, T)`` bool, the batch-level pick of an objective that has one (clip-cov,
            kl-cov) made over the whole update unit: :func:`gmts.selection_step`'s
            ``picked`` rows. None: the objective picks over this batch alone (seed 0).

    Returns:
        ``(loss, sums)``: the scalar loss to minimise and this batch's (unreduced)
        :class:`TokenSums` (clip, advantage, entropy if given, KL if ``ref_logprobs``).
    """
    config = LossConfig() if config is None else config
    _check_loss_inputs(config, logprobs, entropy, denominators, ref_logprobs, group_ids)
    mask = as_mask(mask, logprobs, "mask")
    if selected is not None:
        selected = as_mask(selected, logprobs, "selected")
    objective = config.objective

    # Padding never reaches the objective (r = 1, D = 0 there), so garbage log-probs at
    # masked positions (inf, nan, huge ratios) cannot leak nan into the gradients.
    inputs = ObjectiveInputs.of(
        logprobs, old_logprobs, advantages, mask,
        ref_logprobs=ref_logprobs, importance_weights=importance_weights, picked=picked,
    )  # fmt: skip
    parts = _objective_terms(objective, inputs)
    carriers = mask & selected if selected is not None else mask  # P
    sums = TokenSums._build(
        mask,
        selected,
        parts=parts,
        advantages=inputs.advantages,
        entropy=entropy,
        kl=parts.kl if ref_logprobs is not None else None,
    )
    if denominators is None:
        denominators = config.denominators(sums, mask=mask, group_ids=group_ids)
    aggregation = config.aggregation(selected is not None)
    surrogate, kl = parts.surrogate, parts.kl
    if config.normalize == "per-group":
        if denominators.group_ids is None:
            raise ValueError("normalize='per-group' needs per-group denominators")
        row_scale = denominators.row_scale(group_ids.long())[:, None].to(logprobs.dtype)
        surrogate, kl = surrogate * row_scale, kl * row_scale
    loss = aggregation.total(-surrogate, carriers, mask) / denominators.policy
    if objective.kl_coef > 0:
        kl_carriers = carriers if config.kl_tokens == "selected" else mask
        kl_term = aggregation.total(kl, kl_carriers, mask) / denominators.kl
        loss = loss + objective.kl_coef * kl_term
    return loss, sums


def _check_loss_inputs(
    config: Any,
    logprobs: Any,
    entropy: Any,
    denominators: Any,
    ref_logprobs: Any,
    group_ids: Any,
) -> None:
    """ValueError naming the first argument of :func:`policy_loss` that cannot be used."""
    if not isinstance(config, LossConfig):
        raise ValueError(f"config must be a LossConfig, got {type(config).__name__}")
    if denominators is not None and not isinstance(denominators, LossDenominators):
        raise ValueError(
            f"denominators must be LossDenominators, got {type(denominators).__name__}"
        )
    if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
        raise ValueError("logprobs must be a torch.Tensor of shape (B, T)")
    if entropy is not None and (
        not isinstance(entropy, torch.Tensor) or entropy.shape != logprobs.shape
    ):
        raise ValueError(f"entropy must be a torch.Tensor of shape {tuple(logprobs.shape)}")
    if config.objective.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs (B, T) are required when kl_coef > 0")
    if config.normalize == "per-group" and group_ids is None:
        raise ValueError("normalize='per-group' needs group_ids (B,)")
