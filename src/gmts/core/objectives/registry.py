"""The objective registry: per-token loss terms and the exact gradient coefficient omega.

An objective is registered once with one signature: ``surrogate(inputs, config, ratio)`` gives
its per-token policy term ``s`` ``(B, T)`` (with gradient), and ``omega(inputs, config, ratio)``
its closed-form omega. The token objective of every registered objective is

    l_t = s_t - kl_coef * D_t        D: the KL estimator of ``config.kl_estimator``

and omega is defined, for every objective alike, as

    omega_t = d/d log pi_theta(o_t) of sum_{t' in M} l_t'

For a token-level objective that is ``d l_t / d log pi_t`` (the paper's omega). For a
sequence-level objective (GSPO's sequence ratio, GMPO's geometric mean), whose term ``s_t``
depends on every token of its row, it is the coefficient of token t's gradient when every
valid token carries the term; every token of a row then shares the policy part of omega
(GSPO), or shares it up to a per-token clip indicator (GMPO).

:func:`gradient_coefficient` computes omega from the closed forms (``method="analytic"``) or,
for any objective including a user's own whose ``omega`` is None, by autograd of exactly that
sum (``method="autograd"``). Tests check the two agree for every registered objective.

An objective may also pick tokens over the whole batch it sees (clip-cov, kl-cov: by the
covariance of advantage and log-prob, centred on the batch): its ``picks`` function. The pick
is a batch-level, piecewise-constant choice (never differentiated); the engines make it once
per update unit (:func:`objective_picks`, called by :func:`gmts.selection_step`) and hand it to
omega and to every micro-batch's loss (``picked=``), so that omega is the loss's coefficient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from gmts._registry import Registry
from gmts.core.objectives.inputs import ObjectiveInputs, Surrogate, TokenObjective
from gmts.core.objectives.kl import kl_omega, kl_term
from gmts.core.objectives.ratio import RATIO_LEVELS, Ratio, importance_ratio

if TYPE_CHECKING:
    from gmts.core.objectives.config import ObjectiveConfig

__all__ = [
    "OMEGA_METHODS",
    "Objective",
    "available_objectives",
    "get_objective",
    "gradient_coefficient",
    "loss_omega",
    "autograd_omega",
    "objective_picks",
    "objective_terms",
    "register_objective",
]

OMEGA_METHODS = ("analytic", "autograd")

SurrogateFn = Callable[[ObjectiveInputs, "ObjectiveConfig", Ratio], Surrogate]
OmegaFn = Callable[[ObjectiveInputs, "ObjectiveConfig", Ratio], torch.Tensor]
PicksFn = Callable[[ObjectiveInputs, "ObjectiveConfig", int, Any], torch.Tensor]


@dataclass(frozen=True)
class Objective:
    """A registered policy objective.

    Attributes:
        name: registry name (``ObjectiveConfig.name``).
        surrogate: ``(inputs, config, ratio) -> Surrogate``: the per-token policy term ``s``
            ``(B, T)`` with its gradient, importance weights applied as the engine applies them.
        omega: ``(inputs, config, ratio) -> (B, T)``: the closed-form policy part of omega
            (detached inputs), or None: omega by autograd of ``surrogate``.
        params: the ``ObjectiveConfig`` fields it reads besides the shared ones (name,
            aggregation, ratio_level, log_ratio_min/max, the KL fields); a non-default value of
            any other field is an error.
        ratio_levels: the ``ratio_level`` values it supports (the first is its default).
        formula: its omega in one line, for the docs.
        engines: where users meet it (engine option names), for the docs.
        picks: ``(inputs, config, seed, process_group) -> (B, T) bool``: the tokens the
            objective treats apart, chosen over the whole batch (global over the process
            group; ``seed`` seeds any random draw), read by ``surrogate`` and ``omega`` as
            ``inputs.picked``; None: no batch-level pick (module docstring).
    """

    name: str
    surrogate: SurrogateFn
    omega: OmegaFn | None
    params: frozenset[str]
    ratio_levels: tuple[str, ...] = ("token",)
    formula: str = ""
    engines: str = ""
    picks: PicksFn | None = None

    def __post_init__(self) -> None:
        unknown = set(self.ratio_levels) - set(RATIO_LEVELS)
        if not self.ratio_levels or unknown:
            raise ValueError(f"ratio_levels must be a non-empty subset of {list(RATIO_LEVELS)}")


_OBJECTIVES = Registry[Objective]("objective")


register_objective = _OBJECTIVES.register
get_objective = _OBJECTIVES.get
available_objectives = _OBJECTIVES.names


def _ratio(inputs: ObjectiveInputs, config: ObjectiveConfig) -> Ratio:
    return importance_ratio(inputs, config.ratio_level, config.log_ratio_min, config.log_ratio_max)


def objective_picks(
    config: ObjectiveConfig,
    inputs: ObjectiveInputs,
    *,
    seed: int = 0,
    process_group: Any = None,
) -> torch.Tensor | None:
    """``(B, T)`` bool: the tokens ``config``'s objective picks over the batch of ``inputs``
    (global over ``process_group``, every rank calling; ``seed`` seeds its draw), or None for
    an objective without a batch-level pick. Computed from detached values."""
    objective = get_objective(config.name)
    if objective.picks is None:
        return None
    with torch.no_grad():
        return objective.picks(inputs.detached(), config, int(seed), process_group)


def _with_picks(config: ObjectiveConfig, inputs: ObjectiveInputs) -> ObjectiveInputs:
    """``inputs`` with ``picked`` filled (over these rows, ``inputs.pick_seed``) when the
    objective picks and none was given."""
    if inputs.picked is not None or get_objective(config.name).picks is None:
        return inputs
    return replace(inputs, picked=objective_picks(config, inputs, seed=inputs.pick_seed))


def objective_terms(config: ObjectiveConfig, inputs: ObjectiveInputs) -> TokenObjective:
    """The per-token surrogate ``s``, KL ``D`` and clip masks of ``config``'s objective.

    Everything carries the gradient of ``inputs.logprobs``. The KL is zeros without
    reference log-probs; with ``kl_ratio_correction`` it is multiplied by the objective's
    importance ratio at ``config.ratio_level``.
    """
    objective = get_objective(config.name)
    inputs = _with_picks(config, inputs)
    ratio = _ratio(inputs, config)
    surrogate = objective.surrogate(inputs, config, ratio)
    kl = kl_term(
        inputs,
        config.kl_estimator,
        config.kl_clamp,
        ratio if config.kl_ratio_correction else None,
    )
    return TokenObjective(
        surrogate.value,
        kl,
        surrogate.clipped_low,
        surrogate.clipped_high,
        surrogate.dual_clipped,
    )


def gradient_coefficient(
    config: ObjectiveConfig,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    ref_logprobs: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
    method: str = "analytic",
    picked: torch.Tensor | None = None,
) -> torch.Tensor:
    """omega = d/d log pi_t of sum_{t' in M} l_t' for ``config``'s objective (module docstring).

    Args:
        config: the objective (an ``ObjectiveConfig``).
        logprobs, old_logprobs: ``(B, T)`` log pi_theta and log pi_old of the sampled tokens.
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` bool valid tokens M (None: every position). Sequence-level ratios
            average over it; padding never contributes.
        ref_logprobs: ``(B, T)`` log pi_ref, required when ``config.kl_coef > 0``.
        importance_weights: ``(B,)``/``(B, 1)``/``(B, T)`` rollout-correction weights >= 0
            the engine multiplies into the policy term (folded into omega exactly as the
            objective applies them), or None.
        method: ``"analytic"`` (the closed form; autograd for objectives without one) or
            ``"autograd"`` (always autograd of the objective's own terms).
        picked: ``(B, T)`` bool, the update unit's pick of an objective with one
            (:func:`objective_picks`); None: picked over these rows with seed 0.

    Returns:
        omega ``(B, T)`` in the dtype of ``logprobs``, detached; 0 at padded positions.
        Aggregation weights (1/|o_i|, 1/S) are not part of omega.
    """
    if method not in OMEGA_METHODS:
        raise ValueError(f"method must be one of {list(OMEGA_METHODS)}, got {method!r}")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs (B, T) are required when kl_coef > 0")
    inputs = ObjectiveInputs.of(
        logprobs.detach(),
        old_logprobs,
        advantages,
        mask,
        ref_logprobs=ref_logprobs if config.kl_coef > 0 else None,
        importance_weights=importance_weights,
        picked=picked,
    )
    objective = get_objective(config.name)
    inputs = _with_picks(config, inputs)
    if method == "autograd" or objective.omega is None:
        return autograd_omega(config, inputs)
    with torch.no_grad():
        ratio = _ratio(inputs, config)
        omega = objective.omega(inputs, config, ratio)
        if config.kl_coef > 0:
            kl_ratio = ratio if config.kl_ratio_correction else None
            omega = omega - config.kl_coef * kl_omega(
                inputs, config.kl_estimator, config.kl_clamp, kl_ratio
            )
        return torch.where(inputs.mask, omega, torch.zeros_like(omega))


def autograd_omega(config: ObjectiveConfig, inputs: ObjectiveInputs) -> torch.Tensor:
    """omega by autograd: ``d/d log pi`` of ``sum_M (s - kl_coef * D)``; ``(B, T)``, detached."""
    with torch.enable_grad():
        leaf = inputs.logprobs.detach().clone().requires_grad_(True)
        parts = objective_terms(config, inputs.with_logprobs(leaf))
        objective = parts.surrogate - config.kl_coef * parts.kl
        total = torch.where(inputs.mask, objective, torch.zeros_like(objective)).sum()
        if not total.requires_grad:  # an objective with no dependence on log pi
            return torch.zeros_like(leaf).detach()
        (grad,) = torch.autograd.grad(total, leaf, allow_unused=True)
    if grad is None:
        return torch.zeros_like(leaf).detach()
    return torch.where(inputs.mask, grad, torch.zeros_like(grad)).detach()


def loss_omega(
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``-d loss_fn(logprobs) / d logprobs`` ``(B, T)``: omega of ANY loss written as a function
    of the per-token log-probs (an engine's own loss function, a user's new objective), times
    that loss's aggregation weight of each token (1/N under a token-mean, 1/(R |o_i|) under
    seq-mean-token-mean). Under a token-mean it ranks tokens exactly as omega does.

    Args:
        loss_fn: ``(B, T) log-probs -> scalar loss`` (everything else bound inside it).
        logprobs: ``(B, T)`` current log-probs (detached here).
        mask: ``(B, T)`` bool; positions outside it get 0.
    """
    with torch.enable_grad():
        leaf = logprobs.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss_fn(leaf), leaf)
    omega = -grad.detach()
    if mask is not None:
        omega = torch.where(mask.bool(), omega, torch.zeros_like(omega))
    return omega
