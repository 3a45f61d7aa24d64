"""Our Pearson / Spearman / slope / Jaccard against scipy and hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gmts.analysis.stats import jaccard, linear_fit, pearson, rankdata, spearman, summary

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("seed", range(5))
def test_against_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    x = rng.integers(0, 6, n).astype(float)  # many ties
    y = x * rng.normal() + rng.normal(size=n)
    assert np.allclose(rankdata(x), scipy_stats.rankdata(x))
    assert math.isclose(pearson(x, y), scipy_stats.pearsonr(x, y)[0], rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(spearman(x, y), scipy_stats.spearmanr(x, y)[0], rel_tol=1e-9, abs_tol=1e-12)
    fit = scipy_stats.linregress(x, y)
    slope, intercept = linear_fit(x, y)
    assert math.isclose(slope, fit.slope, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(intercept, fit.intercept, rel_tol=1e-9, abs_tol=1e-12)


def test_hand_computed_cases():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 10, 100], [0.1, 0.2, 5.0]) == pytest.approx(1.0)  # monotone, not linear
    assert linear_fit([0, 1, 2], [1, 3, 5]) == pytest.approx((2.0, 1.0))
    assert rankdata([5, 1, 5, 3]).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_undefined_cases_are_nan_not_errors():
    assert math.isnan(pearson([1.0], [2.0]))
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))  # constant side
    assert math.isnan(spearman([2, 2], [1, 5]))
    assert all(math.isnan(v) for v in linear_fit([3, 3, 3], [1, 2, 3]))
    with pytest.raises(ValueError, match="same length"):
        pearson([1, 2], [1, 2, 3])


def test_jaccard_and_summary():
    a = torch.tensor([[True, True, False], [False, False, False]])
    b = torch.tensor([[True, False, True], [False, False, False]])
    assert jaccard(a, b) == pytest.approx(1 / 3)
    assert jaccard(a, a) == 1.0
    assert math.isnan(
        jaccard(torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool))
    )
    with pytest.raises(ValueError, match="same shape"):
        jaccard(a, b[:1])
    s = summary([1.0, 2.0, 3.0, math.nan])
    assert s["count"] == 3 and s["undefined"] == 1 and s["median"] == 2.0
    assert summary([math.nan]) == {"count": 0, "undefined": 1}
