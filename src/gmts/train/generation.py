"""What a run generates with: the budget fitted to a dataset and the model, and the line that
says the template, temperature and budget before any weight is read.

``rollout.max_response_length: null`` means the built-in task's own budget, or for
``data.dataset`` the budget :func:`gmts.models.defaults.fit_budget` fits to the data (its
longest gold answer, of the training and held-out questions) and the model's context (the
longest prompt of either). ``data.template: auto`` is resolved by the prompts themselves
(:func:`gmts.data.prompts.resolve_template`); the line names what it became.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gmts.data.prompts import resolve_template
from gmts.models.context import ContextLimit, longest_prompt
from gmts.models.defaults import Setting, fit_budget, settings_line, template_setting
from gmts.train.config import TrainConfig
from gmts.train.sources import DatasetSource, HeldOutSet

__all__ = ["RunGeneration", "dataset_context_settings", "run_generation"]


@dataclass(frozen=True)
class RunGeneration:
    """A run's generation budget, its held-out set with that budget, and the settings line.

    Attributes:
        max_new_tokens: new tokens per answer (rollouts and held-out evaluation).
        held_out: ``data.eval_dataset``'s questions carrying that budget (None without).
        line: ``"gmts train: template plain (data.template; ...), temperature 0.7 (...),
            budget 128 new tokens (...)"``.
    """

    max_new_tokens: int
    held_out: HeldOutSet | None
    line: str


def run_generation(
    cfg: TrainConfig,
    tokenizer: Any,
    limit: ContextLimit | None,
    *,
    source: Any,
    held_out: HeldOutSet | None,
    max_new_tokens: int,
) -> RunGeneration:
    """The budget of the run (``max_new_tokens``: the task's own or the one set; fitted for a
    dataset when ``rollout.max_response_length`` is null) and its settings line.

    Args:
        tokenizer: the run's tokenizer (answers are measured in its tokens).
        limit: the model's context (None: unknown).
        source: the training questions (a :class:`DatasetSource` for ``data.dataset``).
        held_out: ``data.eval_dataset``'s questions, or None.
    """
    r, d = cfg.rollout, cfg.data
    budget_note = ""
    if isinstance(source, DatasetSource):
        if r.max_response_length is None:
            sets = [source.problems] + ([held_out.problems] if held_out is not None else [])
            fitted = fit_budget(
                longest_answer=longest_prompt(tokenizer, [p.answer for s in sets for p in s]),
                longest_prompt=max(
                    source.longest_prompt, held_out.longest_prompt if held_out else 0
                ),
                context=limit,
            )
            max_new_tokens, budget_note = fitted.tokens, fitted.reason
        template = (
            template_setting(d.template, tokenizer, "data.template")
            if d.template is not None
            else Setting("template", "none", "data.template", "the raw question")
        )
    else:
        template = Setting("template", "none", "data.template", f"data.task {d.task}'s prompts")
        if r.max_response_length is None:
            budget_note = "the task's own"
    if held_out is not None and held_out.max_new_tokens != max_new_tokens:
        held_out = dataclasses.replace(held_out, max_new_tokens=max_new_tokens)
    evaluates = d.eval_questions > 0 and (d.dataset is None or d.eval_dataset is not None)
    temperature = Setting(
        "temperature",
        str(float(r.temperature)),
        "rollout.temperature",
        f"held-out: {float(d.eval_temperature)}, data.eval_temperature" if evaluates else "",
    )
    budget = Setting(
        "budget", f"{max_new_tokens} new tokens", "rollout.max_response_length", budget_note
    )
    line = settings_line("gmts train", [template, temperature, budget])
    return RunGeneration(max_new_tokens, held_out, line)


def dataset_context_settings(cfg: TrainConfig, tokenizer: Any) -> str:
    """The settings a dataset run's context error names: the template first (its text is part
    of every prompt), then the prompt and the answer lengths."""
    template = cfg.data.template
    shown = "null" if template is None else resolve_template(template, tokenizer)
    if template is not None and shown != template:
        shown = f"{template}: {shown}"
    budget = (
        "rollout.max_response_length"
        if cfg.rollout.max_response_length
        else "rollout.max_response_length (null: fitted, at most the context the prompt leaves)"
    )
    return (
        f"data.template (now {shown}), "
        f"rollout.max_prompt_length (longer prompts are dropped) or {budget}"
    )
