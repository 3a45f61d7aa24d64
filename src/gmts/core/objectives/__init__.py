"""Policy objectives as a registry: per-token loss terms and the exact gradient coefficient omega.

- :mod:`.inputs`: the inputs every objective reads, the terms it returns;
- :mod:`.ratio`: importance ratios at the token, sequence and sequence-token levels;
- :mod:`.kl`: KL estimators (k1, k2, k3, abs and their straight-through variants);
- :mod:`.registry`: ``Objective``, the registry, ``objective_terms``, ``gradient_coefficient``;
- :mod:`.clipped`: ppo (GRPO, DAPO, dual clip, GSPO, GSPO-token), sapo, gmpo;
- :mod:`.policy_gradient`: cispo, gpg, dppo-tv, dppo-kl, dro, vespo;
- :mod:`.cov`: clip-cov, kl-cov (a batch-level pick by covariance, verl's clip_cov / kl_cov);
- :mod:`.config`: ``ObjectiveConfig`` and its presets.
"""

from gmts.core.objectives.config import OBJECTIVE_PRESETS, SHARED_FIELDS, ObjectiveConfig
from gmts.core.objectives.inputs import ObjectiveInputs, Surrogate, TokenObjective
from gmts.core.objectives.kl import (
    KLEstimator,
    available_kl_estimators,
    get_kl_estimator,
    register_kl_estimator,
)
from gmts.core.objectives.ratio import RATIO_LEVELS, Ratio, importance_ratio
from gmts.core.objectives.registry import (
    OMEGA_METHODS,
    Objective,
    autograd_omega,
    available_objectives,
    get_objective,
    gradient_coefficient,
    loss_omega,
    objective_picks,
    objective_terms,
    register_objective,
)

__all__ = [
    "OBJECTIVE_PRESETS",
    "OMEGA_METHODS",
    "RATIO_LEVELS",
    "SHARED_FIELDS",
    "KLEstimator",
    "Objective",
    "ObjectiveConfig",
    "ObjectiveInputs",
    "Ratio",
    "Surrogate",
    "TokenObjective",
    "autograd_omega",
    "available_kl_estimators",
    "available_objectives",
    "get_kl_estimator",
    "get_objective",
    "gradient_coefficient",
    "importance_ratio",
    "loss_omega",
    "objective_picks",
    "objective_terms",
    "register_kl_estimator",
    "register_objective",
]
