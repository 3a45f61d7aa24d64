"""Group-relative advantages (GRPO, Dr.GRPO) and DAPO's dynamic-sampling filter."""

from __future__ import annotations

import torch

__all__ = ["STD_ESTIMATORS", "group_advantages", "dynamic_sampling_keep"]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        raise ValueError("rewards must be a 1-D torch.Tensor of shape (B,)")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"group_size={group_size} must divide the number of rewards B={rewards.shape[0]} "
            "(rows are consecutive groups of group_size answers to one question)"
        )
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")
    return rewards.reshape(-1, group_size)  # (B // G, G)


STD_ESTIMATORS = ("unbiased", "population")
"""The group std of GRPO's advantage: ``unbiased`` (divide by G - 1: torch.std, TRL, verl) or
``population`` (divide by G: numpy's np.std, the authors' GMTS code)."""


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    std_normalize: bool = True,
    std: str = "unbiased",
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_i = (R_i - mean(R_group)) / (std(R_group) + eps)  (GRPO), or R_i - mean (Dr.GRPO).

    Args:
        rewards: ``(B,)``; rows ``[g*G, (g+1)*G)`` are the G answers to question g.
        group_size: G, which must divide B.
        std_normalize: divide by the group's standard deviation; False gives Dr.GRPO's
            mean-centred advantage.
        std: which standard deviation (:data:`STD_ESTIMATORS`): ``unbiased`` (torch.std, TRL,
            verl; the default) or ``population`` (np.std, the authors' code: A is then
            sqrt(G / (G - 1)) times larger in magnitude, 1.033x at G = 16).
        eps: added to the std; a group with equal rewards gets advantage 0.

    Returns:
        ``(B,)`` advantages in the dtype of ``rewards`` (float32 for integer rewards).
    """
    if std not in STD_ESTIMATORS:
        raise ValueError(f"std must be one of {list(STD_ESTIMATORS)}, got {std!r}")
    grouped = _grouped(rewards, group_size)
    grouped = grouped if grouped.dtype.is_floating_point else grouped.float()
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (B // G, G)
    if std_normalize:
        if std == "population":
            spread = grouped.std(dim=1, keepdim=True, correction=0)
        elif group_size > 1:
            spread = grouped.std(dim=1, keepdim=True)
        else:
            spread = torch.zeros_like(centred)
        centred = centred / (spread + eps)
    return centred.reshape(-1)


def dynamic_sampling_keep(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic sampling: keep the groups whose rewards are not all equal.

    Args:
        rewards: ``(B,)`` grouped as in :func:`group_advantages`.

    Returns:
        ``(B // group_size,)`` bool, True for groups with at least two distinct rewards.
    """
    grouped = _grouped(rewards, group_size)
    return grouped.amax(dim=1) != grouped.amin(dim=1)
