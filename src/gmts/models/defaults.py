"""Generation defaults fitted to the model: the budget of a user's questions, and the line every
command prints about its template, temperature and budget.

The template half lives with the templates (:func:`gmts.data.prompts.resolve_template`: ``auto``
is ``plain`` for a model with a chat template, ``math`` for one without that can read its
instruction, ``plain`` for the embedded model). The budget of a user's file, when none is given
(``rollout.max_response_length: null``, ``gmts eval`` without ``--max-new-tokens``), is
:func:`fit_budget`:

    budget = min(max(BUDGET_MIN, ANSWER_FACTOR x the longest gold answer), BUDGET_MAX),
             then at most the context left after the longest prompt

in tokens of the model's tokenizer. A gold answer is what a right completion must at least
write; four times it leaves room to write it in a sentence or after a few steps, and the floor
of 128 tokens room for a short chain of reasoning when the golds are bare numbers; the cap of
1024 keeps a file of long solutions from asking a CPU for minutes per answer. A file whose
answers need longer reasoning needs the budget given (the warning on answers cut at the budget
says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gmts.models.context import ContextLimit

__all__ = [
    "ANSWER_FACTOR",
    "BUDGET_MAX",
    "BUDGET_MIN",
    "FittedBudget",
    "Setting",
    "fit_budget",
    "settings_line",
    "template_setting",
    "truncation_message",
]

BUDGET_MIN = 128
"""The fitted budget's floor, in new tokens."""
BUDGET_MAX = 1024
"""The fitted budget's cap, in new tokens (the memory plan assumes it for a dataset run)."""
ANSWER_FACTOR = 4
"""The fitted budget is this many times the longest gold answer (within the floor and cap)."""
BUDGET_RULE = (
    f"{ANSWER_FACTOR} x the longest gold answer in tokens, at least {BUDGET_MIN}, at most "
    f"{BUDGET_MAX}, and no more than the context left after the longest prompt"
)
"""The rule in words, for help texts."""
TRUNCATED_WARN_FRACTION = 0.5
"""More than this fraction of the answers cut at the budget: a warning (train and eval)."""


@dataclass(frozen=True)
class FittedBudget:
    """A generation budget and how it was reached.

    Attributes:
        tokens: new tokens per answer (>= 1; may not fit when the prompt fills the context:
            the context guard then says so).
        reason: e.g. ``"fitted: 4 x the longest answer (3 tokens), at least 128"``.
    """

    tokens: int
    reason: str


def fit_budget(
    *, longest_answer: int, longest_prompt: int, context: ContextLimit | None
) -> FittedBudget:
    """The budget of :data:`BUDGET_RULE` for questions whose longest gold answer and prompt
    take ``longest_answer`` and ``longest_prompt`` tokens, in a model of ``context`` (None:
    unknown, no limit)."""
    wanted = ANSWER_FACTOR * longest_answer
    tokens = min(max(BUDGET_MIN, wanted), BUDGET_MAX)
    if wanted < BUDGET_MIN:
        reason = f"at least {BUDGET_MIN}"
    elif wanted > BUDGET_MAX:
        reason = f"at most {BUDGET_MAX}"
    else:
        reason = "the answers' room"
    reason = (
        f"fitted: {ANSWER_FACTOR} x the longest gold answer ({longest_answer} tokens), {reason}"
    )
    if context is not None and context.positions - longest_prompt < tokens:
        tokens = max(context.positions - longest_prompt, 1)
        reason = (
            f"fitted: the context left after the longest prompt ({context.positions} - "
            f"{longest_prompt} tokens)"
        )
    return FittedBudget(tokens, reason)


@dataclass(frozen=True)
class Setting:
    """One generation setting as a command reports it.

    Attributes:
        name: ``"template"``, ``"temperature"``, ``"budget"``.
        value: what is used, e.g. ``"plain"``, ``"0.7"``, ``"128 new tokens"``.
        key: the flag or config key that changes it, e.g. ``"--template"``.
        note: why this value, e.g. ``"auto: the model's chat template"`` ("" for none).
    """

    name: str
    value: str
    key: str
    note: str = ""

    def __str__(self) -> str:
        why = f"; {self.note}" if self.note else ""
        return f"{self.name} {self.value} ({self.key}{why})"


def template_setting(name: str, tokenizer: Any, key: str) -> Setting:
    """The template a setting of ``name`` (``auto`` or a registered one) gives ``tokenizer``,
    with ``key`` (what changes it) and, for ``auto``, why."""
    from gmts.data.prompts import resolve_template, why_template

    return Setting(
        "template", resolve_template(name, tokenizer), key, why_template(name, tokenizer)
    )


def settings_line(command: str, settings: Sequence[Setting], what: str = "") -> str:
    """The one line a command prints before its work: ``"gmts eval: mine.jsonl: template plain
    (--template; ...), temperature 1.0 (--temperature), budget 128 new tokens (...)"``."""
    head = f"{command}: {what}: " if what else f"{command}: "
    return head + ", ".join(str(s) for s in settings)


def truncation_message(
    cut: int, answers: int, budget: int, key: str, *, near: float | None = None
) -> str | None:
    """The warning when more than :data:`TRUNCATED_WARN_FRACTION` of ``answers`` were cut at
    ``budget`` new tokens (``key``: what raises it), else None. ``near``: ``cut`` counts the
    answers that used at least this share of the budget (their length measured again from
    their text) rather than those known to have stopped without an end token."""
    if answers <= 0 or cut <= TRUNCATED_WARN_FRACTION * answers:
        return None
    how = (
        f"used at least {near:.0%} of the budget of {budget} new tokens (most likely cut"
        if near is not None
        else f"stopped at the budget of {budget} new tokens without an end token ("
    )
    sep = "; " if near is not None else ""
    return f"{cut} of {answers} answers {how}{sep}cut answers usually score 0); raise {key}"
