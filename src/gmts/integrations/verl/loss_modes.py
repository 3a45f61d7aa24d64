"""verl's policy loss modes as GMTS composes them: a registry with one signature.

Every ``actor.policy_loss.loss_mode`` of verl 0.9.1 (``core_algos``) is one :class:`LossMode`:
the core objective whose omega and aggregation its loss has, the policy term of a micro-batch
with a selection (verl's own function, :mod:`~gmts.integrations.verl.terms`), the importance
weights that term applies (folded into omega), and, where omega cannot be known before verl's
loss runs, the mathematical obstacle: omega-based scores are refused with it, while entropy and
random scores, which need no omega, compose with verl's function unchanged. clip_cov and kl_cov
pick tokens by a covariance over the batch their loss sees: with an omega score the pick is
made once over the mini-batch before the selection (the core's clip-cov / kl-cov), since a
token's omega depends on it; with other scores verl's own function picks per micro-batch.
:func:`check_actor_config` lists everything GMTS refuses for an actor config, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gmts._registry import Registry
from gmts.core.objectives import ObjectiveConfig
from gmts.core.support import refuse
from gmts.integrations.verl import bypass, terms
from gmts.integrations.verl.actor_config import (
    ROW_MEAN,
    VERL_AGGREGATIONS,
    clip_high,
    clip_low,
    field_of,
    kl_fields,
    loss_mode_name,
    objective_builder,
    policy_loss_config,
    rollout_correction,
)
from gmts.integrations.verl.settings import ENGINE

__all__ = [
    "LOSS_MODES",
    "LossMode",
    "available_loss_modes",
    "check_actor_config",
    "get_loss_mode",
    "objective_from_actor_config",
]

WeightsFn = Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor, Any], Any]
CheckFn = Callable[[Any, Any], list[str]]


def _batch_weights(
    config: Any,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor | None:
    """The batch's ``rollout_is_weights`` (what every mode but bypass_mode applies)."""
    return rollout_is_weights


