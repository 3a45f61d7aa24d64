"""Multiple-choice and yes/no verifiers, code adapters, and the reward registry."""

from __future__ import annotations

import pytest

from gmts.rewards import (
    available_rewards,
    choice_reward,
    extract_choice,
    extract_code_block,
    extract_yes_no,
    get_reward,
    humaneval_program,
    mbpp_program,
    register_reward,
    yes_no_reward,
)


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        (r"... so \boxed{C}", "C"),
        (r"\boxed{(C)}", "C"),
        (r"\boxed{\text{C}}", "C"),
        (r"\boxed{C) department store}", "C"),
        (r"\boxed{c}", "C"),
        ("The answer is (C).", "C"),
        ("the answer is C", "C"),
        ("Answer: C", "C"),
        ("**Answer:** (B)", "B"),
        ("I think A. Wait, the answer is: D", "D"),
        (r"answer is (A) ... final \boxed{E}", "E"),  # a box wins over the phrase
        ("the answer is a dog", None),  # lower-case words are not letters outside a box
        (r"\boxed{Cat}", None),
        (r"\boxed{F}", None),  # not an option
        ("C", None),  # no commitment phrase
        ("", None),
    ],
)
def test_extract_choice(completion: str, letter: str | None) -> None:
    assert extract_choice(completion) == letter


def test_choice_reward() -> None:
    assert choice_reward("The answer is (C).", "C") == 1.0
    assert choice_reward("The answer is (C).", "c ") == 1.0
    assert choice_reward("The answer is (B).", "C") == 0.0
    assert choice_reward("no idea", "C") == 0.0
    assert choice_reward(None, "C") == 0.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="answer_letter"):
        choice_reward("x", "CD")
    with pytest.raises(ValueError, match="answer_letter"):
        choice_reward("x", "Z")


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        (r"\boxed{yes}", "yes"),
        (r"\boxed{\text{No}}", "no"),
        (r"\boxed{no.}", "no"),
        ("So the answer is yes.", "yes"),
        ("Answer: No", "no"),
        ("Yes.", "yes"),
        ("true", "yes"),
        ("maybe", None),
        ("yes and no", None),
        (r"\boxed{maybe} the answer is yes", None),  # the box is the final answer
        ("", None),
    ],
)
def test_extract_yes_no(completion: str, answer: str | None) -> None:
    assert extract_yes_no(completion) == answer


def test_yes_no_reward() -> None:
    assert yes_no_reward(r"\boxed{yes}", "yes") == 1.0
    assert yes_no_reward(r"\boxed{yes}", "YES") == 1.0
    assert yes_no_reward(r"\boxed{yes}", True) == 1.0
    assert yes_no_reward(r"\boxed{yes}", "no") == 0.0
    assert yes_no_reward(r"\boxed{}", "no") == 0.0
    with pytest.raises(ValueError, match="answer"):
        yes_no_reward("yes", "maybe")


@pytest.mark.parametrize(
    ("markdown", "code"),
    [
        ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1"),
        ("```\nx = 1\n```\n```python\ny = 2\n```\n```text\nout\n```", "y = 2"),
        ("```py\na = 1\n```\nthen\n```python3\nb = 2\n```", "b = 2"),
        ("```\nz = 3\n```", "z = 3"),
        ("```python\ndef f():\n    return 1\n", "def f():\n    return 1"),  # truncated
        ("def g():\n    return 2\n", "def g():\n    return 2\n"),  # bare code
        ("", ""),
    ],
)
def test_extract_code_block(markdown: str, code: str) -> None:
    assert extract_code_block(markdown) == code


def test_humaneval_program_assembles_full_function_or_body() -> None:
    problem = {
        "prompt": "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    '''Sum.'''\n",
        "entry_point": "total",
        "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n",
    }
    full = "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```"
    program, tests = humaneval_program(full, problem)
    assert program.startswith("from typing import List") and "return sum(xs)" in program
    assert tests.rstrip().endswith("check(total)")
    body, _ = humaneval_program("    return sum(xs)\n", problem)
    assert body == problem["prompt"] + "    return sum(xs)\n"
    with pytest.raises(ValueError, match="entry_point"):
        humaneval_program("x", {"prompt": "p"})


def test_mbpp_program() -> None:
    problem = {"test_setup_code": "import math", "test_list": ["assert f(1) == 2"]}
    program, tests = mbpp_program("```python\ndef f(x):\n    return x + 1\n```", problem)
    assert program == "def f(x):\n    return x + 1"
    assert tests == "import math\nassert f(1) == 2\n"


def test_registry_lists_and_dispatches(trusted_code_sandbox: str) -> None:
    assert {"math", "choice", "yes_no", "code", "format"} <= set(available_rewards())
    assert get_reward("choice")("The answer is (A)", "A") == 1.0
    assert get_reward("yes_no")(r"\boxed{no}", "no") == 1.0
    assert get_reward("format")(r"\boxed{no}", "") == 1.0
    code = get_reward("code", sandbox=trusted_code_sandbox)
    assert code("```python\ndef f():\n    return 3\n```", "assert f() == 3") == 1.0
    assert code("```python\ndef f():\n    return 4\n```", "assert f() == 3") == 0.0
    with pytest.raises(ValueError, match="valid rewards"):
        get_reward("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("math")(lambda completion, answer: 0.0)
