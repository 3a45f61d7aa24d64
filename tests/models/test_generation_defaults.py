"""Defaults that fit the model: the fitted budget's rule against a plain reference, the warning
on cut answers, the settings line, and an unknown model name answered with the named ones and
the closest (the template ``auto`` picks: tests/evaluation/test_prompts.py)."""

from __future__ import annotations

import random

import pytest

from gmts.models.context import ContextLimit
from gmts.models.defaults import (
    ANSWER_FACTOR,
    BUDGET_MAX,
    BUDGET_MIN,
    Setting,
    fit_budget,
    settings_line,
    truncation_message,
)
from gmts.models.loading import ModelPathError, resolve_model_path


def _reference_budget(answer: int, prompt: int, context: int | None) -> int:
    """The rule as the docs state it, written out case by case."""
    budget = ANSWER_FACTOR * answer
    if budget < BUDGET_MIN:
        budget = BUDGET_MIN
    if budget > BUDGET_MAX:
        budget = BUDGET_MAX
    if context is not None and context - prompt < budget:
        budget = context - prompt
    return max(budget, 1)


def test_the_fitted_budget_follows_its_rule_on_random_sizes() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        answer, prompt = rng.randint(0, 600), rng.randint(0, 5000)
        context = rng.choice([None, 64, 512, 2048, 4096, 32768])
        limit = None if context is None else ContextLimit(context, "test")
        fitted = fit_budget(longest_answer=answer, longest_prompt=prompt, context=limit)
        assert fitted.tokens == _reference_budget(answer, prompt, context), (answer, prompt)
        assert fitted.reason.startswith("fitted: ")


def test_the_fitted_budget_says_why() -> None:
    short = fit_budget(longest_answer=3, longest_prompt=20, context=ContextLimit(8192, "c"))
    assert (short.tokens, short.reason) == (
        BUDGET_MIN,
        f"fitted: {ANSWER_FACTOR} x the longest gold answer (3 tokens), at least {BUDGET_MIN}",
    )
    long = fit_budget(longest_answer=1000, longest_prompt=20, context=None)
    assert long.tokens == BUDGET_MAX and f"at most {BUDGET_MAX}" in long.reason
    tight = fit_budget(longest_answer=3, longest_prompt=7, context=ContextLimit(64, "c"))
    assert tight.tokens == 57 and "(64 - 7 tokens)" in tight.reason


@pytest.mark.parametrize(
    ("cut", "answers", "warns"), [(0, 10, False), (5, 10, False), (6, 10, True), (3, 0, False)]
)
def test_the_cut_answers_warning_needs_more_than_half(cut: int, answers: int, warns: bool) -> None:
    message = truncation_message(cut, answers, 64, "rollout.max_response_length")
    assert (message is not None) == warns
    if warns:
        assert f"{cut} of {answers} answers" in message and "64 new tokens" in message
        assert message.endswith("raise rollout.max_response_length")


def test_the_settings_line_names_each_value_with_its_key() -> None:
    line = settings_line(
        "gmts eval",
        [Setting("template", "plain", "--template", "auto: why"), Setting("budget", "8", "--b")],
        what="mine.jsonl",
    )
    assert line == "gmts eval: mine.jsonl: template plain (--template; auto: why), budget 8 (--b)"


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("smollm2-135m", "smollm2-135m-instruct"),
        ("embeded", "embedded"),
        ("smol", "smollm2-135m-instruct"),  # a name cut short
        ("qwen", None),
    ],
)
def test_an_unknown_model_name_lists_the_named_ones(name: str, closest: str | None) -> None:
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(name)
    message = str(caught.value)
    assert "nor a named model: embedded, smollm2-135m-instruct" in message
    if closest is not None:
        assert message.endswith(f"did you mean {closest!r}?")
    else:
        assert "did you mean" not in message


def test_a_path_that_does_not_exist_gets_no_name_list(tmp_path) -> None:
    with pytest.raises(ModelPathError) as caught:
        resolve_model_path(str(tmp_path / "nope"))
    assert "named model" not in str(caught.value)
