"""average@k and the unbiased pass@k estimator (Chen et al., 2021, "Evaluating Large Language
Models Trained on Code", eq. 1)."""

from __future__ import annotations

from typing import Any

import torch


def _as_matrix(correct: Any) -> torch.Tensor:
    matrix = torch.as_tensor(correct, dtype=torch.float64)
    if matrix.dim() != 2:
        raise ValueError(f"correct must be a (Q, n) matrix, got shape {tuple(matrix.shape)}")
    if matrix.numel() == 0:
        raise ValueError("correct must not be empty")
    return matrix


def average_at_k(correct: Any) -> float:
    """Mean correctness over all Q questions and k samples.

    Args:
        correct: (Q, k) bools or floats in [0, 1] (tensor, array or nested lists).
    """
    return float(_as_matrix(correct).mean().item())


def pass_at_k(correct: Any, k: int) -> float:
    """Unbiased estimate of the probability that at least one of k samples is correct.

    For a question with n samples of which c are correct, ``1 - C(n - c, k) / C(n, k)``, computed
    as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` to stay exact for large n; averaged over
    questions.

    Args:
        correct: (Q, n) bools (a float entry counts as correct when > 0.5).
        k: 1 <= k <= n.
    """
    matrix = _as_matrix(correct)
    n = matrix.shape[1]
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in [1, n={n}], got {k!r}")
    counts = (matrix > 0.5).sum(dim=1).tolist()
    total = 0.0
    for c in counts:
        if n - c < k:
            total += 1.0
            continue
        miss = 1.0
        for i in range(n - int(c) + 1, n + 1):
            miss *= 1.0 - k / i
        total += 1.0 - miss
    return total / len(counts)
