"""ObjectiveConfig: which policy objective, its parameters, its KL and its aggregation.

One flat, typed dataclass for every registered objective (shared by code, YAML and the CLI,
like the engines' own flat configs). ``name`` picks the objective; each objective reads the
fields it declares (:attr:`gmts.core.objectives.registry.Objective.params`) plus the shared ones
(ratio level and clamp, the KL, the aggregation). Setting a field the chosen objective does not
read to anything but its default is an error naming the field, so a mistyped recipe cannot be
silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from gmts.core._config_utils import check_choice, from_preset
from gmts.core._config_utils import help_meta as _help
from gmts.core.aggregation import get_aggregation
from gmts.core.objectives import clipped, cov, policy_gradient  # noqa: F401  (the built-ins)
from gmts.core.objectives.kl import available_kl_estimators
from gmts.core.objectives.ratio import RATIO_LEVELS
from gmts.core.objectives.registry import available_objectives, get_objective

__all__ = ["ObjectiveConfig", "OBJECTIVE_PRESETS", "SHARED_FIELDS"]

SHARED_FIELDS = frozenset(
    {
        "name",
        "ratio_level",
        "log_ratio_min",
        "log_ratio_max",
        "kl_coef",
        "kl_estimator",
        "kl_ratio_correction",
        "kl_clamp",
        "aggregation",
    }
)
"""Fields every objective reads (the others belong to the objectives that declare them)."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ObjectiveConfig:
    """The policy objective (GRPO eq. 1 / DAPO's clipped surrogate by default).

    See docs/semantics.md section 2 for every objective's terms, omega and the engines that
    offer it.
    """

    name: str = field(
        default="ppo",
        metadata=_help(
            "Policy objective (gmts.core.objectives): ppo (the clipped surrogate of "
            "GRPO/DAPO/Dr.GRPO; GSPO with ratio_level=sequence), cispo, sapo, gmpo, gpg, "
            "dppo-tv, dppo-kl, dro, vespo, clip-cov, kl-cov (Clip-Cov / KL-Cov, verl's clip_cov "
            "/ kl_cov)."
        ),
    )
    ratio_level: str = field(
        default="token",
        metadata=_help(
            "Importance ratio pi/pi_old: token (PPO), sequence (GSPO: exp of the mean log "
            "ratio of the answer, gradient through the mean) or sequence-token (GSPO-token: "
            "the sequence ratio's value with a token's gradient). For ppo, cispo, sapo; also "
            "the ratio of kl_ratio_correction."
        ),
    )
    clip_low: float = field(
        default=0.2,
        metadata=_help(
            "Lower clip epsilon: r clipped below at 1 - clip_low (ppo; cispo's weight bound, "
            "1 = none); gmpo: the log-ratio bound -clip_low; dppo-*: the divergence threshold "
            "for A <= 0."
        ),
    )
    clip_high: float = field(
        default=0.28,
        metadata=_help(
            "Upper clip epsilon (DAPO clip-higher): r clipped above at 1 + clip_high (ppo, "
            "cispo's weight bound: TRL's cispo caps at epsilon_high = 1 + clip_high, possibly "
            "below 1); gmpo: the log-ratio bound; dppo-*: the threshold for A > 0."
        ),
    )
    dual_clip: float | None = field(
        default=None,
        metadata=_help(
            "ppo: dual-clip constant c > 1 (verl clip_ratio_c, TRL delta): for A < 0 the token "
            "loss is bounded by -c*A, so tokens with r > c get no policy gradient. null: off."
        ),
    )
    dual_clip_all_signs: bool = field(
        default=False,
        metadata=_help(
            "ppo: cap r at dual_clip whatever the sign of A (TRL's delta clamps coef_1 for "
            "every token); false: A < 0 only (verl). They differ only when dual_clip < 1 + "
            "clip_high."
        ),
    )
    log_ratio_min: float | None = field(
        default=None,
        metadata=_help(
            "Clamp log r below at this value before exp (verl uses -20 in most losses; no "
            "gradient outside). null: no clamp."
        ),
    )
    log_ratio_max: float | None = field(
        default=None,
        metadata=_help("Clamp log r above at this value (verl: 20; its gspo: 10). null: no clamp."),
    )
    ratio_cap: float | None = field(
        default=None,
        metadata=_help(
            "dppo-*: truncate the (detached) importance weight at this value (verl "
            "clip_ratio_c). null: no truncation."
        ),
    )
    sapo_tau_pos: float = field(
        default=1.0, metadata=_help("sapo: gate temperature for A > 0 (TRL, verl: 1.0).")
    )
    sapo_tau_neg: float = field(
        default=1.05, metadata=_help("sapo: gate temperature for A <= 0 (TRL, verl: 1.05).")
    )
    dro_beta: float | None = field(
        default=None,
        metadata=_help("dro: weight of the quadratic log-ratio penalty (> 0, required for dro)."),
    )
    vespo_k_pos: float = field(default=2.0, metadata=_help("vespo: k for A >= 0 (TRL: 2.0)."))
    vespo_lambda_pos: float = field(
        default=3.0, metadata=_help("vespo: lambda for A >= 0 (TRL: 3.0).")
    )
    vespo_k_neg: float = field(default=3.0, metadata=_help("vespo: k for A < 0 (TRL: 3.0)."))
    vespo_lambda_neg: float = field(
        default=2.0, metadata=_help("vespo: lambda for A < 0 (TRL: 2.0).")
    )
    vespo_padding_weight: float = field(
        default=1.0,
        metadata=_help(
            "vespo: the importance weight that each position outside the mask, up to the "
            "batch's width T, multiplies into its row's w_i (1: none, w_i reads the valid "
            "tokens only). Reproduces TRL 1.16, whose VESPO weight sums the vLLM IS log-ratio "
            "over every position, padding included (the TRL integration's "
            "gmts_vespo_trl_padding; docs/integrations.md)."
        ),
    )
    clip_cov_ratio: float = field(
        default=0.0002,
        metadata=_help(
            "clip-cov (arXiv 2505.22617): fraction of the batch's valid tokens whose policy "
            "term is removed, drawn among the candidates (max(1, int(ratio N)) tokens; verl "
            "policy_loss.clip_cov_ratio, default 0.0002)."
        ),
    )
    clip_cov_lb: float = field(
        default=1.0,
        metadata=_help(
            "clip-cov: candidates have a centred covariance of advantage and log-prob above "
            "this (verl clip_cov_lb, 1.0)."
        ),
    )
    clip_cov_ub: float = field(
        default=5.0,
        metadata=_help(
            "clip-cov: candidates have a centred covariance below this (verl clip_cov_ub, 5.0)."
        ),
    )
    kl_cov_ratio: float = field(
        default=0.0002,
        metadata=_help(
            "kl-cov (arXiv 2505.22617): fraction of the batch's valid tokens, those of largest "
            "centred covariance of advantage and log-prob, that get the |log r| penalty "
            "(max(1, int(N ratio)) tokens; verl policy_loss.kl_cov_ratio, 0.0002)."
        ),
    )
    kl_cov_coef: float = field(
        default=0.1,
        metadata=_help(
            "kl-cov: weight of the |log r| penalty (verl policy_loss.ppo_kl_coef, 0.1)."
        ),
    )
    kl_coef: float = field(
        default=0.0,
        metadata=_help("beta: weight of the KL penalty to the reference policy (0 disables)."),
    )
    kl_estimator: str = field(
        default="k3",
        metadata=_help(
            "KL estimator: k3 (the paper, TRL, verl low_var_kl), k1, k2, abs, or k1+ / k3+ / "
            "abs+ (that value with k2's gradient, verl's '+')."
        ),
    )
    kl_ratio_correction: bool = field(
        default=False,
        metadata=_help(
            "Multiply the KL by the importance ratio (with its gradient), as TRL's "
            "use_bias_correction_kl (default True in TRL 1.16)."
        ),
    )
    kl_clamp: float | None = field(
        default=None,
        metadata=_help(
            "Clamp the KL estimate to [-kl_clamp, kl_clamp] (verl low_var_kl: 10). null: no "
            "clamp (the paper, TRL). Clamped tokens get no KL gradient."
        ),
    )
    aggregation: str = field(
        default="token-mean",
        metadata=_help(
            "How token losses become the batch loss: token-mean (DAPO), seq-mean-token-mean "
            "(GRPO eq. 1), seq-mean-token-sum, seq-mean-token-sum-norm (Dr.GRPO), sum."
        ),
    )

    def __post_init__(self) -> None:
        if self.name not in available_objectives():
            raise ValueError(
                f"name: unknown objective {self.name!r}; valid objectives: "
                f"{', '.join(available_objectives())}"
            )
        objective = get_objective(self.name)
        check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        if self.ratio_level not in objective.ratio_levels:
            raise ValueError(
                f"ratio_level={self.ratio_level!r}: objective {self.name!r} supports "
                f"{list(objective.ratio_levels)}"
            )
        self._check_values()
        check_choice("kl_estimator", self.kl_estimator, available_kl_estimators())
        try:
            get_aggregation(self.aggregation)
        except ValueError as err:
            raise ValueError(f"aggregation: {err}") from None
        for name in ("kl_ratio_correction", "dual_clip_all_signs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.dual_clip_all_signs and self.dual_clip is None:
            raise ValueError("dual_clip_all_signs needs dual_clip")
        unread = [
            f.name
            for f in fields(self)
            if f.name not in SHARED_FIELDS
            and f.name not in objective.params
            and getattr(self, f.name) != f.default
        ]
        if unread:
            raise ValueError(
                f"objective {self.name!r} does not read {unread}; leave them at their "
                f"defaults (it reads {sorted(objective.params) or 'no own parameters'})"
            )
        if self.name == "dro" and self.dro_beta is None:
            raise ValueError("dro_beta: objective 'dro' needs dro_beta > 0")

    def _check_values(self) -> None:
        if not (_finite(self.clip_low) and 0 <= self.clip_low <= 1):
            raise ValueError(
                f"clip_low must be a finite number in [0, 1] (the lower bound is 1 - clip_low), "
                f"got {self.clip_low!r}"
            )
        if not (_finite(self.clip_high) and self.clip_high > -1):
            raise ValueError(
                f"clip_high must be a finite number > -1 (the upper bound is 1 + clip_high), "
                f"got {self.clip_high!r}"
            )
        if self.clip_low + self.clip_high < 0:
            raise ValueError(
                f"the clip range [1 - clip_low, 1 + clip_high] = [{1 - self.clip_low}, "
                f"{1 + self.clip_high}] is empty"
            )
        if self.dual_clip is not None:
            # verl's clip_ratio_c (A < 0 only) must exceed 1; TRL's delta (every sign) any > 0
            floor = 0.0 if self.dual_clip_all_signs else 1.0
            if not (_finite(self.dual_clip) and self.dual_clip > floor):
                raise ValueError(
                    f"dual_clip must be null or a finite number > {floor:g}"
                    f"{' (with dual_clip_all_signs)' if floor == 0 else ''}, "
                    f"got {self.dual_clip!r}"
                )
        for name in ("log_ratio_min", "log_ratio_max"):
            value = getattr(self, name)
            if value is not None and not _finite(value):
                raise ValueError(f"{name} must be null or a finite number, got {value!r}")
        if (
            self.log_ratio_min is not None
            and self.log_ratio_max is not None
            and self.log_ratio_min > self.log_ratio_max
        ):
            raise ValueError("log_ratio_min must be <= log_ratio_max")
        positive = ("ratio_cap", "dro_beta", "kl_clamp")
        for name in positive:
            value = getattr(self, name)
            if value is not None and not (_finite(value) and value > 0):
                raise ValueError(f"{name} must be null or a finite number > 0, got {value!r}")
        for name in ("sapo_tau_pos", "sapo_tau_neg"):
            value = getattr(self, name)
            if not (_finite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
            if not _finite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if not (_finite(self.vespo_padding_weight) and self.vespo_padding_weight >= 0):
            raise ValueError(
                f"vespo_padding_weight must be a finite number >= 0, "
                f"got {self.vespo_padding_weight!r}"
            )
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, name)
            if not (_finite(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
        for name in ("clip_cov_lb", "clip_cov_ub"):
            if not _finite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(
                f"clip_cov_lb must be < clip_cov_ub, got {self.clip_cov_lb} >= {self.clip_cov_ub}"
            )
        if not (_finite(self.kl_cov_coef) and self.kl_cov_coef >= 0):
            raise ValueError(f"kl_cov_coef must be a finite number >= 0, got {self.kl_cov_coef!r}")
        if not (_finite(self.kl_coef) and self.kl_coef >= 0):
            raise ValueError(f"kl_coef must be a finite number >= 0, got {self.kl_coef!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ObjectiveConfig:
        """Named presets (:data:`OBJECTIVE_PRESETS`) with field overrides.

        ``"grpo"`` (eq. 1: seq-mean-token-mean, k3 KL with beta 0.001) and ``"dapo"``
        (token-mean, no KL), both with the paper's clip 0.2 / 0.28 (Appendix A.3);
        ``"gspo"`` (sequence ratio, clip 3e-4 / 4e-4, seq-mean-token-mean: the GSPO paper);
        ``"cispo"`` (weights clipped above at 5, no lower bound, token-mean: ScaleRL / TRL).
        """
        return from_preset(cls, OBJECTIVE_PRESETS, "objective", name, overrides)


OBJECTIVE_PRESETS: dict[str, ObjectiveConfig] = {
    "grpo": ObjectiveConfig(
        clip_low=0.2, clip_high=0.28, kl_coef=0.001, aggregation="seq-mean-token-mean"
    ),
    "dapo": ObjectiveConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, aggregation="token-mean"),
    "gspo": ObjectiveConfig(
        ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, aggregation="seq-mean-token-mean"
    ),
    "cispo": ObjectiveConfig(name="cispo", clip_low=1.0, clip_high=4.0, aggregation="token-mean"),
}
