"""Benchmarks made by code: the same rows everywhere, disjoint splits, right answers."""

from __future__ import annotations

import hashlib
import random
import re
from itertools import product
from pathlib import Path

import pytest

from gmts.data.benchmarks import get_benchmark, load_benchmark
from gmts.data.datasets import Example
from gmts.data.generated import ITEMS, NAMES, TEST_FRACTION, rows_of_split, word_problem
from gmts.rewards.registry import get_reward
from gmts.train.config import load_config
from gmts.train.sources import load_examples

REPO = Path(__file__).resolve().parents[2]


def test_addition_2digit_covers_every_pair_once_with_disjoint_splits():
    train = load_benchmark("addition-2digit", split="train")
    test = load_benchmark("addition-2digit")  # default split: test
    pairs = [(e.meta["a"], e.meta["b"]) for e in train + test]
    assert sorted(pairs) == [(a, b) for a in range(10, 100) for b in range(10, 100)]
    # a + b and b + a are in the same split: no held-out question is a swapped train one
    unordered_train = {frozenset(p) for p in pairs[: len(train)]}
    unordered_test = {frozenset(p) for p in pairs[len(train) :]}
    assert not unordered_train & unordered_test
    assert abs(len(test) / len(pairs) - TEST_FRACTION) < 0.02
    for example in train[:50] + test[:50]:
        a, b = example.meta["a"], example.meta["b"]
        assert example.question == f"What is {a} + {b}? Give the final answer as a number."
        assert example.answer == str(a + b)


def test_addition_2digit_is_the_same_on_every_load_and_not_sorted_by_operand():
    first = [e.id for e in load_benchmark("addition-2digit", limit=20)]
    assert first == [e.id for e in load_benchmark("addition-2digit", limit=20)]
    operands = [e.meta["a"] for e in load_benchmark("addition-2digit", limit=20)]
    assert operands != sorted(operands)


def test_addition_2digit_needs_no_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("GMTS_DATA_DIR", str(tmp_path))  # an empty folder: nothing to read there
    assert len(load_benchmark("addition-2digit", limit=3)) == 3


# ----------------------------------------------------------------------------- rows_of_split


