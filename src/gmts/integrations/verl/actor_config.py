"""Reading verl's actor config: its fields, loss mode, rollout correction and KL type, and
building the core ``ObjectiveConfig`` of a loss mode from it.

Works on verl's ``ActorConfig`` (a dataclass), its Hydra ``DictConfig`` (the driver's config)
and a plain dict of its fields (the launcher's check), without importing verl.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gmts.core.objectives import ObjectiveConfig

__all__ = [
    "KL_ESTIMATORS",
    "KL_REFUSED",
    "ROW_MEAN",
    "VERL_AGGREGATIONS",
    "field_of",
    "kl_fields",
    "loss_mode_name",
    "objective_builder",
    "rollout_correction",
]

# verl's loss_agg_mode values the core's aggregations cover (same names, same meaning)
VERL_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
ROW_MEAN = "seq-mean-token-mean"

# verl's kl_loss_type -> (core estimator, clamp of its value). verl's low_var_kl / k3 clamps the
# estimate to [-10, 10] (its inner clamp of log(pi_ref/pi) to [-20, 20] never acts inside that
# range); '+' is verl's straight-through (the value of the base estimator, k2's gradient);
# mse+ / k2+ are k2 (k2's value with k2's gradient).
KL_ESTIMATORS: dict[str, tuple[str, float | None]] = {
    "kl": ("k1", None),
    "k1": ("k1", None),
    "abs": ("abs", None),
    "mse": ("k2", None),
    "k2": ("k2", None),
    "low_var_kl": ("k3", 10.0),
    "k3": ("k3", 10.0),
    "kl+": ("k1+", None),
    "k1+": ("k1+", None),
    "abs+": ("abs+", None),
    "mse+": ("k2", None),
    "k2+": ("k2", None),
    "low_var_kl+": ("k3+", 10.0),
    "k3+": ("k3+", 10.0),
}
KL_REFUSED = {
    "full": (
        "kl_loss_type='full' is the KL of the full next-token distributions, which needs the "
        "policy's and the reference's logits over the vocabulary; verl's loss gets only the "
        "sampled tokens' log-probs (verl 0.9.1's kl_penalty raises NotImplementedError for it)"
    ),
}
# verl 0.9.1's RolloutCorrectionConfig defaults (a worker's PolicyLossConfig always has one)
_ROLLOUT_CORRECTION_DEFAULTS = {
    "rollout_is": "sequence",
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
    "loss_type": "ppo_clip",
}


def field_of(config: Any, name: str, default: Any = None) -> Any:
    """A field of verl's ActorConfig / PolicyLossConfig (dataclasses), a Hydra DictConfig or a
    dict; ``default`` when absent or None."""
    if config is None:
        return default
    value = config.get(name, default) if isinstance(config, dict) else getattr(config, name, None)
    return default if value is None else value


def policy_loss_config(config: Any) -> Any:
    """``config.policy_loss`` (None when absent)."""
    return field_of(config, "policy_loss", None)


def loss_mode_name(config: Any) -> str:
    """``policy_loss.loss_mode`` of a verl actor config (vanilla when unset)."""
    return str(field_of(policy_loss_config(config), "loss_mode", "vanilla"))


def rollout_correction(config: Any) -> dict[str, Any]:
    """``policy_loss.rollout_correction`` as a dict, verl's defaults where unset."""
    rc = field_of(policy_loss_config(config), "rollout_correction", None)
    return {k: field_of(rc, k, d) for k, d in _ROLLOUT_CORRECTION_DEFAULTS.items()}


def clip_low(config: Any) -> float:
    """``clip_ratio_low``, else ``clip_ratio`` (verl's fallback)."""
    return float(field_of(config, "clip_ratio_low", field_of(config, "clip_ratio", 0.2)))


def clip_high(config: Any) -> float:
    """``clip_ratio_high``, else ``clip_ratio``."""
    return float(field_of(config, "clip_ratio_high", field_of(config, "clip_ratio", 0.2)))


def kl_fields(config: Any) -> dict[str, Any]:
    """The objective's KL fields: verl's ``kl_loss_type`` as a core estimator (none without
    ``use_kl_loss``); ValueError naming the type for 'full' or an unknown one."""
    if not bool(field_of(config, "use_kl_loss", False)):
        return {}
    kl_type = str(field_of(config, "kl_loss_type", "low_var_kl"))
    if kl_type in KL_REFUSED:
        raise ValueError(KL_REFUSED[kl_type])
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(
            f"kl_loss_type={kl_type!r}: not one of verl 0.9.1's KL types "
            f"({', '.join(sorted(KL_ESTIMATORS))}, full)"
        )
    estimator, clamp = KL_ESTIMATORS[kl_type]
    return {
        "kl_coef": float(field_of(config, "kl_loss_coef", 0.0)),
        "kl_estimator": estimator,
        "kl_clamp": clamp,
    }


def aggregation_of(config: Any) -> str:
    """``loss_agg_mode``; ValueError when the core has no counterpart."""
    agg = str(field_of(config, "loss_agg_mode", "token-mean"))
    if agg not in VERL_AGGREGATIONS:
        raise ValueError(f"loss_agg_mode={agg!r}: GMTS covers verl's {list(VERL_AGGREGATIONS)}")
    return agg


def objective_builder(
    name: str, forced_aggregation: str | None = None, **fields: Any
) -> Callable[[Any], ObjectiveConfig]:
    """``actor config -> ObjectiveConfig`` for the core objective ``name``: ``fields`` are
    constants or functions of the config; the KL from ``kl_loss_type``; the aggregation
    ``forced_aggregation`` (a loss that ignores ``loss_agg_mode``) or ``loss_agg_mode``."""

    def build(config: Any) -> ObjectiveConfig:
        values = {k: (v(config) if callable(v) else v) for k, v in fields.items()}
        return ObjectiveConfig(
            name=name,
            **values,
            **kl_fields(config),
            aggregation=forced_aggregation or aggregation_of(config),
        )

    return build
