"""SelectionConfig: which tokens the policy loss trains on, and how the loss is normalised.

``SelectionConfig`` is the one owner of every selection setting, ``normalize`` and
``kl_tokens`` included: :class:`gmts.core.loss.LossConfig` reads them from the selection it
holds. The TRL (``gmts_*``) and verl (``gmts.*``) dialects are generated from its fields.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gmts.core._config_utils import check_choice
from gmts.core._config_utils import help_meta as _help
from gmts.core.objectives import OMEGA_METHODS
from gmts.core.scores import available_scores, is_condition, score_help
from gmts.core.selection import COUNT_RULES, SCOPES, THRESHOLD_RULES, TIE_RULES

__all__ = [
    "KL_TOKEN_MODES",
    "NORMALIZE_MODES",
    "SELECTION_PRESETS",
    "SELECTION_UNITS",
    "ZERO_SCORE_RULES",
    "SelectionConfig",
]

SELECTION_UNITS = ("mini-batch", "micro-batch")
ZERO_SCORE_RULES = ("select", "skip")
NORMALIZE_MODES = ("selected", "all", "per-group")
KL_TOKEN_MODES = ("selected", "all")

NORMALIZE_HELP = (
    "Loss divisor with a selection: selected (1/S_rho as a token-mean over the batch: the "
    "paper's eq. 2, for GRPO and DAPO alike), all (the objective's own aggregation over all "
    "valid tokens, unselected tokens contributing 0: TRL) or per-group (the objective's "
    "aggregation within each question group over all its valid tokens, the groups summed: the "
    "authors' standalone code; also without a selection)."
)
KL_TOKENS_HELP = (
    "Tokens that carry the KL penalty: selected (KL inside l, eq. 2) or all (every valid "
    "token, as every existing implementation)."
)


def _real(value: Any) -> bool:
    """A finite real number (not a bool)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


