"""Reward registry: every reward is ``fn(completion: str, answer: str) -> float`` in [0, 1].

Trainers look rewards up by name so that none of them special-cases a task:

- ``"math"``: `math_reward` (answer: the gold answer);
- ``"choice"``: `choice_reward` (answer: the option letter A-E);
- ``"yes_no"``: `yes_no_reward` (answer: "yes" / "no");
- ``"code"``: the completion's code block run with the test code in the sandbox
  (answer: the test code, as `load_benchmark("humaneval" | "mbpp")` stores it);
- ``"format"``: `format_reward` (answer ignored).
"""

from __future__ import annotations

from collections.abc import Callable

from gmts._registry import Registry
from gmts.rewards.boxed import format_reward
from gmts.rewards.choice import choice_reward, yes_no_reward
from gmts.rewards.math_verifier import math_reward
from gmts.rewards.program import extract_code_block
from gmts.rewards.sandbox import code_reward

RewardFn = Callable[[str, str], float]
_REWARDS: Registry[RewardFn] = Registry("reward")


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator adding ``fn(completion, answer) -> float`` under ``name``; duplicates raise."""
    return _REWARDS.decorator(name)


def get_reward(name: str) -> RewardFn:
    """The reward registered under ``name``; an unknown name raises listing the valid ones."""
    return _REWARDS.get(name)


def available_rewards() -> list[str]:
    return _REWARDS.names()


# these already take (completion, answer); their other arguments are keyword-only defaults
register_reward("math")(math_reward)
register_reward("choice")(choice_reward)
register_reward("yes_no")(yes_no_reward)


@register_reward("code")
def _code(completion: str, answer: str) -> float:
    return code_reward(extract_code_block(completion), answer)


@register_reward("format")
def _format(completion: str, answer: str) -> float:
    return format_reward(completion)
