"""Paired differences over seeds for ``gmts demo`` and the learning benchmark.

Two methods trained with the same seeds (the same warm start, the same question stream) are
compared seed by seed: the difference of a score (A - B) on each seed, their mean, their
standard deviation and a two-sided 95% Student t interval for the mean difference. An
interval that excludes 0 is a difference larger than the seed-to-seed spread; one that
includes it is not (with 3 seeds the interval is mean ± 2.48 standard deviations). Plain
Python, no scipy: the t quantiles are tabulated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PairedDifference", "mean_std", "paired_difference", "t_quantile_975"]

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""The 0.975 quantile of Student's t with 1-30 degrees of freedom (3 decimals)."""


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom (tabulated up to
    30; beyond, the Cornish-Fisher expansion around the normal's 1.960, within 1e-3)."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df!r}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, sample standard deviation); the deviation is None for fewer than 2 values."""
    if not values:
        raise ValueError("mean_std of no values")
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


@dataclass(frozen=True)
class PairedDifference:
    """A - B over paired seeds.

    Attributes:
        values: the per-seed differences A - B, in seed order.
        mean: their mean.
        std: their sample standard deviation (None with one seed).
        low, high: the two-sided 95% t interval for the mean difference (None with one seed).
        ahead: seeds on which A - B > 0.
        behind: seeds on which A - B < 0.
    """

    values: tuple[float, ...]
    mean: float
    std: float | None
    low: float | None
    high: float | None
    ahead: int
    behind: int

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def clear(self) -> bool | None:
        """Whether the interval excludes 0 (None with one seed: no interval)."""
        if self.low is None or self.high is None:
            return None
        return self.low > 0 or self.high < 0


def paired_difference(a: Sequence[float], b: Sequence[float]) -> PairedDifference:
    """``a[i] - b[i]`` for each seed ``i``, summarised (see :class:`PairedDifference`)."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired values need the same number (>= 1) of seeds: {len(a)} vs {len(b)}"
        )
    values = tuple(x - y for x, y in zip(a, b))
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"paired differences must be finite, got {values}")
    mean, std = mean_std(values)
    low = high = None
    if std is not None:
        half = t_quantile_975(len(values) - 1) * std / math.sqrt(len(values))
        low, high = mean - half, mean + half
    return PairedDifference(
        values=values,
        mean=mean,
        std=std,
        low=low,
        high=high,
        ahead=sum(v > 0 for v in values),
        behind=sum(v < 0 for v in values),
    )
