"""Reward registry: every reward is ``fn(completion: str, answer: str) -> float`` in [0, 1].

Trainers look rewards up by name so that none of them special-cases a task:

- ``"math"``: `math_reward` reading the last ``\\boxed{}``, else the last number of the
  completion (the way instruction-tuned models answer; :mod:`gmts.rewards.final_answer`);
- ``"math-boxed"``: `math_reward` reading the last ``\\boxed{}`` only (the paper's format: an
  answer without a box scores 0);
- ``"choice"``: `choice_reward` (answer: the option letter A-E);
- ``"yes_no"``: `yes_no_reward` (answer: "yes" / "no");
- ``"code"``: the completion's code block run with the test code in the sandbox
  (answer: the test code, as `load_benchmark("humaneval" | "mbpp")` stores it); it *runs
  code*, so `get_reward` checks the sandbox first (see `get_reward`);
- ``"format"``: `format_reward` (answer ignored).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from gmts._registry import Registry
from gmts.rewards.boxed import format_reward
from gmts.rewards.choice import choice_reward, yes_no_reward
from gmts.rewards.math_verifier import math_reward
from gmts.rewards.program import extract_code_block
from gmts.rewards.sandbox import check_sandbox, code_reward

RewardFn = Callable[[str, str], float]
_REWARDS: Registry[RewardFn] = Registry("reward")
_RUNS_CODE: set[str] = set()  # names of the rewards that execute model output
_DESCRIPTIONS: dict[str, str] = {}  # name -> one line: what a completion must hold to score


def register_reward(
    name: str, *, runs_code: bool = False, description: str = ""
) -> Callable[[RewardFn], RewardFn]:
    """Decorator adding ``fn(completion, answer) -> float`` under ``name``; duplicates raise.

    ``runs_code=True``: the reward executes model output; ``fn`` then also takes a keyword
    ``backend`` (the sandbox backend of `gmts.rewards.run_sandboxed`), which `get_reward` binds.
    ``description``: one line saying what a completion must hold to score (the trainer's
    zero-signal warning quotes it).
    """
    add = _REWARDS.decorator(name)

    def decorator(fn: RewardFn) -> RewardFn:
        add(fn)
        if runs_code:
            _RUNS_CODE.add(name)
        _DESCRIPTIONS[name] = description
        return fn

    return decorator


def reward_description(name: str) -> str:
    """What reward ``name`` expects of a completion, in one line ("" if none was registered)."""
    _REWARDS.get(name)  # an unknown name raises listing the valid ones
    return _DESCRIPTIONS.get(name, "")


def reward_runs_code(name: str) -> bool:
    """Whether reward ``name`` executes model output (and so needs the code sandbox)."""
    return name in _RUNS_CODE


def get_reward(name: str, *, sandbox: str | None = None) -> RewardFn:
    """The reward registered under ``name``; an unknown name raises listing the valid ones.

    For a reward that runs code, the sandbox is checked now (`check_sandbox(sandbox)`: None
    means ``$GMTS_SANDBOX``, else bubblewrap) and the returned function runs in that backend;
    where bubblewrap does not work this raises `SandboxUnavailableError`, before any model
    output exists. ``sandbox`` is ignored for the other rewards.
    """
    reward = _REWARDS.get(name)
    if name not in _RUNS_CODE:
        return reward
    return functools.partial(reward, backend=check_sandbox(sandbox))


def available_rewards() -> list[str]:
    return _REWARDS.names()


# these already take (completion, answer); their other arguments are keyword-only defaults
register_reward(
    "math",
    description="a final answer equal to the gold answer: the last \\boxed{...}, or else the "
    "last number of the answer",
)(functools.partial(math_reward, rule="boxed-or-last-number"))
register_reward(
    "math-boxed",
    description="a final answer in \\boxed{...} equal to the gold answer (the paper's format)",
)(functools.partial(math_reward, rule="boxed"))
register_reward(
    "choice", description="the gold option letter, in \\boxed{X} or after 'answer is'/'Answer:'"
)(choice_reward)
register_reward(
    "yes_no", description="yes or no, in \\boxed{}, after 'answer is'/'Answer:', or alone"
)(yes_no_reward)


@register_reward(
    "code",
    runs_code=True,
    description="a markdown Python code block that passes the gold test code in the sandbox",
)
def _code(completion: str, answer: str, *, backend: str | None = None) -> float:
    return code_reward(extract_code_block(completion), answer, backend=backend)


@register_reward("format", description="any non-empty \\boxed{...} (the gold is ignored)")
def _format(completion: str, answer: str) -> float:
    return format_reward(completion)
