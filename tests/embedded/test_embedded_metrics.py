"""average@k and the unbiased pass@k estimator, by hand and against the binomial formula."""

from __future__ import annotations

import math

import pytest
import torch

from gmts.core.metrics import average_at_k, pass_at_k


def _pass_at_k_reference(correct: torch.Tensor, k: int) -> float:
    n = correct.shape[1]
    values = [1.0 - math.comb(n - int(c), k) / math.comb(n, k) for c in correct.sum(dim=1)]
    return sum(values) / len(values)


def test_average_at_k_by_hand():
    assert average_at_k([[1, 0, 0, 0], [1, 1, 1, 1]]) == pytest.approx(5 / 8)
    assert average_at_k(torch.tensor([[True, False]])) == pytest.approx(0.5)
    assert average_at_k([[0.5, 1.0]]) == pytest.approx(0.75)


def test_pass_at_k_by_hand():
    assert pass_at_k([[1, 0]], 1) == pytest.approx(0.5)
    assert pass_at_k([[1, 0, 0, 0]], 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k([[1, 1, 0, 0]], 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k([[0, 0, 0]], 3) == 0.0
    assert pass_at_k([[1, 1, 1]], 3) == 1.0
    assert pass_at_k([[1, 0, 0], [0, 0, 0]], 3) == pytest.approx(0.5)
    # with k = 1 the estimator is the average
    assert pass_at_k([[1, 0, 1, 1]], 1) == pytest.approx(average_at_k([[1, 0, 1, 1]]))


def test_pass_at_k_matches_binomial_formula():
    gen = torch.Generator().manual_seed(0)
    for n in (1, 5, 16, 40):
        correct = torch.rand(30, n, generator=gen) < torch.rand(30, 1, generator=gen)
        for k in {1, max(1, n // 2), n}:
            assert pass_at_k(correct, k) == pytest.approx(
                _pass_at_k_reference(correct, k), abs=1e-12
            )


def test_metrics_bad_input():
    with pytest.raises(ValueError, match="k must"):
        pass_at_k([[1, 0]], 3)
    with pytest.raises(ValueError, match="k must"):
        pass_at_k([[1, 0]], 0)
    with pytest.raises(ValueError, match=r"\(Q, n\)"):
        average_at_k([1, 0, 1])
    with pytest.raises(ValueError, match="empty"):
        average_at_k(torch.zeros(0, 4))
