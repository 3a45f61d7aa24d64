"""Importance ratios pi_theta / pi_old at the three levels the engines use.

With ``x_t = log pi_theta(o_t) - log pi_old(o_t)`` and ``|o_i|`` the valid tokens of row i:

    token           r_t = exp(x_t)                                     (PPO, GRPO, DAPO)
    sequence        s_i = exp(mean_{t in M_i} x_t), the same for every token of row i, with
                    its gradient through the mean: d s_i / d log pi_t = s_i / |o_i|
                    (GSPO; TRL importance_sampling_level="sequence")
    sequence-token  r_t = exp(sg[log s_i] + log pi_t - sg[log pi_t]): the value s_i, the
                    gradient of a token ratio: d r_t / d log pi_t = s_i (GSPO-token; verl's
                    loss_mode=gspo)

The log ratio is clamped to ``[log_ratio_min, log_ratio_max]`` when they are set (verl clamps
x to [-20, 20] in most losses and log s_i at 10 in gspo); outside the range (strictly) the
ratio carries no gradient, as ``torch.clamp`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmts.core.objectives.inputs import ObjectiveInputs

__all__ = ["RATIO_LEVELS", "Ratio", "importance_ratio"]

RATIO_LEVELS = ("token", "sequence", "sequence-token")


@dataclass(frozen=True)
class Ratio:
    """One importance ratio, ``(B, T)`` (row-constant at the sequence levels).

    Attributes:
        value: the ratio, carrying its gradient.
        in_range: bool, the log ratio was inside the clamp range (the ratio's gradient flows).
        level: one of :data:`RATIO_LEVELS`.
    """

    value: torch.Tensor
    in_range: torch.Tensor
    level: str

    @property
    def detached(self) -> torch.Tensor:
        return self.value.detach()

    def coefficient(self, inputs: ObjectiveInputs, g: torch.Tensor) -> torch.Tensor:
        """omega of ``sum_{t in M} f_t(ratio)`` given ``g = w * df_t / d ratio`` ``(B, T)``.

        ``d/d log pi_t sum_{t'} f_t'(ratio_t')`` is ``g_t * r_t`` at the token levels and
        ``s_i * mean_{t' in M_i} g_t'`` at the sequence level (every token of a row shares it),
        times the clamp indicator.
        """
        if self.level == "sequence":
            g = inputs.row_mean(g)[:, None].expand_as(g)
        return g * self.detached * self.in_range


def _clamp_log(
    x: torch.Tensor, low: float | None, high: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if low is None and high is None:
        return x, torch.ones(x.shape, dtype=torch.bool, device=x.device)
    inside = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    xd = x.detach()
    if low is not None:
        inside &= xd >= low
    if high is not None:
        inside &= xd <= high
    return torch.clamp(x, min=low, max=high), inside


def importance_ratio(
    inputs: ObjectiveInputs,
    level: str,
    log_min: float | None = None,
    log_max: float | None = None,
) -> Ratio:
    """The ratio of ``inputs`` at ``level`` (see the module docstring); ``(B, T)``."""
    x = inputs.logprobs - inputs.old_logprobs  # (B, T), 0 at padding
    if level == "token":
        x, inside = _clamp_log(x, log_min, log_max)
        return Ratio(torch.exp(x), inside, level)
    seq = inputs.row_mean(x)  # (B,) mean log ratio over the valid tokens
    if level == "sequence":
        seq, inside = _clamp_log(seq, log_min, log_max)
        b, t = x.shape
        return Ratio(torch.exp(seq)[:, None].expand(b, t), inside[:, None].expand(b, t), level)
    if level == "sequence-token":
        lp = inputs.logprobs
        combined = (lp - lp.detach()) + seq.detach()[:, None]  # (B, T), exactly log s_i
        combined, inside = _clamp_log(combined, log_min, log_max)
        return Ratio(torch.exp(combined), inside, level)
    raise ValueError(f"ratio_level must be one of {list(RATIO_LEVELS)}, got {level!r}")
