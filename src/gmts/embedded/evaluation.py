"""Evaluate a model on a built-in task: n samples per held-out question -> average@n, pass@n.

:func:`held_out_metrics` is the trainer's periodic evaluation: a fixed sampling seed
(independent of the training step), so "before" and "after" numbers are measured on the same
questions with the same random stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gmts.core.metrics import average_at_k, pass_at_k


@dataclass(frozen=True)
class TaskEvalResult:
    """Outcome of ``evaluate_task``.

    Attributes:
        average_at_n: mean reward over all Q x n samples (average@n).
        pass_at_n: fraction of questions with at least one correct sample (pass@n).
        n: samples per question.
        per_question: Q floats, each question's fraction of correct samples.
        mean_response_length: mean generated tokens per sample (EOS included).
    """

    average_at_n: float
    pass_at_n: float
    n: int
    per_question: list[float]
    mean_response_length: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_task(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    problems: Sequence[Any],
    *,
    n: int = 16,
    temperature: float = 1.0,
    batch_size: int | None = 4096,
    seed: int = 0,
) -> TaskEvalResult:
    """Sample ``n`` completions per problem and score them with ``task.reward``.

    Args:
        model, tokenizer: a causal LM and its tokenizer.
        task: has ``reward(completion, answer) -> float`` and ``max_new_tokens``.
        problems: Q problems with ``.prompt`` and ``.answer`` (e.g. ``task.held_out()``).
        n: samples per problem.
        temperature: sampling temperature (0: greedy, then all n samples agree).
        batch_size: rows per generation chunk (None: all Q * n at once).
        seed: sampling seed; the same seed gives the same result.
    """
    from gmts.sampling.rollout import generate_rollouts

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rollout = generate_rollouts(
        model,
        tokenizer,
        problems,
        num_samples=n,
        max_new_tokens=task.max_new_tokens,
        temperature=temperature,
        batch_size=batch_size,
        seed=seed,
    )
    rewards = torch.tensor(
        [task.reward(c, a) for c, a in zip(rollout.completions, rollout.answers)],
        dtype=torch.float64,
    ).reshape(len(problems), n)  # (Q, n)
    return TaskEvalResult(
        average_at_n=average_at_k(rewards),
        pass_at_n=pass_at_k(rewards >= 1.0, n),
        n=n,
        per_question=rewards.mean(dim=1).tolist(),
        mean_response_length=float(rollout.response_lengths.float().mean().item()),
    )


EVAL_SEED_OFFSET = 10_007
EVAL_BATCH_SIZE = 4096
"""Rows per generation chunk of :func:`held_out_metrics` when none is given."""


def held_out_metrics(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    *,
    n_questions: int = 100,
    k: int = 16,
    seed: int = 0,
    batch_size: int | None = None,
    temperature: float = 1.0,
) -> dict[str, float]:
    """``k`` samples for each of ``n_questions`` held-out questions of ``task``:
    ``{"average@k": ..., "pass@k": ..., "questions": n}`` (k written out, e.g. ``average@16``).
    """
    result = evaluate_task(
        model,
        tokenizer,
        task,
        task.held_out(n_questions),
        n=k,
        temperature=temperature,
        batch_size=batch_size or EVAL_BATCH_SIZE,
        seed=EVAL_SEED_OFFSET + seed,
    )
    return {
        f"average@{k}": float(result.average_at_n),
        f"pass@{k}": float(result.pass_at_n),
        "questions": float(n_questions),
    }
