"""Questions for ``gmts analyze --dataset``: a benchmark or a file of one's own, rendered for a
real model (its chat template), in the shape ``sample_and_analyze`` reads from a built-in task
(``name``, ``sample(n, rng)``, ``reward(completion, answer)``, ``max_new_tokens``)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gmts.data.datasets import Example
from gmts.embedded.tasks import Problem
from gmts.models.context import ContextLimit
from gmts.models.defaults import FittedBudget, fit_budget

__all__ = ["DatasetQuestions", "dataset_questions", "fitted_questions"]


@dataclass(frozen=True)
class DatasetQuestions:
    """The questions of a dataset as an analysis task.

    Attributes:
        name: the dataset as given (a benchmark name or a file path).
        examples: its questions with their gold answers.
        render: question text -> the prompt the model continues (template + chat template).
        score: ``reward(completion, gold) -> float`` (a reward of :mod:`gmts.rewards`).
        max_new_tokens: the default generation budget.
        template: the template name the questions are rendered with (``auto`` resolved by
            the tokenizer).
    """

    name: str
    examples: tuple[Example, ...]
    render: Callable[[str], str]
    score: Callable[[str, str], float]
    max_new_tokens: int
    template: str = "plain"

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` distinct questions (all of them when the dataset holds fewer), drawn by ``rng``."""
        picked = rng.sample(range(len(self.examples)), min(n, len(self.examples)))
        return [
            Problem(self.render(self.examples[i].question), self.examples[i].answer) for i in picked
        ]

    def reward(self, completion: str, answer: str) -> float:
        return float(self.score(completion, answer))


def dataset_questions(
    dataset: str,
    tokenizer: Any,
    *,
    template: str | None,
    reward: str | None,
    max_new_tokens: int = 256,
) -> DatasetQuestions:
    """The questions of ``dataset`` (a benchmark of :mod:`gmts.data.benchmarks`, its default
    split, or a ``.jsonl`` file with ``problem`` / ``answer`` fields) for ``gmts analyze``.

    ``template`` (None: the benchmark's; for a file ``auto``, the one that fits the model:
    :func:`gmts.data.prompts.resolve_template`) renders each question, through the tokenizer's
    chat template where it has one; ``reward`` (None: ``math``) scores the answers. ValueError
    (one line) for an unknown dataset, template or reward.
    """
    from gmts.data.benchmarks import available_benchmarks, get_benchmark, load_benchmark
    from gmts.data.datasets import load_jsonl_dataset
    from gmts.data.prompts import AUTO_TEMPLATE, check_template, format_prompt
    from gmts.rewards import get_reward

    if dataset in available_benchmarks():
        examples = load_benchmark(dataset)
        template = template or get_benchmark(dataset).template
    else:
        try:
            examples = load_jsonl_dataset(dataset, "problem", "answer")
        except (OSError, ValueError) as exc:
            raise ValueError(f"--dataset: {exc}") from None
        template = template or AUTO_TEMPLATE
    if not examples:
        raise ValueError(f"--dataset: {dataset!r} holds no questions")
    check_template(template, "--template")  # an unknown name raises listing the valid ones
    score = get_reward(reward or "math")
    return DatasetQuestions(
        name=dataset,
        examples=tuple(examples),
        render=lambda question: format_prompt(tokenizer, question, template=template),
        score=score,
        max_new_tokens=max_new_tokens,
        template=template,
    )


def fitted_questions(
    questions: DatasetQuestions, tokenizer: Any, context: ContextLimit | None
) -> tuple[DatasetQuestions, FittedBudget]:
    """``questions`` with the budget of :func:`gmts.models.defaults.fit_budget` (its longest
    gold answer and rendered prompt, in ``tokenizer``'s tokens, and the model's context)."""
    from gmts.models.context import longest_prompt

    fitted = fit_budget(
        longest_answer=longest_prompt(tokenizer, [ex.answer for ex in questions.examples]),
        longest_prompt=longest_prompt(
            tokenizer, [questions.render(ex.question) for ex in questions.examples]
        ),
        context=context,
    )
    return dataclasses.replace(questions, max_new_tokens=fitted.tokens), fitted
