"""Benchmarks made by code: verifiable questions with disjoint train and test splits (their
rows; :mod:`gmts.data.benchmarks` registers them).

A generated benchmark needs no data folder and no hub: its rows are computed, the same on every
machine (no seeded RNG: each question's split and place come from a SHA-256 of its text). Used
like any other benchmark: ``data.dataset=addition-2digit`` (training: without ``data.split`` a
run trains on the ``train`` split), ``data.eval_dataset`` or ``gmts eval --benchmarks
addition-2digit`` (split ``test``).

- ``addition-2digit``: "What is 23 + 45? Give the final answer as a number." for every pair of
  2-digit numbers (8,100 questions; 20% of them, chosen by hash, form the test split). The task
  a small instruction-tuned model has within reach: SmolLM2-135M-Instruct answers it in prose
  ("The answer is 68.") and got 12.5% of 128 answers right at temperature 0.7 (docs/results.md,
  "A real model"), so RL has signal from the first step. The reward is ``math`` (the last
  ``\\boxed{}``, or else the last number).
- ``word-problems-1digit``: "Tom has 5 apples and gets 3 more. How many apples does Tom have
  now? Think step by step, then give the final answer as a number." for every name and item
  (8 each) and every pair of numbers 2-9 (4,096 questions; the test split holds the 7 pairs of
  numbers, of 36, whose hash falls below TEST_FRACTION: 768 questions). A task whose right
  answers span several lines: SmolLM2-135M-Instruct got 15.2% of 256 answers right at
  temperature 0.7, and its right answers were 80 tokens long on average (docs/results.md,
  "A second real-model task"), where multi-step candidates (three operands, two-step word
  problems) and CommonsenseQA started below 11%. Reward ``math``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gmts.data.datasets import Example

__all__ = [
    "ITEMS",
    "NAMES",
    "TEST_FRACTION",
    "THINK",
    "addition_example",
    "addition_rows",
    "ask_for_number",
    "rows_of_split",
    "split_of",
    "word_problem",
    "word_problem_example",
    "word_problem_rows",
]

TEST_FRACTION = 0.2
"""The share of a generated benchmark's questions in its test split."""


def _hash_unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (SHA-256), the same on every machine."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2.0**64


def split_of(key: str) -> str:
    """``"test"`` for the TEST_FRACTION of keys whose hash falls below it, else ``"train"``."""
    return "test" if _hash_unit(f"split/{key}") < TEST_FRACTION else "train"


def rows_of_split(
    rows: Iterable[dict[str, Any]], split: str, key: Callable[[dict[str, Any]], str]
) -> list[dict[str, Any]]:
    """The ``rows`` whose ``key`` falls in ``split`` (:func:`split_of`), in an order fixed by
    the hash of their question (not by how they were made, so the first rows of a split are
    not all small numbers). Rows sharing a key share a split."""
    kept = [row for row in rows if split_of(key(row)) == split]
    kept.sort(key=lambda row: _hash_unit(f"order/{row['question']}"))
    return kept


def _pair_key(row: dict[str, Any]) -> str:
    """a + b and b + a share a split: a test question is never a swapped train one."""
    return f"{min(row['a'], row['b'])}+{max(row['a'], row['b'])}"


def addition_rows(
    low: int, high: int, phrase: Callable[[int, int], str]
) -> Callable[[str], Iterator[dict[str, Any]]]:
    """``split -> rows`` of every ``a + b`` with ``low <= a, b <= high``: each row holds the
    question, its answer and its operands."""

    def generate(split: str) -> Iterator[dict[str, Any]]:
        rows = (
            {"question": phrase(a, b), "answer": str(a + b), "a": a, "b": b}
            for a in range(low, high + 1)
            for b in range(low, high + 1)
        )
        yield from rows_of_split(rows, split, _pair_key)

    return generate


def addition_example(row: dict[str, Any], index: int, split: str) -> Example:
    """The row parser of :func:`addition_rows`' rows."""
    meta = {"a": row["a"], "b": row["b"]}
    return Example(f"{split}-{row['a']}+{row['b']}", row["question"], row["answer"], meta)


def ask_for_number(a: int, b: int) -> str:
    """The question of ``addition-2digit``: the sum, asking for a number (not a format)."""
    return f"What is {a} + {b}? Give the final answer as a number."


NAMES = ("Tom", "Ann", "Sam", "Lily", "Max", "Eva", "Ben", "Mia")
ITEMS = ("apples", "books", "coins", "pens", "cards", "stones", "shells", "stickers")
THINK = "Think step by step, then give the final answer as a number."
"""The instruction of ``word-problems-1digit``: the answers it draws span several lines."""


def word_problem(name: str, item: str, a: int, b: int) -> str:
    """A one-step word problem asking for ``a + b``, then for steps and a number."""
    return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now? {THINK}"


def word_problem_rows(low: int, high: int) -> Callable[[str], Iterator[dict[str, Any]]]:
    """``split -> rows`` of :func:`word_problem` for every name, item and ``a, b`` in
    ``low..high``. The split follows the two numbers (:func:`_pair_key`): a held-out question
    never shares its pair of numbers with a training question, whatever its name and item."""

    def generate(split: str) -> Iterator[dict[str, Any]]:
        rows = (
            {
                "question": word_problem(name, item, a, b),
                "answer": str(a + b),
                "a": a,
                "b": b,
                "name": name,
                "item": item,
            }
            for a in range(low, high + 1)
            for b in range(low, high + 1)
            for name in NAMES
            for item in ITEMS
        )
        yield from rows_of_split(rows, split, _pair_key)

    return generate


def word_problem_example(row: dict[str, Any], index: int, split: str) -> Example:
    """The row parser of :func:`word_problem_rows`' rows."""
    meta = {key: row[key] for key in ("a", "b", "name", "item")}
    row_id = f"{split}-{row['name']}-{row['a']}+{row['b']}-{row['item']}"
    return Example(row_id, row["question"], row["answer"], meta)
