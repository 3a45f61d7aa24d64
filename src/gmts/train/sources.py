"""Where training questions come from: a built-in task or a dataset file, and how their answers
are rewarded (:func:`score_rewards`).

Both sources are deterministic in the run seed and expose their position as a small
``state_dict`` (saved in checkpoints), so a resumed run draws exactly the questions the
uninterrupted run would have drawn. Every rank holds an identical source and draws the same
questions; the trainer gives each rank its slice.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from gmts.embedded.tasks import Problem
from gmts.rewards.sandbox import SandboxUnavailableError

RewardFn = Callable[[str, str], float]


def score_rewards(
    reward_fn: RewardFn, completions: list[str], answers: list[str]
) -> tuple[torch.Tensor, int]:
    """``(B,)`` float32 rewards and the number of samples whose reward function raised or
    returned a non-finite value (those get 0: one bad verifier call never stops a run). A
    ``SandboxUnavailableError`` (code rewards without their sandbox) is raised, not counted."""
    values, errors = [], 0
    for completion, answer in zip(completions, answers):
        try:
            value = float(reward_fn(completion, answer))
            if not math.isfinite(value):
                raise ValueError("non-finite reward")
        except SandboxUnavailableError:  # no sandbox: every code reward would be a silent 0
            raise
        except Exception:  # any failure of a user reward: 0 for this sample, counted
            value, errors = 0.0, errors + 1
        values.append(value)
    return torch.tensor(values, dtype=torch.float32), errors


class QuestionSource(Protocol):
    """What the trainer draws questions from (:class:`TaskSource`, :class:`DatasetSource`)."""

    def next(self, n: int) -> list[Problem]:
        """The next ``n`` questions (identical on every rank)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TaskSource:
    """Questions sampled (with replacement) from a built-in task, never from its held-out set."""

    def __init__(self, task: Any, seed: int) -> None:
        self.task = task
        self.rng = random.Random(f"gmts-train/{task.name}/{seed}")

    def next(self, n: int) -> list[Problem]:
        return self.task.sample(n, self.rng)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])


def training_split(dataset: str, split: str | None) -> str | None:
    """The split ``data.dataset`` trains on: ``split`` when given; for a registered benchmark
    with a ``train`` split, that one (its default split is the one it is evaluated on, so a
    run with ``data.eval_dataset`` of the same benchmark would train on its own held-out
    questions); else None (the benchmark's only split, or a file)."""
    if split is not None:
        return split
    from gmts.data.benchmarks import available_benchmarks, get_benchmark

    if dataset in available_benchmarks() and "train" in get_benchmark(dataset).splits:
        return "train"
    return None


def held_out_overlap(dataset: str, split: str | None, eval_dataset: str | None) -> str | None:
    """A warning when the held-out set is the very split training draws from (``None``: no
    overlap known): the same benchmark and split, or the same file."""
    if eval_dataset is None or eval_dataset != dataset:
        return None
    from gmts.data.benchmarks import available_benchmarks, get_benchmark

    if dataset in available_benchmarks():
        evaluated = get_benchmark(dataset).default_split
        if training_split(dataset, split) != evaluated:
            return None
        where = f"split {evaluated!r} of {dataset}"
    else:
        where = f"the file {dataset}"
    return (
        f"data.dataset and data.eval_dataset are both {where}: the held-out questions are "
        "questions the run trains on (set data.split or another data.eval_dataset)"
    )


def load_examples(
    dataset: str,
    *,
    split: str | None,
    question_field: str,
    answer_field: str,
    what: str = "data.dataset",
) -> list[tuple[str, str]]:
    """(question, answer) pairs of a registered benchmark (``gmts.data.benchmarks``, e.g.
    ``math12k``) or of a local .jsonl / .jsonl.gz / .json / .parquet file; errors name
    ``what`` (the config key)."""
    from gmts.data import datasets as ds
    from gmts.data.benchmarks import available_benchmarks, load_benchmark

    if dataset in available_benchmarks():
        try:
            examples = load_benchmark(dataset, split=split)
        except FileNotFoundError as exc:
            raise ValueError(f"{what}: {exc}") from None
    else:
        if not Path(dataset).is_file():
            raise ValueError(
                f"{what}: {dataset!r} is neither a file nor a benchmark ({available_benchmarks()})"
            )
        try:
            examples = ds.load_jsonl_dataset(dataset, question_field, answer_field)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    return [(ex.question, ex.answer) for ex in examples]