def _reference_split(key: str) -> str:
    """split_of written out: SHA-256 of "split/<key>", first 8 bytes as a fraction of 2**64."""
    digest = hashlib.sha256(f"split/{key}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64 else "train"


@pytest.mark.parametrize("seed", range(5))
def test_rows_of_split_partitions_by_key_and_ignores_input_order(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{rng.randrange(10**6)}" for _ in range(rng.randint(1, 30))]
    rows = [
        {"question": f"q{i}-{rng.random()}", "group": rng.choice(keys)}
        for i in range(rng.randint(1, 200))
    ]
    splits = {s: rows_of_split(rows, s, lambda row: row["group"]) for s in ("train", "test")}
    # every row once, in the split its key hashes to (rows sharing a key share a split)
    assert sorted(r["question"] for s in splits.values() for r in s) == sorted(
        r["question"] for r in rows
    )
    for split, kept in splits.items():
        assert all(_reference_split(row["group"]) == split for row in kept)
    # the order depends on the questions only, never on the order they came in
    shuffled = rows[:]
    rng.shuffle(shuffled)
    for split, kept in splits.items():
        assert rows_of_split(shuffled, split, lambda row: row["group"]) == kept


# ----------------------------------------------------------------------- word-problems-1digit

WORD = "word-problems-1digit"
TEST_PAIRS = [(3, 8), (4, 6), (4, 7), (5, 7), (6, 8), (8, 8), (9, 9)]


@pytest.fixture(scope="module")
def word_splits() -> dict[str, list[Example]]:
    return {split: load_benchmark(WORD, split=split) for split in ("train", "test")}


def test_word_problems_cover_every_name_item_and_pair_once_with_disjoint_pairs(word_splits):
    train, test = word_splits["train"], word_splits["test"]
    cases = [(e.meta["name"], e.meta["item"], e.meta["a"], e.meta["b"]) for e in train + test]
    assert sorted(cases) == sorted(product(NAMES, ITEMS, range(2, 10), range(2, 10)))
    # a held-out question never shares its two numbers with a training question
    pairs = {
        s: {frozenset((e.meta["a"], e.meta["b"])) for e in word_splits[s]}
        for s in ("train", "test")
    }
    assert not pairs["train"] & pairs["test"]
    # the test pairs are fixed by the hash (on every machine, in every version): 7 of 36
    assert pairs["test"] == {frozenset(p) for p in TEST_PAIRS} and len(pairs["train"]) == 29
    assert test[0].id == "test-Sam-4+6-shells"  # and so is the order
    assert len({e.id for e in train + test}) == len(train) + len(test) == 4096


def test_word_problems_answers_are_the_sums_and_the_reward_verifies_them(word_splits):
    reward = get_reward("math")  # the benchmark's verifier and the config's data.reward
    assert get_benchmark(WORD).verifier.name == "math"
    for example in word_splits["train"][:100] + word_splits["test"][:100]:
        a, b, name, item = (example.meta[k] for k in ("a", "b", "name", "item"))
        assert example.question == word_problem(name, item, a, b)
        assert f"{name} has {a} {item} and gets {b} more." in example.question
        assert example.answer == str(a + b)
        # an answer in the model's own style, over several lines, scores; a wrong one does not
        right = f"1. {name} has {a} {item}.\n2. {name} gets {b} more.\n3. {a} + {b} = {a + b}.\n\nThe answer is {a + b}."
        assert reward(right, example.answer) == 1.0
        assert reward(right.replace(f"is {a + b}.", f"is {a + b + 1}."), example.answer) == 0.0


def test_word_problems_are_the_same_on_every_load_and_not_sorted(word_splits):
    again = load_benchmark(WORD)
    assert [(e.id, e.question, e.answer) for e in again] == [
        (e.id, e.question, e.answer) for e in word_splits["test"]
    ]
    first = word_splits["train"][:30]
    assert [e.meta["a"] for e in first] != sorted(e.meta["a"] for e in first)
    assert len({e.meta["name"] for e in first}) > 1


# ------------------------------------------------------------------ the config folder for it

WORD_CONFIGS = sorted(
    (REPO / "configs" / "smollm2-135m-instruct-word-problems").glob("dapo-*.yaml")
)


def test_word_problem_configs_train_on_train_and_hold_out_the_test_pairs():
    assert {p.stem for p in WORD_CONFIGS} == {"dapo-none", "dapo-gmts", "dapo-ets", "dapo-random"}
    for path in WORD_CONFIGS:
        d = load_config(path).data
        train = load_examples(d.dataset, split=d.split, question_field="", answer_field="")
        held_out = load_examples(d.eval_dataset, split=None, question_field="", answer_field="")
        assert len(train) == 3328 and len(held_out) == 768
        numbers = lambda q: frozenset(int(n) for n in re.findall(r"\d+", q))  # noqa: E731
        assert not {numbers(q) for q, _ in train} & {
            numbers(q) for q, _ in held_out[: d.eval_questions]
        }


ADDITION_CONFIGS = sorted((REPO / "configs" / "smollm2-135m-instruct").glob("dapo-*.yaml"))


def test_a_benchmark_trains_on_its_train_split_when_data_split_is_null():
    """A benchmark's default split is its evaluation split: with data.split null a run trains
    on its train split, so the addition configs (which set none) hold out what they evaluate."""
    from gmts.train.sources import held_out_overlap, training_split

    assert training_split("addition-2digit", None) == "train"
    assert training_split("addition-2digit", "test") == "test"  # asked for: kept
    assert training_split("/some/file.jsonl", None) is None
    assert held_out_overlap("addition-2digit", None, "addition-2digit") is None
    assert "held-out questions are questions the run trains on" in held_out_overlap(
        "addition-2digit", "test", "addition-2digit"
    )
    assert "the file f.jsonl" in held_out_overlap("f.jsonl", None, "f.jsonl")
    assert ADDITION_CONFIGS
    for path in ADDITION_CONFIGS:
        d = load_config(path).data
        split = training_split(d.dataset, d.split)
        train = load_examples(d.dataset, split=split, question_field="", answer_field="")
        held_out = load_examples(d.eval_dataset, split=None, question_field="", answer_field="")
        assert len(train) == 6448 and len(held_out) == 1652
        assert not {q for q, _ in train} & {q for q, _ in held_out}
