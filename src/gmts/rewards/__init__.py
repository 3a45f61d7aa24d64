"""Verifiable rewards: math (math-verify), multiple choice, yes/no, and sandboxed code.

Importing this package is cheap: math-verify (and SymPy) load on the first math check, in a
worker process. See docs/rewards.md for what each verifier accepts and the sandbox's limits.
Code runs only in bubblewrap unless the weaker backend is chosen explicitly (`check_sandbox`).
"""

from gmts.rewards.boxed import extract_boxed, format_reward
from gmts.rewards.choice import choice_reward, extract_choice, extract_yes_no, yes_no_reward
from gmts.rewards.exact import exact_reward
from gmts.rewards.math_answer import normalize_answer
from gmts.rewards.math_verifier import math_reward
from gmts.rewards.program import (
    extract_code_block,
    humaneval_program,
    humaneval_tests,
    mbpp_program,
    mbpp_tests,
)
from gmts.rewards.registry import (
    available_rewards,
    get_reward,
    register_reward,
    reward_description,
    reward_runs_code,
)
from gmts.rewards.sandbox import (
    SandboxResult,
    SandboxUnavailableError,
    check_sandbox,
    code_reward,
    run_sandboxed,
)

__all__ = [
    "SandboxResult",
    "SandboxUnavailableError",
    "available_rewards",
    "check_sandbox",
    "choice_reward",
    "code_reward",
    "exact_reward",
    "extract_boxed",
    "extract_choice",
    "extract_code_block",
    "extract_yes_no",
    "format_reward",
    "get_reward",
    "humaneval_program",
    "humaneval_tests",
    "math_reward",
    "mbpp_program",
    "mbpp_tests",
    "normalize_answer",
    "register_reward",
    "reward_description",
    "reward_runs_code",
    "run_sandboxed",
    "yes_no_reward",
]
