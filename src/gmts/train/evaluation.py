"""Held-out evaluation of a policy on a built-in task: average@k and pass@k.

Sampling uses a fixed seed (independent of the training step) so that "before" and "after"
numbers are measured on the same questions with the same random stream.
"""

from __future__ import annotations

from typing import Any

EVAL_SEED_OFFSET = 10_007


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
    """Sample ``k`` answers for each of ``n_questions`` held-out questions of ``task``.

    Returns ``{"average@k": ..., "pass@k": ..., "questions": n}`` (k written out, e.g.
    ``average@16``), computed by :func:`gmts.embedded.evaluation.evaluate_task`.
    """
    from gmts.embedded.evaluation import evaluate_task

    result = evaluate_task(
        model,
        tokenizer,
        task,
        task.held_out(n_questions),
        n=k,
        temperature=temperature,
        batch_size=batch_size or 4096,
        seed=EVAL_SEED_OFFSET + seed,
    )
    return {
        f"average@{k}": float(result.average_at_n),
        f"pass@{k}": float(result.pass_at_n),
        "questions": float(n_questions),
    }
