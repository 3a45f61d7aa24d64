"""What ``gmts eval`` settles and says before any work: a user's file's budget fitted to the
model, one line per benchmark with its template, temperature and budget (each with the flag
that changes it) and the size of the work, and after it the answers that ran into the budget.

- a user's file (``--benchmarks mine.jsonl``) without ``--max-new-tokens`` gets the budget of
  :func:`gmts.models.defaults.fit_budget` (its longest gold answer and longest prompt, in the
  model's tokens, and the model's context); its ``--template auto`` is resolved by the model's
  tokenizer (:func:`gmts.data.prompts.resolve_template`);
- a registered benchmark keeps its own template and budget (``--max-new-tokens`` overrides the
  budget of every benchmark of the run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gmts.eval.benchmarks import get_spec, is_data_file, load_eval_benchmark
from gmts.eval.harness import EvalConfig, decoding_for
from gmts.models.context import ContextLimit, longest_prompt
from gmts.models.defaults import (
    FittedBudget,
    Setting,
    fit_budget,
    settings_line,
    template_setting,
    truncation_message,
)

__all__ = [
    "BenchmarkSettings",
    "benchmark_settings",
    "cut_at_budget",
    "fit_file_budget",
    "misleading_results",
]

NEAR_BUDGET = 0.9
"""An answer whose text re-encodes to at least this share of the budget counts as cut: the
completions come back as text, whose tokens can merge when encoded again."""


def _items(name: str, tokenizer: Any, config: EvalConfig) -> list[Any]:
    return load_eval_benchmark(
        name,
        tokenizer=tokenizer,
        data_dir=config.data_dir,
        limit=config.limit,
        sandbox=config.sandbox,
    ).items


def fit_file_budget(
    tokenizer: Any, context: ContextLimit | None, benchmarks: list[str], config: EvalConfig
) -> FittedBudget | None:
    """The budget of the run's own files (one for all of them: they share ``FileFields``), or
    None when there is none or a budget was given (``--max-new-tokens``)."""
    files = [name for name in benchmarks if is_data_file(name)]
    if not files or config.max_new_tokens is not None:
        return None
    if config.file_fields.max_new_tokens is not None:
        return None
    items = [item for name in files for item in _items(name, tokenizer, config)]
    return fit_budget(
        longest_answer=longest_prompt(tokenizer, [item.answer for item in items]),
        longest_prompt=longest_prompt(tokenizer, [item.prompt for item in items]),
        context=context,
    )


@dataclass(frozen=True)
class BenchmarkSettings:
    """One benchmark's generation settings and the size of its work.

    Attributes:
        name: the benchmark. settings: template, temperature, budget (:class:`Setting`).
        questions: questions to evaluate. samples: answers per question.
        max_new_tokens: the budget in tokens.
    """

    name: str
    settings: tuple[Setting, ...]
    questions: int
    samples: int
    max_new_tokens: int

    def line(self) -> str:
        """The line printed before any work: the settings, then the work and how to cut it."""
        tokens = self.questions * self.samples * self.max_new_tokens
        return (
            f"{settings_line('gmts eval', self.settings, what=get_spec(self.name).display)}; "
            f"{self.questions} questions x {self.samples} samples x up to "
            f"{self.max_new_tokens} new tokens = {tokens:,} at most (--limit, --n, "
            "--max-new-tokens make it shorter)"
        )


def benchmark_settings(
    tokenizer: Any, benchmarks: list[str], config: EvalConfig, fitted: FittedBudget | None = None
) -> list[BenchmarkSettings]:
    """Each benchmark's settings under ``config`` (``fitted``: the budget of the run's files,
    already in ``config.file_fields``)."""
    out = []
    for name in benchmarks:
        spec = get_spec(name)
        own_file = is_data_file(name)
        if own_file:
            template = template_setting(spec.template, tokenizer, "--template")
        else:
            template = Setting("template", spec.template, "the benchmark's own")
        n, temperature, _ = decoding_for(name, config)
        greedy = temperature == 0.0 and config.temperature != 0.0
        heat = Setting(
            "temperature",
            str(float(temperature)),
            "--temperature",
            "greedy: the benchmark's decoding" if greedy else "",
        )
        budget = config.max_new_tokens or spec.max_new_tokens
        if config.max_new_tokens is not None:
            note = ""
        elif own_file and fitted is not None:
            note = fitted.reason
        else:
            note = "the benchmark's own"
        tokens = Setting("budget", f"{budget} new tokens", "--max-new-tokens", note)
        questions = len(_items(name, tokenizer, config))
        out.append(BenchmarkSettings(name, (template, heat, tokens), questions, n, budget))
    return out


def cut_at_budget(tokenizer: Any, completions: list[str], budget: int) -> int:
    """How many ``completions`` used at least :data:`NEAR_BUDGET` of ``budget`` new tokens
    (their text encoded again by ``tokenizer``): those that were most likely cut."""
    if not completions:
        return 0
    lengths = tokenizer(completions, add_special_tokens=False)["input_ids"]
    return sum(len(ids) >= math.ceil(NEAR_BUDGET * budget) for ids in lengths)


SHOWN_CHARS = 120
"""A completion quoted in a warning is cut to this many characters."""


def misleading_results(report: Any, tokenizer: Any, config: EvalConfig) -> list[str]:
    """The warnings of a finished run, one line each: a benchmark where most answers used (nearly)
    all of the budget (:func:`cut_at_budget`), and one where no answer scored anything (with an
    answer and the settings that usually explain it)."""
    lines = []
    for result in report.benchmarks:
        budget = config.max_new_tokens or get_spec(result.name).max_new_tokens
        completions = [c for record in result.records for c in record.completions]
        cut = truncation_message(
            cut_at_budget(tokenizer, completions, budget),
            len(completions),
            budget,
            "--max-new-tokens",
            near=NEAR_BUDGET,
        )
        if cut is not None:
            lines.append(f"{result.display}: {cut}")
        rewards = [r for record in result.records for r in record.rewards]
        if rewards and not any(rewards):
            shown = (
                completions[0]
                if len(completions[0]) <= SHOWN_CHARS
                else (completions[0][:SHOWN_CHARS] + "...")
            )
            lines.append(
                f"{result.display}: every answer scored 0 ({len(rewards)} answers; e.g. "
                f"{shown!r} for gold {result.records[0].answer!r}): check that the model can "
                "write what the reward reads (--reward) and try --template, a lower "
                "--temperature (a small model rambles at 1.0) or a larger --max-new-tokens"
            )
    return lines
