"""The two final-answer rules: the paper's boxed format and boxed-or-last-number."""

from __future__ import annotations

import pytest

from gmts.rewards import get_reward
from gmts.rewards.final_answer import extract_final_answer, last_number
from gmts.rewards.verifiers import get_verifier

PROSE = "59 + 63 = 122.\n\nThe answer is 122."


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("59 + 63 = 122.", "122"),
        ("It costs 1,234 dollars", "1234"),
        ("half is 0.5, not 3/4", "3/4"),
        ("x = -12", "-12"),
        ("the result: 3/4.", "3/4"),
        ("version v2 and 7th", "7"),
        ("no digits at all", None),
        ("", None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_last_number_ignores_digits_inside_words():
    assert last_number("answer 41 (see item2)") == "41"


def test_a_box_wins_under_both_rules():
    text = r"so \boxed{7} and then 12 more words 13"
    assert extract_final_answer(text, "boxed") == "7"
    assert extract_final_answer(text, "boxed-or-last-number") == "7"


def test_prose_has_an_answer_only_under_the_lenient_rule():
    assert extract_final_answer(PROSE, "boxed") is None
    assert extract_final_answer(PROSE, "boxed-or-last-number") == "122"


def test_unknown_rule_raises():
    with pytest.raises(ValueError, match="answer rule"):
        extract_final_answer("1", "last")


def test_math_reads_prose_and_math_boxed_does_not():
    assert get_reward("math")(PROSE, "122") == 1.0
    assert get_reward("math-boxed")(PROSE, "122") == 0.0
    assert get_reward("math")(PROSE, "121") == 0.0
    boxed = r"The sum is \boxed{122}."
    assert get_reward("math")(boxed, "122") == get_reward("math-boxed")(boxed, "122") == 1.0
    # a box that is wrong is not rescued by a right number after it
    assert get_reward("math")(r"\boxed{121}, i.e. 122", "122") == 0.0


def test_verifiers_of_the_same_names_read_the_same_way():
    class Example:
        answer = "122"

    assert get_verifier("math").score(PROSE, Example()) == (1.0, "122")
    assert get_verifier("math-boxed").score(PROSE, Example()) == (0.0, None)


def test_the_paper_math_benchmarks_keep_the_boxed_format():
    from gmts.data.benchmarks import get_benchmark

    for name in ("math500", "aime24", "gsm8k", "math12k"):
        assert get_benchmark(name).verifier.name == "math-boxed"
