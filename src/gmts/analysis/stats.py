"""Small statistics for the analysis reports: Pearson, Spearman, a least-squares slope, Jaccard.

Written here with numpy (no scipy at run time); the tests compare them with scipy. Every
function returns ``nan`` where the statistic is undefined (fewer than two points, or a
constant input) instead of raising, so one degenerate answer never aborts a report; callers
count and report the nans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

ArrayLike = torch.Tensor | np.ndarray | Sequence[float]

__all__ = [
    "ArrayLike",
    "as_array",
    "pearson",
    "spearman",
    "rankdata",
    "linear_fit",
    "jaccard",
    "summary",
]


def as_array(x: ArrayLike) -> np.ndarray:
    """A 1-D float64 numpy array from a tensor, array or sequence."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _pair(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x, y = as_array(x), as_array(y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    return x, y


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation of two equally long samples; nan if n < 2 or either is constant."""
    x, y = _pair(x, y)
    if x.size < 2:
        return math.nan
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(xc @ xc) * float(yc @ yc))
    if denom == 0.0 or not math.isfinite(denom):
        return math.nan
    return float(np.clip((xc @ yc) / denom, -1.0, 1.0))


def rankdata(x: ArrayLike) -> np.ndarray:
    """Ranks 1..n, ties given the mean of the ranks they span (as ``scipy.stats.rankdata``)."""
    x = as_array(x)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.arange(1, x.size + 1, dtype=np.float64)
    sorted_x = x[order]
    start = 0
    while start < x.size:  # average the ranks within each run of equal values
        stop = start + 1
        while stop < x.size and sorted_x[stop] == sorted_x[start]:
            stop += 1
        if stop - start > 1:
            ranks[order[start:stop]] = (start + 1 + stop) / 2.0
        start = stop
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation (Pearson of average ranks); nan if n < 2 or a side is constant."""
    x, y = _pair(x, y)
    return pearson(rankdata(x), rankdata(y))


def linear_fit(x: ArrayLike, y: ArrayLike) -> tuple[float, float]:
    """Least-squares ``y ~ intercept + slope * x``; ``(slope, intercept)``, nan if x is constant."""
    x, y = _pair(x, y)
    if x.size < 2:
        return math.nan, math.nan
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx == 0.0:
        return math.nan, math.nan
    slope = float(xc @ (y - y.mean())) / sxx
    return slope, float(y.mean() - slope * x.mean())


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a & b| / |a | b| of two boolean masks of one shape; nan when both are empty."""
    if a.shape != b.shape:
        raise ValueError(
            f"masks must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    a, b = a.bool(), b.bool()
    union = int((a | b).sum())
    return math.nan if union == 0 else int((a & b).sum()) / union


def summary(values: ArrayLike) -> dict[str, float | int]:
    """count / nan count / mean / std / quantiles of the finite values (JSON-ready floats)."""
    v = as_array(values)
    finite = v[np.isfinite(v)]
    out: dict[str, float | int] = {
        "count": int(finite.size),
        "undefined": int(v.size - finite.size),
    }
    if finite.size:
        q = np.quantile(finite, [0.1, 0.25, 0.5, 0.75, 0.9])
        out.update(
            mean=float(finite.mean()),
            std=float(finite.std()),
            min=float(finite.min()),
            q10=float(q[0]),
            q25=float(q[1]),
            median=float(q[2]),
            q75=float(q[3]),
            q90=float(q[4]),
            max=float(finite.max()),
        )
    return out
