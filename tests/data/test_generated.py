"""Benchmarks made by code: the same rows everywhere, disjoint splits, right answers."""

from __future__ import annotations

from gmts.data.benchmarks import load_benchmark
from gmts.data.generated import TEST_FRACTION


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