class DatasetSource:
    """Questions of a dataset file, rendered with a prompt template, in seeded shuffled passes.

    Prompts longer than ``max_prompt_tokens`` are dropped once at load time
    (``skipped_too_long`` counts them; ``longest_prompt`` is the longest kept, in tokens). A
    prompt or answer holding characters the tokenizer cannot encode (the embedded model's)
    raises ValueError naming them and the characters it knows. Errors name ``what``.
    """

    def __init__(
        self,
        examples: list[tuple[str, str]],
        *,
        tokenizer: Any,
        template: str | None,
        max_prompt_tokens: int,
        shuffle: bool,
        seed: int,
        what: str = "data.dataset",
    ) -> None:
        if not examples:
            raise ValueError(f"{what}: no examples")
        from gmts.data.prompts import format_prompt
        from gmts.train.alphabet import check_encodable

        problems = [
            Problem(
                prompt=question
                if template is None
                else format_prompt(tokenizer, question, template=template),
                answer=answer,
            )
            for question, answer in examples
        ]
        encoded = tokenizer([p.prompt for p in problems], add_special_tokens=False)["input_ids"]
        check_encodable(
            tokenizer,
            [p.prompt for p in problems],
            [p.answer for p in problems],
            what=what,
            prompt_ids=encoded,
        )
        lengths = [len(ids) for ids in encoded]  # as the sampler encodes them
        self.problems = [p for p, n in zip(problems, lengths) if n <= max_prompt_tokens]
        self.skipped_too_long = len(problems) - len(self.problems)
        self.longest_prompt = max((n for n in lengths if n <= max_prompt_tokens), default=0)
        if not self.problems:
            raise ValueError(
                f"{what}: every prompt is longer than rollout.max_prompt_length "
                f"({max_prompt_tokens} tokens)"
            )
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.problems)))
        if self.shuffle:
            random.Random(f"gmts-data/{self.seed}/{self.epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Problem]:
        out = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._make_order()
            out.append(self.problems[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._make_order()


@dataclass(frozen=True)
class HeldOutSet:
    """The held-out questions of ``data.eval_dataset`` and how they are scored: what the
    trainer's periodic evaluation samples (the interface of a built-in task there:
    ``held_out(n)``, ``reward``, ``max_new_tokens``).

    Attributes:
        problems: the rendered prompts and gold answers, in file order.
        reward_fn: ``data.reward``'s function.
        max_new_tokens: the training budget.
        longest_prompt: the longest prompt in tokens.
    """

    problems: list[Problem]
    reward_fn: RewardFn
    max_new_tokens: int
    longest_prompt: int

    def held_out(self, n: int) -> list[Problem]:
        return self.problems[:n]

    def reward(self, completion: str, answer: str) -> float:
        """The reward; one that raises or is not finite scores 0, as in training."""
        return float(score_rewards(self.reward_fn, [completion], [answer])[0][0])


def held_out_set(
    examples: list[tuple[str, str]],
    *,
    questions: int,
    tokenizer: Any,
    template: str | None,
    max_prompt_tokens: int,
    reward_fn: RewardFn,
    max_new_tokens: int,
) -> HeldOutSet:
    """The first ``questions`` examples of ``data.eval_dataset`` that fit
    ``max_prompt_tokens``, rendered as the training prompts are."""
    rendered = DatasetSource(
        examples,
        tokenizer=tokenizer,
        template=template,
        max_prompt_tokens=max_prompt_tokens,
        shuffle=False,
        seed=0,
        what="data.eval_dataset",
    )
    return HeldOutSet(
        rendered.problems[:questions], reward_fn, max_new_tokens, rendered.longest_prompt
    )


def dataset_reward(name: str, *, sandbox: str | None = None) -> RewardFn:
    """The reward function ``name`` from gmts.rewards (``reward(completion, answer) -> float``).

    A reward that runs code gets sandbox ``sandbox`` (data.sandbox), checked now: where
    bubblewrap does not work and the weaker backend was not chosen, this raises
    ``gmts.rewards.SandboxUnavailableError`` (before any model is loaded).
    """
    from gmts.rewards import get_reward

    try:
        return get_reward(name, sandbox=sandbox)
    except ValueError as exc:
        raise ValueError(f"data.reward: {exc}") from None
