"""Benchmarks made by code: verifiable questions with disjoint train and test splits (their
rows; :mod:`gmts.data.benchmarks` registers them).

A generated benchmark needs no data folder and no hub: its rows are computed, the same on every
machine (no seeded RNG: each question's split and place come from a SHA-256 of its text). Used
like any other benchmark: ``data.dataset=addition-2digit`` (training, split ``train``),
``data.eval_dataset`` or ``gmts eval --benchmarks addition-2digit`` (split ``test``).

- ``addition-2digit``: "What is 23 + 45? Give the final answer as a number." for every pair of
  2-digit numbers (8,100 questions; 20% of them, chosen by hash, form the test split). The task
  a small instruction-tuned model has within reach: SmolLM2-135M-Instruct answers it in prose
  ("The answer is 68.") and got 12.5% of 128 answers right at temperature 0.7 (docs/results.md,
  "A real model"), so RL has signal from the first step. The reward is ``math`` (the last
  ``\\boxed{}``, or else the last number).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from gmts.data.datasets import Example

__all__ = ["TEST_FRACTION", "addition_example", "addition_rows", "ask_for_number", "split_of"]

TEST_FRACTION = 0.2
"""The share of a generated benchmark's questions in its test split."""


def _hash_unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (SHA-256), the same on every machine."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2.0**64


def split_of(key: str) -> str:
    """``"test"`` for the TEST_FRACTION of keys whose hash falls below it, else ``"train"``."""
    return "test" if _hash_unit(f"split/{key}") < TEST_FRACTION else "train"


def addition_rows(
    low: int, high: int, phrase: Callable[[int, int], str]
) -> Callable[[str], Iterator[dict[str, Any]]]:
    """``split -> rows`` of every ``a + b`` with ``low <= a, b <= high``: each row holds the
    question, its answer and its operands, in an order fixed by hash (not by the operands, so
    the first rows of a split are not all small numbers)."""

    def generate(split: str) -> Iterator[dict[str, Any]]:
        rows = []
        for a in range(low, high + 1):
            for b in range(low, high + 1):
                question = phrase(a, b)
                # a + b and b + a share a split: a test question is never a swapped train one
                if split_of(f"{min(a, b)}+{max(a, b)}") == split:
                    rows.append({"question": question, "answer": str(a + b), "a": a, "b": b})
        rows.sort(key=lambda row: _hash_unit(f"order/{row['question']}"))
        yield from rows

    return generate


def addition_example(row: dict[str, Any], index: int, split: str) -> Example:
    """The row parser of :func:`addition_rows`' rows."""
    meta = {"a": row["a"], "b": row["b"]}
    return Example(f"{split}-{row['a']}+{row['b']}", row["question"], row["answer"], meta)


def ask_for_number(a: int, b: int) -> str:
    """The question of ``addition-2digit``: the sum, asking for a number (not a format)."""
    return f"What is {a} + {b}? Give the final answer as a number."
