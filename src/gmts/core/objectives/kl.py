"""KL estimators to the reference policy, a registry with one signature, and their omega.

Per token, with ``d = log pi_theta(o_t) - log pi_ref(o_t)`` (so ``rho = pi_ref / pi_theta =
exp(-d)``), every estimator gives a value ``D`` and its derivative ``dD / d log pi_theta``:

    k1    D = d                                  dD = 1                 (verl "kl" / "k1")
    k2    D = d^2 / 2                            dD = d                 (verl "mse" / "k2")
    k3    D = rho - log(rho) - 1 = e^-d + d - 1  dD = 1 - rho           (Schulman; TRL; verl "low_var_kl" / "k3")
    abs   D = |d|                                dD = sign(d)           (verl "abs")
    k1+, k3+, abs+: the value of k1 / k3 / abs with the gradient of k2 (straight-through: the
          unbiased KL gradient; verl's "+" suffix)

Options shared by every estimator (``ObjectiveConfig``): ``kl_clamp = c`` clamps D to
``[-c, c]`` (verl clamps low_var_kl to [-10, 10]; strictly outside, D carries no gradient,
except the straight-through estimators, whose gradient is k2's whatever the clamp), and
``kl_ratio_correction`` multiplies D by the objective's importance ratio with its gradient
(TRL's ``use_bias_correction_kl``: ``per_token_kl * coef_1``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gmts._registry import Registry
from gmts.core.objectives.inputs import ObjectiveInputs
from gmts.core.objectives.ratio import Ratio

__all__ = [
    "KLEstimator",
    "available_kl_estimators",
    "get_kl_estimator",
    "register_kl_estimator",
    "kl_term",
    "kl_omega",
]

KLFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KLEstimator:
    """A per-token KL estimate as a function of ``d = log pi_theta - log pi_ref`` ``(B, T)``.

    Attributes:
        name: registry name.
        value: ``d -> D`` (carries the gradient of d).
        grad: ``d -> dD/dd`` (closed form, detached inputs).
        straight_through: the gradient is k2's (``d``) whatever the value and the clamp.
        help: one line for the docs.
    """

    name: str
    value: KLFn
    grad: KLFn
    straight_through: bool = False
    help: str = ""


_KL = Registry[KLEstimator]("KL estimator")


register_kl_estimator = _KL.register
get_kl_estimator = _KL.get
available_kl_estimators = _KL.names


def _k3(d: torch.Tensor) -> torch.Tensor:
    return torch.exp(-d) + d - 1


register_kl_estimator(KLEstimator("k1", lambda d: d, torch.ones_like, help="log(pi/pi_ref)"))
register_kl_estimator(
    KLEstimator("k2", lambda d: 0.5 * d * d, lambda d: d, help="(log(pi/pi_ref))^2 / 2")
)
register_kl_estimator(
    KLEstimator(
        "k3", _k3, lambda d: 1 - torch.exp(-d), help="pi_ref/pi - log(pi_ref/pi) - 1 (>= 0)"
    )
)
register_kl_estimator(KLEstimator("abs", torch.abs, torch.sign, help="|log(pi/pi_ref)|"))
for _base in ("k1", "k3", "abs"):
    _est = get_kl_estimator(_base)
    register_kl_estimator(
        KLEstimator(
            f"{_base}+",
            _est.value,
            lambda d: d,
            straight_through=True,
            help=f"the value of {_base}, the gradient of k2 (straight-through)",
        )
    )


def kl_term(
    inputs: ObjectiveInputs,
    estimator: str,
    clamp: float | None,
    ratio: Ratio | None,
) -> torch.Tensor:
    """``(B, T)`` KL estimate D with its gradient (zeros without reference log-probs).

    ``ratio``: multiply D by this importance ratio (with its gradient), or None.
    """
    if inputs.ref_logprobs is None:
        return torch.zeros_like(inputs.logprobs)
    est = get_kl_estimator(estimator)
    d = inputs.logprobs - inputs.ref_logprobs  # (B, T)
    value = est.value(d)
    if clamp is not None:
        value = value.clamp(-clamp, clamp)
    if est.straight_through:  # forward: the (clamped) value; backward: k2's gradient
        k2 = 0.5 * d * d
        value = k2 - k2.detach() + value.detach()
    if ratio is not None:
        value = value * ratio.value
    return value


def kl_omega(
    inputs: ObjectiveInputs,
    estimator: str,
    clamp: float | None,
    ratio: Ratio | None,
) -> torch.Tensor:
    """``d/d log pi_t sum_{t' in M} D_t'`` ``(B, T)``, detached (the KL's part of omega is
    ``-kl_coef`` times this). With the ratio correction: the product rule, summed over the row
    at the sequence level (``D_t' s_i`` depends on every token of the row)."""
    if inputs.ref_logprobs is None:
        return torch.zeros_like(inputs.logprobs)
    est = get_kl_estimator(estimator)
    with torch.no_grad():
        d = inputs.logprobs.detach() - inputs.ref_logprobs
        value = est.value(d)
        grad = est.grad(d)
        if clamp is not None:
            if not est.straight_through:
                grad = torch.where(value.abs() > clamp, torch.zeros_like(grad), grad)
            value = value.clamp(-clamp, clamp)
        if ratio is None:
            return grad
        r = ratio.detached
        own = r * grad  # the ratio times dD_t
        # the ratio's own gradient times the D it multiplies (whole row at the sequence level)
        carried = value if ratio.level != "sequence" else inputs.row_mean(value)[:, None]
        return own + ratio.in_range * r * carried.expand_as(r)
