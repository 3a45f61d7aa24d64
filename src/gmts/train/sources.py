"""Where training questions come from: a built-in task or a dataset file.

Both sources are deterministic in the run seed and expose their position as a small
``state_dict`` (saved in checkpoints), so a resumed run draws exactly the questions the
uninterrupted run would have drawn. Every rank holds an identical source and draws the same
questions; the trainer gives each rank its slice.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gmts.data.tasks import Problem

RewardFn = Callable[[str, str], float]


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


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl, .jsonl.gz, .json (a list) or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data.dataset: file not found: {path}")
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        if name.endswith(".json") or name.endswith(".json.gz"):
            data = json.load(fh)
            if not isinstance(data, list):
                raise ValueError(f"data.dataset: {path} must hold a JSON list of rows")
            return data
        return [json.loads(line) for line in fh if line.strip()]


class DatasetSource:
    """Questions of a dataset file, rendered with a prompt template, in seeded shuffled passes.

    Prompts longer than ``max_prompt_tokens`` are dropped once at load time
    (``skipped_too_long`` counts them).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        question_field: str,
        answer_field: str,
        tokenizer: Any,
        template: str | None,
        max_prompt_tokens: int,
        shuffle: bool,
        seed: int,
    ) -> None:
        rows = read_rows(path)
        if not rows:
            raise ValueError(f"data.dataset: {path} has no rows")
        for key in (question_field, answer_field):
            if key not in rows[0]:
                raise ValueError(
                    f"data.dataset: field {key!r} not in {path}; fields: {sorted(rows[0])}"
                )
        problems = []
        for row in rows:
            question = str(row[question_field])
            if template is not None:
                from gmts.data.prompts import format_prompt

                prompt = format_prompt(tokenizer, question, template=template)
            else:
                prompt = question
            problems.append(Problem(prompt=prompt, answer=str(row[answer_field])))
        lengths = [len(ids) for ids in tokenizer([p.prompt for p in problems])["input_ids"]]
        self.problems = [p for p, n in zip(problems, lengths) if n <= max_prompt_tokens]
        self.skipped_too_long = len(problems) - len(self.problems)
        if not self.problems:
            raise ValueError(
                f"data.dataset: every prompt is longer than rollout.max_prompt_length "
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


def dataset_reward(name: str) -> RewardFn:
    """The reward function ``name`` from gmts.rewards (``reward(completion, answer) -> float``)."""
    try:
        import gmts.rewards as rewards
    except ImportError as exc:  # pragma: no cover
        raise ValueError(f"data.reward: gmts.rewards is unavailable ({exc})") from exc
    getter = getattr(rewards, "get_reward", None)
    if getter is not None:
        return getter(name)
    if name == "math":
        from gmts.rewards.boxed import extract_boxed
        from gmts.rewards.math_answer import answers_match

        def math_reward(completion: str, answer: str) -> float:
            predicted = extract_boxed(completion)
            return 1.0 if predicted is not None and answers_match(predicted, answer) else 0.0

        return math_reward
    raise ValueError(f"data.reward: unknown reward {name!r}; available here: ['math']")