def _no_checks(config: Any, settings: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class LossMode:
    """One verl ``policy_loss.loss_mode`` as GMTS composes it.

    Attributes:
        name: verl's loss_mode.
        objective: ``actor config -> ObjectiveConfig``: the core objective whose omega and
            aggregation the loss has (with an ``omega_obstacle``: only its aggregation and KL
            are used).
        policy_term: ``MicroBatch -> (pg_loss, metrics)``: the policy term of a micro-batch
            with a selection.
        importance_weights: ``(config, logprobs, old_logprobs, response_mask, batch weights)
            -> (B, R) weights or None``: the weights the term multiplies into the policy term.
        omega_obstacle: why omega cannot be known before the loss runs, or None (exact).
        checks: ``(config, settings) -> problems``: the mode's own refusals.
        forced_aggregation: the aggregation verl's function applies whatever ``loss_agg_mode``
            says (sapo, geo_mean), or None.
        help: one line for the docs.
    """

    name: str
    objective: Callable[[Any], ObjectiveConfig]
    policy_term: terms.PolicyTermFn
    importance_weights: WeightsFn = _batch_weights
    omega_obstacle: str | None = None
    checks: CheckFn = _no_checks
    forced_aggregation: str | None = None
    help: str = ""


LOSS_MODES: Registry[LossMode] = Registry("verl loss mode")


def get_loss_mode(name: str) -> LossMode:
    """The loss mode called ``name``; ValueError naming the known ones otherwise."""
    if name not in LOSS_MODES:
        raise ValueError(
            f"policy_loss.loss_mode={name!r}: not one of verl 0.9.1's loss modes GMTS knows "
            f"({', '.join(LOSS_MODES.names())}); a loss registered elsewhere has no known omega "
            "or per-token composition"
        )
    return LOSS_MODES.get(name)


def available_loss_modes() -> list[str]:
    """The loss modes GMTS composes with, sorted."""
    return LOSS_MODES.names()


def objective_from_actor_config(config: Any) -> ObjectiveConfig:
    """verl's actor objective as a core ``ObjectiveConfig`` (what omega must differentiate).

    ValueError naming the problem for a loss mode, KL type or aggregation GMTS does not know.
    """
    return get_loss_mode(loss_mode_name(config)).objective(config)


# --------------------------------------------------------------------------------------------
# the modes

_CLAMP20 = {"log_ratio_min": -20.0, "log_ratio_max": 20.0}  # verl: vanilla, sapo, cispo, dppo


def _clip_ratio_c(config: Any) -> float:
    return float(field_of(config, "clip_ratio_c", 3.0))


_vanilla = objective_builder(
    "ppo", clip_low=clip_low, clip_high=clip_high, dual_clip=_clip_ratio_c, **_CLAMP20
)
_gpg = objective_builder("gpg")


def _dppo(name: str) -> Callable[[Any], ObjectiveConfig]:
    return objective_builder(
        name, clip_low=clip_low, clip_high=clip_high, ratio_cap=_clip_ratio_c, **_CLAMP20
    )


def _bypass_objective(config: Any) -> ObjectiveConfig:
    """ppo_clip: vanilla (the rejections as weights); reinforce: gpg (-A log pi w)."""
    loss_type = rollout_correction(config)["loss_type"]
    if loss_type not in bypass.LOSS_TYPES:
        raise ValueError(
            f"policy_loss.rollout_correction.loss_type={loss_type!r}: verl's bypass_mode knows "
            f"{list(bypass.LOSS_TYPES)}"
        )
    return _gpg(config) if loss_type == "reinforce" else _vanilla(config)


def _dro_checks(config: Any, settings: Any) -> list[str]:
    beta = field_of(policy_loss_config(config), "dro_beta", None)
    if beta is None or not float(beta) > 0:
        return [f"policy_loss.dro_beta={beta!r}: loss_mode=dro needs dro_beta > 0 (verl raises)"]
    return []


def _one_aggregation_checks(mode: str) -> CheckFn:
    """sapo and geo_mean aggregate their policy term by rows whatever loss_agg_mode; verl's KL
    follows loss_agg_mode."""

    def check(config: Any, settings: Any) -> list[str]:
        agg = str(field_of(config, "loss_agg_mode", "token-mean"))
        kl_on = bool(field_of(config, "use_kl_loss", False))
        if settings.selection.normalize == "all" and kl_on and agg != ROW_MEAN:
            return [
                f"loss_mode={mode} aggregates its policy term by {ROW_MEAN} whatever "
                f"loss_agg_mode, and verl aggregates the KL loss by loss_agg_mode={agg!r}; the "
                "core's loss under normalize='all' has one aggregation for both: set "
                f"loss_agg_mode={ROW_MEAN} or normalize='selected'"
            ]
        return []

    return check


def _policy_loss_field(name: str, fallback: float) -> Callable[[Any], float]:
    """``policy_loss.<name>``, else ``fallback`` (what verl's function uses when it is None)."""
    return lambda config: float(field_of(policy_loss_config(config), name, fallback))


# verl's clip_cov / kl_cov (no dual clip, no log-ratio clamp); the fallbacks are their functions'
_clip_cov = objective_builder(
    "clip-cov",
    clip_low=clip_low,
    clip_high=clip_high,
    clip_cov_ratio=_policy_loss_field("clip_cov_ratio", 0.0002),
    clip_cov_lb=_policy_loss_field("clip_cov_lb", 1.0),
    clip_cov_ub=_policy_loss_field("clip_cov_ub", 5.0),
)
_kl_cov = objective_builder(
    "kl-cov",
    kl_cov_ratio=_policy_loss_field("kl_cov_ratio", 0.0002),
    kl_cov_coef=_policy_loss_field("ppo_kl_coef", 1.0),
)

for _mode in (
    LossMode(
        "vanilla",
        _vanilla,
        terms.weighted_term("vanilla"),
        help="ppo; dual clip clip_ratio_c (A < 0); log r clamped to [-20, 20]",
    ),
    LossMode(
        "gspo",
        objective_builder(
            "ppo",
            ratio_level="sequence-token",
            clip_low=clip_low,
            clip_high=clip_high,
            log_ratio_max=10.0,
        ),
        terms.weighted_term("gspo"),
        help="ppo, ratio_level=sequence-token (GSPO-token); combined log ratio clamped at 10",
    ),
    LossMode(
        "sapo",
        objective_builder(
            "sapo",
            forced_aggregation=ROW_MEAN,
            sapo_tau_pos=lambda c: float(field_of(c, "tau_pos", 1.0)),
            sapo_tau_neg=lambda c: float(field_of(c, "tau_neg", 1.05)),
            **_CLAMP20,
        ),
        terms.weighted_term("sapo", forced_aggregation=ROW_MEAN),
        checks=_one_aggregation_checks("sapo"),
        forced_aggregation=ROW_MEAN,
        help="sapo (tau_pos, tau_neg); verl aggregates it by seq-mean-token-mean",
    ),
    LossMode(
        "cispo",
        objective_builder("cispo", clip_low=clip_low, clip_high=clip_high, **_CLAMP20),
        terms.weighted_term("cispo"),
        help="cispo: the detached ratio clamped to [1 - clip_ratio_low, 1 + clip_ratio_high]",
    ),
    LossMode(
        "geo_mean",
        objective_builder(
            "gmpo", forced_aggregation=ROW_MEAN, clip_low=clip_low, clip_high=clip_high
        ),
        terms.geo_mean_term,
        checks=_one_aggregation_checks("geo_mean"),
        forced_aggregation=ROW_MEAN,
        help="gmpo (log-space clip bounds); verl takes a mean over each micro-batch's rows",
    ),
    LossMode("gpg", _gpg, terms.weighted_term("gpg"), help="gpg: -A log pi"),
    LossMode(
        "dppo_tv",
        _dppo("dppo-tv"),
        terms.weighted_term("dppo_tv"),
        help="dppo-tv: TV thresholds clip_ratio_low/high; ratio truncated at clip_ratio_c",
    ),
    LossMode(
        "dppo_kl",
        _dppo("dppo-kl"),
        terms.weighted_term("dppo_kl"),
        help="dppo-kl: binary-KL thresholds clip_ratio_low/high; ratio truncated at clip_ratio_c",
    ),
    LossMode(
        "dro",
        objective_builder(
            "dro", dro_beta=lambda c: field_of(policy_loss_config(c), "dro_beta", None)
        ),
        terms.weighted_term("dro"),
        checks=_dro_checks,
        help="dro (policy_loss.dro_beta)",
    ),
    LossMode(
        "clip_cov",
        _clip_cov,
        terms.picking_term("clip_cov", _clip_cov),
        help=(
            "clip-cov; an omega score picks over the mini-batch of every rank before the "
            "selection, other scores keep verl's pick per micro-batch"
        ),
    ),
    LossMode(
        "kl_cov",
        _kl_cov,
        terms.picking_term("kl_cov", _kl_cov),
        help=(
            "kl-cov; an omega score picks over the mini-batch of every rank before the "
            "selection, other scores keep verl's pick per micro-batch"
        ),
    ),
    LossMode(
        "bypass_mode",
        _bypass_objective,
        bypass.bypass_term,
        importance_weights=bypass.bypass_weights,
        checks=bypass.bypass_checks,
        help=(
            "ppo_clip: vanilla, rejections as 0/1 weights; reinforce: gpg with verl's IS "
            "weights times the rejections"
        ),
    ),
):
    LOSS_MODES.add(_mode.name, _mode)


# --------------------------------------------------------------------------------------------
# the check


def check_actor_config(config: Any, settings: Any) -> None:
    """Raise ``ValueError`` listing the verl actor settings GMTS cannot honour, each with why.

    Args:
        config: verl's ``ActorConfig``, its Hydra ``DictConfig`` or a dict of its fields.
        settings: ``GMTSVerlSettings``. Without a selection (score='none') the loss is verl's
            own ``ppo_loss`` and nothing is refused.
    """
    if not settings.selection.enabled:
        return
    problems: list[str] = []
    name = loss_mode_name(config)
    if name in LOSS_MODES:
        mode = LOSS_MODES.get(name)
        if settings.needs_omega and mode.omega_obstacle is not None:
            problems.append(
                f"score={settings.selection.score!r} needs omega: {mode.omega_obstacle}"
            )
        own = mode.checks(config, settings)
        problems.extend(own)
        if not own:
            try:
                mode.objective(config)
            except ValueError as err:
                problems.append(str(err))
    else:
        try:
            get_loss_mode(name)
        except ValueError as err:
            problems.append(str(err))
        try:
            kl_fields(config)
        except ValueError as err:
            problems.append(str(err))
    agg = str(field_of(config, "loss_agg_mode", "token-mean"))
    if agg not in VERL_AGGREGATIONS and not any(f"loss_agg_mode={agg!r}" in p for p in problems):
        problems.append(f"loss_agg_mode={agg!r}: GMTS covers verl's {list(VERL_AGGREGATIONS)}")
    refuse(ENGINE, problems)
