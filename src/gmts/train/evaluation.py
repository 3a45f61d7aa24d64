"""Held-out evaluation of a policy on a built-in task: average@k and pass@k.

Sampling uses a fixed seed (independent of the training step) so that "before" and "after"
numbers are measured on the same questions with the same random stream.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@torch.no_grad()
def evaluate_policy(
    model: Any,
    tokenizer: Any,
    task: Any,
    *,
    n_questions: int = 100,
    k: int = 16,
    seed: int = 0,
    batch_size: int | None = None,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Sample ``k`` answers (temperature 1.0) for each of ``n_questions`` held-out questions.

    Returns ``{"average@k": mean correctness, "pass@k": share of questions with a correct
    answer, "questions": n}`` (k written out, e.g. ``average@16``).
    """
    from gmts.train.rollout import generate_rollouts

    problems = task.held_out(n_questions)
    roll = generate_rollouts(
        model,
        tokenizer,
        problems,
        num_samples=k,
        max_new_tokens=task.max_new_tokens,
        temperature=temperature,
        batch_size=batch_size,
        seed=10_007 + seed,
    )
    correct = torch.tensor(
        [task.reward(c, a) >= 1.0 for c, a in zip(roll.completions, roll.answers)],
        dtype=torch.float64,
    ).reshape(len(problems), k)  # (Q, k)
    per_question = correct.sum(dim=1).long().tolist()
    return {
        f"average@{k}": float(correct.mean()),
        f"pass@{k}": sum(_pass_at_k(k, c, k) for c in per_question) / len(problems),
        "questions": float(len(problems)),
    }