@dataclass(frozen=True)
class SelectionConfig:
    """Token selection and loss normalisation (defaults: the paper's eq. 2 with GMTS at 20%)."""

    score: str = field(
        default="gmts",
        metadata=_help(
            f"Token score: {score_help()}; or none (train on every token: plain GRPO/DAPO)."
        ),
    )
    ratio: float = field(
        default=0.2,
        metadata=_help("rho: fraction of valid tokens kept per scope unit, in (0, 1]."),
    )
    largest: bool = field(
        default=True,
        metadata=_help("Keep the highest scores (top-rho); False keeps the lowest ('bottom')."),
    )
    scope: str = field(
        default="batch",
        metadata=_help(
            "Where the top-rho is taken within a selection unit: batch (all its tokens across "
            "ranks, eq. 2), group (per question group, the authors' GMTS code) or sequence "
            "(per answer)."
        ),
    )
    unit: str = field(
        default="mini-batch",
        metadata=_help(
            "The batch one selection sees: mini-batch (every token of one optimizer step on "
            "every rank, the paper) or micro-batch (each micro-batch on every rank on its own, "
            "as TRL's top_entropy_quantile)."
        ),
    )
    count: str = field(
        default="ceil",
        metadata=_help(
            "How many tokens a unit keeps: ceil (exactly ceil(rho*N), at least 1: the paper, ETS "
            "code), floor (exactly floor(rho*N): the authors' GMTS code), quantile (every token "
            ">= torch.quantile(scores, 1-rho), ties kept: TRL's top_entropy_quantile) or index "
            "(every token >= the floor((1-rho)N)-th smallest score: the authors' ETS code). "
            "quantile and index: scope batch only."
        ),
    )
    ties: str = field(
        default="first",
        metadata=_help(
            "Exact counts: which tokens tied at the cut go first, in row-major order of the "
            "global batch: first (ours) or last (the authors' GMTS code's stable sort)."
        ),
    )
    zero_scores: str = field(
        default="skip",
        metadata=_help(
            "select: a token whose score is exactly 0 is selectable like any other (ties at 0 "
            "fill the count and S); skip: never selected by a top selection (a zero GMTS score "
            "means zero policy gradient; the paper preset skips them so they do not inflate "
            "S_rho). A bottom selection (largest=False) keeps zeros under either rule: they are "
            "the lowest scores it asks for, and eq. 2 counts them in S."
        ),
    )
    omega: str = field(
        default="analytic",
        metadata=_help(
            "How omega is computed for omega-based scores: analytic (each objective's closed "
            "form) or autograd (d/dlog pi of the objective's own terms: the same values, for "
            "any registered objective, including one without a closed form)."
        ),
    )
    omega_weighting: bool = field(
        default=False,
        metadata=_help(
            "Multiply omega by the per-token weight of the aggregation the loss applies before "
            "scoring: 1/|o_i| under GRPO's seq-mean-token-mean with normalize=all (the authors' "
            "GRPO code folds 1/|o_i| into the advantage); 1, no effect, under token-mean and "
            "under eq. 2 (normalize=selected)."
        ),
    )
    normalize: str = field(default="selected", metadata=_help(NORMALIZE_HELP))
    kl_tokens: str = field(default="selected", metadata=_help(KL_TOKENS_HELP))
    seed: int = field(
        default=0,
        metadata=_help(
            "Seed of the 'random' score and of an objective's random pick (clip-cov): their "
            "generators are seeded with seed + step."
        ),
    )
    stapo_prob_threshold: float = field(
        default=0.002,
        metadata=_help(
            "score=stapo: tau_p, a token is spurious only if its probability is below it "
            "(STAPO, arXiv 2602.15620: 0.002, a fixed absolute value)."
        ),
    )
    stapo_entropy_quantile: float = field(
        default=0.8,
        metadata=_help(
            "score=stapo: tau_h is this quantile of the valid tokens' entropies over the "
            "selection unit (torch.quantile's interpolation); a spurious token's entropy is "
            "below it (STAPO: the 80% quantile of each mini-batch)."
        ),
    )
    rsi_low: float = field(
        default=0.5,
        metadata=_help(
            "score=rsi: keep tokens whose relative surprisal index -log p / entropy is at "
            "least this (RSI-S, arXiv 2606.31575; our choice, docs/semantics.md section 3)."
        ),
    )
    rsi_high: float = field(
        default=2.0,
        metadata=_help("score=rsi: ... and at most this (our choice, as rsi_low)."),
    )

    def __post_init__(self) -> None:
        valid_scores = [*available_scores(), "none"]
        if self.score not in valid_scores:
            raise ValueError(f"unknown score {self.score!r}; valid scores: {valid_scores}")
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, numbers.Real)
            or not (math.isfinite(self.ratio) and 0 < self.ratio <= 1)
        ):
            raise ValueError(f"ratio must be a number in (0, 1], got {self.ratio!r}")
        for name in ("largest", "omega_weighting"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_choice("scope", self.scope, SCOPES)
        check_choice("unit", self.unit, SELECTION_UNITS)
        check_choice("count", self.count, COUNT_RULES)
        check_choice("ties", self.ties, TIE_RULES)
        check_choice("zero_scores", self.zero_scores, ZERO_SCORE_RULES)
        check_choice("omega", self.omega, OMEGA_METHODS)
        if self.count in THRESHOLD_RULES and self.scope != "batch":
            raise ValueError(f"count={self.count!r} needs scope='batch', got {self.scope!r}")
        check_choice("normalize", self.normalize, NORMALIZE_MODES)
        check_choice("kl_tokens", self.kl_tokens, KL_TOKEN_MODES)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        self._check_rule_parameters()
        if is_condition(self.score) and (
            self.ratio != 1 or not self.largest or self.zero_scores != "skip"
        ):
            raise ValueError(
                f"score {self.score!r} is a condition (1 on the tokens it keeps, 0 elsewhere): "
                "use ratio=1, largest=True and zero_scores='skip' (the selection is then the "
                f"condition), got ratio={self.ratio!r}, largest={self.largest!r}, "
                f"zero_scores={self.zero_scores!r}"
            )

    def _check_rule_parameters(self) -> None:
        """The selection rules' own parameters (each read by one score only)."""
        for name, low, high in (
            ("stapo_prob_threshold", 0.0, 1.0),
            ("stapo_entropy_quantile", 0.0, 1.0),
        ):
            value = getattr(self, name)
            if not (_real(value) and low <= value <= high):
                raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
        for name in ("rsi_low", "rsi_high"):
            value = getattr(self, name)
            if not (_real(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.rsi_low > self.rsi_high:
            raise ValueError(f"rsi_low must be <= rsi_high, got {self.rsi_low} > {self.rsi_high}")

    @property
    def enabled(self) -> bool:
        """False for score='none' (no selection: every valid token is trained on)."""
        return self.score != "none"

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SelectionConfig:
        """A named preset (see docs/semantics.md section 7) with field overrides.

        Presets may depend on the score (``overrides["score"]``, default gmts):

        - ``"paper"``: eq. 2: one selection over the mini-batch of every rank, divide by the
          selected count, KL on the selected tokens, k = ceil(rho N), zero scores never
          selected by a top selection. The default.
        - ``"reference-code"``: the authors' standalone GRPO-Zero code: GMTS (and every score
          but entropy) per question group keeping floor(rho N) with the last ties first, ETS
          over the whole mini-batch keeping every score >= the floor((1-rho) N)-th smallest;
          each question group normalised on its own over all its tokens and the groups summed;
          KL on every token; omega carries GRPO's 1/|o_i|.
        - ``"trl"``: TRL's top_entropy_quantile: each micro-batch of every process on its own,
          every score >= torch.quantile(scores, 1 - rho) (ties kept), divide by all valid
          tokens (TRL's loss_type divisor), KL on every token.
        """
        if name not in SELECTION_PRESETS:
            raise ValueError(
                f"unknown selection preset {name!r}; valid presets: {sorted(SELECTION_PRESETS)}"
            )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown SelectionConfig fields in overrides: {sorted(unknown)}")
        score = overrides.get("score", cls.__dataclass_fields__["score"].default)
        return replace(SELECTION_PRESETS[name](score), **overrides)


def _paper(score: str) -> SelectionConfig:
    return SelectionConfig(score=score)


def _reference_code(score: str) -> SelectionConfig:
    ets = score == "entropy"
    return SelectionConfig(
        score=score,
        scope="batch" if ets else "group",
        count="index" if ets else "floor",
        ties="last",
        zero_scores="select",
        omega_weighting=True,
        normalize="per-group",
        kl_tokens="all",
    )


def _trl(score: str) -> SelectionConfig:
    return SelectionConfig(
        score=score,
        unit="micro-batch",
        count="quantile",
        zero_scores="select",
        normalize="all",
        kl_tokens="all",
    )


SELECTION_PRESETS: dict[str, Callable[[str], SelectionConfig]] = {
    "paper": _paper,
    "reference-code": _reference_code,
    "trl": _trl,
}
"""Preset name -> the preset's SelectionConfig for a given score."""
