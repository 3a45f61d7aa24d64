"""Verifiers against the real benchmark files in ../shared/data.

- every gold answer of the paper's five math benchmarks, boxed, scores 1.0 (>= 99.5%), and
  integer golds +-1 never do (the figures are in docs/rewards.md);
- canonical HumanEval / MBPP solutions pass in the sandbox and broken ones fail.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest

from gmts.data.benchmarks import load_benchmark
from gmts.rewards import code_reward, humaneval_program, mbpp_program

from file_modules import load_module

_gold_rates = load_module(
    Path(__file__).resolve().parents[2] / "benchmarks" / "gold_rates.py",
    "gold_rates",
    register=True,
)
PAPER_MATH, measure = _gold_rates.PAPER_MATH, _gold_rates.measure


@pytest.mark.slow  # ~40 s on a loaded 2-core machine: 4,000 checks through math-verify
@pytest.mark.parametrize("name", PAPER_MATH)
def test_boxed_gold_answers_score_one_and_neighbours_zero(shared_data: Path, name: str) -> None:
    rate = measure(name, data_dir=shared_data, timeout=20.0)  # generous: the CI box is shared
    assert rate.total > 0
    assert rate.normalised_rate >= 0.995, rate.normalised_failures
    assert rate.raw_rate >= 0.995, rate.raw_failures
    assert rate.off_by_one_accepted == 0, rate.off_by_one_failures


def test_boxed_gold_answers_sample(shared_data: Path) -> None:
    # a fast slice of the slow test above, so the default run covers the path too
    rate = measure("aime24", data_dir=shared_data, timeout=20.0)
    assert (rate.total, rate.normalised_ok, rate.raw_ok) == (30, 30, 30)
    assert rate.integer_golds == 30 and rate.off_by_one_accepted == 0


def _sample(examples: list, k: int, seed: int) -> list:
    return random.Random(seed).sample(examples, k)


def _fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def _break(code: str) -> str:
    """A wrong solution: the same program whose every `return` gives None."""
    lines = [
        line[: len(line) - len(line.lstrip())] + "return None"
        if line.lstrip().startswith("return")
        else line
        for line in code.splitlines()
    ]
    return "\n".join(lines)


def test_humaneval_canonical_solutions_pass_and_broken_ones_fail(
    shared_data: Path, trusted_code_sandbox: str
) -> None:
    problems = _sample(load_benchmark("humaneval", data_dir=shared_data), 10, seed=0)
    run = functools.partial(code_reward, timeout=20, backend=trusted_code_sandbox)
    for problem in problems:
        full = problem.meta["prompt"] + problem.meta["canonical_solution"]
        program, tests = humaneval_program(_fenced(full), problem)
        assert run(program, tests) == 1.0, problem.id
        # the body alone (no def line) continues the prompt
        program, tests = humaneval_program(problem.meta["canonical_solution"], problem)
        assert run(program, tests) == 1.0, problem.id
    for problem in problems[:5]:
        broken = _break(problem.meta["prompt"] + problem.meta["canonical_solution"])
        program, tests = humaneval_program(_fenced(broken), problem)
        assert run(program, tests) == 0.0, problem.id


def test_mbpp_canonical_solutions_pass_and_broken_ones_fail(
    shared_data: Path, trusted_code_sandbox: str
) -> None:
    problems = _sample(load_benchmark("mbpp", data_dir=shared_data), 10, seed=0)
    run = functools.partial(code_reward, timeout=20, backend=trusted_code_sandbox)
    for problem in problems:
        program, tests = mbpp_program(_fenced(problem.meta["canonical_solution"]), problem)
        assert run(program, tests) == 1.0, problem.id
    for problem in problems[:5]:
        broken = _break(problem.meta["canonical_solution"])
        program, tests = mbpp_program(_fenced(broken), problem)
        assert run(program, tests) == 0.0, problem.id
