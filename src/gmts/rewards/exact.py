"""The ``exact`` reward: the completion itself is the answer (no extraction, no parsing).

For models that answer with nothing but the answer, such as the embedded tiny model (whose
tokenizer reads only ``0123456789+-*=>``; docs/training.md, "Your own data"): a JSONL of
questions in its alphabet trains it with ``data.reward=exact``.
"""

from __future__ import annotations

from gmts.rewards.registry import register_reward


@register_reward(
    "exact",
    description="the completion itself, character for character the gold answer (surrounding "
    "whitespace ignored)",
)
def exact_reward(completion: str, answer: str) -> float:
    """1.0 when ``completion`` equals ``answer`` after stripping surrounding whitespace."""
    return 1.0 if str(completion).strip() == str(answer).strip() else 0.0
