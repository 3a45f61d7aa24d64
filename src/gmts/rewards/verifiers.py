"""Benchmark verifiers: score a completion against one benchmark example.

A verifier reads what a benchmark example holds (its gold ``answer`` and, for code, the
``meta`` fields a program needs) and returns ``(reward in [0, 1], what it extracted)`` for the
per-question record. One signature for all, so the evaluation harness never dispatches on a
verifier's name:

    score(completion, example, *, backend=None, timeout=10.0) -> (reward, extracted)

``backend`` is the checked code-sandbox backend (only verifiers that run code read it;
:func:`gmts.rewards.check_sandbox` gives it), ``timeout`` the seconds per program.

- ``"math-boxed"``: :func:`math_reward` on the last ``\\boxed{}`` (extracted: that answer), the
  paper's format and the math benchmarks' default;
- ``"math"``: :func:`math_reward` on the last ``\\boxed{}``, else the last number of the
  completion (extracted: that answer), for models that answer in prose;
- ``"choice"`` / ``"yes_no"``: the option letter / yes-no answer;
- ``"humaneval"`` / ``"mbpp"``: the completion's code block with the example's tests, run in
  the sandbox (extracted: the code block).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gmts._registry import Registry
from gmts.rewards.boxed import extract_boxed
from gmts.rewards.choice import choice_reward, extract_choice, extract_yes_no, yes_no_reward
from gmts.rewards.final_answer import extract_final_answer
from gmts.rewards.math_verifier import math_reward
from gmts.rewards.program import extract_code_block, humaneval_program, mbpp_program
from gmts.rewards.sandbox import code_reward

__all__ = ["Verifier", "available_verifiers", "get_verifier", "register_verifier"]

ScoreFn = Callable[..., tuple[float, Any]]


@dataclass(frozen=True)
class Verifier:
    """A named scoring rule for benchmark examples (see the module docstring).

    Attributes:
        name: registry name.
        score: ``score(completion, example, *, backend=None, timeout=10.0)``.
        runs_code: whether scoring executes the model's output (then the sandbox must be
            checked before any evaluation starts).
    """

    name: str
    score: ScoreFn
    runs_code: bool = False


_VERIFIERS = Registry[Verifier]("verifier")


register_verifier = _VERIFIERS.register
get_verifier = _VERIFIERS.get
available_verifiers = _VERIFIERS.names


def answer_verifier(
    name: str, reward: Callable[[str, str], float], extract: Callable[[str], Any]
) -> Verifier:
    """A verifier comparing the completion with ``example.answer`` through ``reward``."""

    def score(completion: str, example: Any, **_: Any) -> tuple[float, Any]:
        return float(reward(completion, example.answer)), extract(completion)

    return Verifier(name, score)


def program_verifier(name: str, build: Callable[[str, Any], tuple[str, str]]) -> Verifier:
    """A verifier running ``build(completion, example) -> (program, tests)`` in the sandbox."""

    def score(
        completion: str, example: Any, *, backend: str | None = None, timeout: float = 10.0
    ) -> tuple[float, Any]:
        program, tests = build(completion, example)
        reward = code_reward(program, tests, timeout=timeout, backend=backend)
        return float(reward), extract_code_block(completion)

    return Verifier(name, score, runs_code=True)


register_verifier(
    answer_verifier(
        "math",
        functools.partial(math_reward, rule="boxed-or-last-number"),
        functools.partial(extract_final_answer, rule="boxed-or-last-number"),
    )
)
register_verifier(
    answer_verifier("math-boxed", functools.partial(math_reward, rule="boxed"), extract_boxed)
)
register_verifier(answer_verifier("choice", choice_reward, extract_choice))
register_verifier(answer_verifier("yes_no", yes_no_reward, extract_yes_no))
register_verifier(program_verifier("humaneval", humaneval_program))
register_verifier(program_verifier("mbpp", mbpp_program))
