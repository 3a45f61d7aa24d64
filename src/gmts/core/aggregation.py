"""Aggregations: how per-token losses of a batch become one number, as a small registry.

An aggregation is data, not code: what its divisor counts (tokens, rows or nothing) and
whether each row is first divided by its own length. With ``x`` a ``(B, T)`` per-token value,
``P`` the tokens that carry it and ``M`` the response mask (``|o_i|`` = valid tokens of row i):

    token-mean               sum_{P} x                / D      D = a token count  (DAPO, eq. 2)
    seq-mean-token-mean      sum_i sum_{P_i} x / |o_i| / D      D = a row count    (GRPO eq. 1)
    seq-mean-token-sum       sum_{P} x                / D      D = a row count
    seq-mean-token-sum-norm  sum_{P} x                / (D H)  D = a row count, H = a fixed
                                                               horizon (Dr.GRPO: the maximum
                                                               response length)
    sum                      sum_{P} x                         D = 1

The divisor D is not the aggregation's business: :class:`gmts.core.loss.LossConfig` decides
which count it is (selected or all tokens, the batch or each question group) and computes it
once per mini-batch; the horizon H is ``LossConfig.horizon``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmts._registry import Registry

__all__ = [
    "Aggregation",
    "AGGREGATIONS",
    "register_aggregation",
    "get_aggregation",
    "available_aggregations",
]

DIVISOR_UNITS = ("tokens", "rows", "none")


@dataclass(frozen=True)
class Aggregation:
    """One way to reduce ``(B, T)`` token values to a scalar.

    Attributes:
        name: registry name (verl's ``loss_agg_mode`` spelling).
        divisor: what the divisor counts: ``"tokens"``, ``"rows"`` (rows with at least one
            valid token) or ``"none"`` (divide by 1).
        row_mean: divide each row's sum by its number of valid tokens ``|o_i|`` first.
        help: one line for the docs.
        horizon: divide further by a constant horizon H (``LossConfig.horizon``).
    """

    name: str
    divisor: str
    row_mean: bool
    help: str
    horizon: bool = False

    def __post_init__(self) -> None:
        if self.divisor not in DIVISOR_UNITS:
            raise ValueError(f"divisor must be one of {list(DIVISOR_UNITS)}, got {self.divisor!r}")

    def token_weights(self, mask: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` weight of each token inside its row: ``1/|o_i|`` with ``row_mean``, else 1.

        Args:
            mask: ``(B, T)`` bool response mask.
        """
        if not self.row_mean:
            return torch.ones(mask.shape, dtype=torch.float64, device=mask.device)
        lengths = mask.sum(-1, keepdim=True).clamp_min(1).double()  # (B, 1)
        return mask.double() / lengths

    def total(
        self, values: torch.Tensor, carriers: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The numerator: ``values`` (B, T) summed over ``carriers`` (bool (B, T)), each row
        divided by its valid-token count ``mask.sum(-1)`` first when ``row_mean``."""
        summed = torch.where(carriers, values, torch.zeros_like(values))  # (B, T)
        if not self.row_mean:
            return summed.sum()
        lengths = mask.sum(-1).clamp_min(1).to(values.dtype)  # (B,)
        return (summed.sum(-1) / lengths).sum()


_AGGREGATIONS = Registry[Aggregation]("aggregation")


register_aggregation = _AGGREGATIONS.register
get_aggregation = _AGGREGATIONS.get
available_aggregations = _AGGREGATIONS.names


register_aggregation(
    Aggregation("token-mean", "tokens", False, "sum over the tokens / a token count (DAPO)")
)
register_aggregation(
    Aggregation(
        "seq-mean-token-mean",
        "rows",
        True,
        "mean over rows of each row's sum / its valid-token count (GRPO eq. 1)",
    )
)
register_aggregation(
    Aggregation("seq-mean-token-sum", "rows", False, "mean over rows of each row's token sum")
)
register_aggregation(
    Aggregation(
        "seq-mean-token-sum-norm",
        "rows",
        False,
        "each row's token sum / a fixed horizon H, mean over rows (Dr.GRPO; verl)",
        horizon=True,
    )
)
register_aggregation(Aggregation("sum", "none", False, "plain sum (no divisor)"))

AGGREGATIONS: tuple[str, ...] = tuple(_AGGREGATIONS)
"""The built-in aggregation names, in registration order."""
