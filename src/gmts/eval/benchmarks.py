"""What ``gmts eval`` knows about each benchmark: prompt template, verifier, decoding, budget.

A :class:`BenchmarkSpec` per benchmark name of :func:`gmts.data.datasets.load_benchmark`,
plus ``builtin:<task>`` for the embedded arithmetic tasks of :mod:`gmts.embedded.tasks`. The
paper's protocol: math and commonsense benchmarks are sampled (average@16 at temperature 1.0);
code benchmarks are decoded greedily and scored pass@1.

:func:`load_eval_benchmark` turns a name into an :class:`EvalBenchmark`: the questions with
their formatted prompts and a scoring function ``score(completion, item) -> (reward,
extracted)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gmts._registry import Registry

Decoding = Literal["sample", "greedy"]
BUILTIN_PREFIX = "builtin:"
CODE_VERIFIERS = ("humaneval", "mbpp")
"""Verifiers that run the model's program (in the sandbox of :mod:`gmts.rewards.sandbox`)."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """How one benchmark is evaluated.

    Attributes:
        name: the name ``gmts eval --benchmarks`` takes (the loader's name).
        display: column header in the results table (the paper's spelling).
        template: prompt template name (:mod:`gmts.data.prompts`).
        verifier: "math", "choice", "yes_no", "humaneval" or "mbpp".
        decoding: "sample" (average@n at the chosen temperature) or "greedy" (pass@1).
        max_new_tokens: default generation budget.
    """

    name: str
    display: str
    template: str
    verifier: str
    decoding: Decoding = "sample"
    max_new_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.decoding not in ("sample", "greedy"):
            raise ValueError(f"decoding must be 'sample' or 'greedy', got {self.decoding!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def runs_code(self) -> bool:
        """Whether scoring executes the model's output (in the code sandbox)."""
        return self.verifier in CODE_VERIFIERS


_SPECS: Registry[BenchmarkSpec] = Registry("benchmark")


def register_benchmark(spec: BenchmarkSpec) -> BenchmarkSpec:
    """Add a spec; a duplicate name raises ValueError."""
    return _SPECS.add(spec.name, spec)


for _spec in (
    # the paper's five math benchmarks (Table 1 column order) and the other math sets
    BenchmarkSpec("aime24", "AIME24", "math", "math"),
    BenchmarkSpec("amc23", "AMC23", "math", "math"),
    BenchmarkSpec("math500", "MATH-500", "math", "math"),
    BenchmarkSpec("minerva", "Minerva", "math", "math"),
    BenchmarkSpec("olympiadbench", "OlympiadBench", "math", "math"),
    BenchmarkSpec("gsm8k", "GSM8K", "math", "math"),
    BenchmarkSpec("math12k", "MATH-12K", "math", "math"),
    # commonsense (Tables 4-5, right)
    BenchmarkSpec("csqa", "CS-QA", "commonsense_choice", "choice"),
    BenchmarkSpec("csqa2", "CS-QA2", "commonsense_yesno", "yes_no"),
    # code (Tables 4-5, left): greedy pass@1
    BenchmarkSpec("humaneval", "HumanEval", "code", "humaneval", "greedy"),
    BenchmarkSpec("mbpp", "MBPP", "code", "mbpp", "greedy"),
):
    register_benchmark(_spec)

PAPER_MATH_BENCHMARKS = ("aime24", "amc23", "math500", "minerva", "olympiadbench")
"""The five math benchmarks of the paper's Tables 1, 2, 6 and 7, in its column order."""


def _loader_names() -> list[str]:
    from gmts.data.datasets import available_benchmarks

    return list(available_benchmarks())


def _task_names() -> list[str]:
    from gmts.embedded.tasks import available_tasks

    return list(available_tasks())


def available_eval_benchmarks() -> list[str]:
    """Every name ``gmts eval`` accepts: dataset benchmarks with a spec, then ``builtin:*``."""
    loaders = set(_loader_names())
    names = [name for name in _SPECS if name in loaders]
    return names + [BUILTIN_PREFIX + t for t in _task_names()]


def get_spec(name: str) -> BenchmarkSpec:
    """The spec of a dataset benchmark or a ``builtin:<task>``; unknown names list valid ones."""
    if name.startswith(BUILTIN_PREFIX):
        task_name = name[len(BUILTIN_PREFIX) :]
        if task_name in _task_names():
            from gmts.embedded.tasks import get_task

            task = get_task(task_name)
            return BenchmarkSpec(name, name, "plain", "task", "sample", task.max_new_tokens)
    elif name in _SPECS and name in _loader_names():
        return _SPECS.get(name)
    raise ValueError(
        f"unknown benchmark {name!r}; valid benchmarks: {', '.join(available_eval_benchmarks())}"
    )


def parse_benchmarks(text: str | list[str]) -> list[str]:
    """Split a comma-separated list, drop blanks and duplicates, and check every name.

    Raises ValueError naming the bad names and listing the valid ones (before any loading).
    """
    items = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    names: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in names:
            names.append(item)
    if not names:
        raise ValueError("benchmarks: give at least one benchmark name")
    bad = []
    for name in names:
        try:
            get_spec(name)
        except ValueError:
            bad.append(name)
    if bad:
        raise ValueError(
            f"unknown benchmark(s) {', '.join(map(repr, bad))}; valid benchmarks: "
            f"{', '.join(available_eval_benchmarks())}"
        )
    return names


# ------------------------------------------------------------------------------------------
# loading and scoring


@dataclass(frozen=True)
class EvalItem:
    """One question ready for generation.

    Attributes:
        id: the question's id (stable across runs; the resume key).
        question: the question text as loaded.
        answer: the gold answer (for code benchmarks: a short description; tests live in meta).
        prompt: the text given to the model (template applied).
        meta: loader extras (choices, tests, entry point, ...).
    """

    id: str
    question: str
    answer: str
    prompt: str
    meta: Mapping[str, Any] = field(default_factory=dict)


Scorer = Callable[[str, EvalItem], tuple[float, Any]]
"""``score(completion, item) -> (reward in [0, 1], extracted answer for the record)``."""


@dataclass(frozen=True)
class EvalBenchmark:
    """A loaded benchmark: spec, items in file order, and its scorer."""

    spec: BenchmarkSpec
    items: list[EvalItem]
    score: Scorer


def _verifier_scorer(verifier: str) -> Scorer:
    """Scorer for the answer verifiers: (reward, what the verifier extracted)."""
    import gmts.rewards as rewards
    from gmts.rewards.boxed import extract_boxed
    from gmts.rewards.choice import extract_choice, extract_yes_no

    pairs = {
        "math": (rewards.math_reward, extract_boxed),
        "choice": (rewards.choice_reward, extract_choice),
        "yes_no": (rewards.yes_no_reward, extract_yes_no),
    }
    reward, extract = pairs[verifier]

    def score(completion: str, item: EvalItem) -> tuple[float, Any]:
        return float(reward(completion, item.answer)), extract(completion)

    return score


def code_sandbox(benchmarks: list[str], sandbox: str | None = None) -> str | None:
    """The sandbox backend the code benchmarks among ``benchmarks`` will run in, checked now.

    None when none of them runs code (nothing is checked). Otherwise
    :func:`gmts.rewards.check_sandbox` (``sandbox`` None: ``$GMTS_SANDBOX``, else "bwrap"),
    which raises ``SandboxUnavailableError`` where bubblewrap does not work: ``gmts eval``
    calls this before loading the model, :func:`gmts.eval.harness.evaluate` before generating.
    """
    if not any(get_spec(name).runs_code for name in benchmarks):
        return None
    from gmts.rewards import check_sandbox

    return check_sandbox(sandbox)


def _code_scorer(kind: str, timeout: float, backend: str) -> Scorer:
    """Scorer for HumanEval / MBPP: run the extracted program against the tests in sandbox
    ``backend`` (as checked by :func:`code_sandbox`)."""
    import gmts.rewards as rewards

    build = rewards.humaneval_program if kind == "humaneval" else rewards.mbpp_program

    def score(completion: str, item: EvalItem) -> tuple[float, Any]:
        program, tests = build(completion, item)  # item has .meta and .answer like an Example
        reward = rewards.code_reward(program, tests, timeout=timeout, backend=backend)
        return float(reward), rewards.extract_code_block(completion)

    return score


def prompt_question(spec: BenchmarkSpec, question: str, meta: Mapping[str, Any]) -> tuple[str, Any]:
    """The question text and choices that go into the template for one loaded example.

    - multiple choice: the loader writes the lettered options into the question and keeps the
      bare ``stem`` and ``choices`` ({"label": [...], "text": [...]}) in meta; the template
      lists them itself, so the stem is used. Without them the question is used as it is.
    - MBPP: the task text alone does not name the function the tests call, so the first test
      is appended ("Your code should pass this test: assert ..."), as is usual for MBPP.
    """
    if spec.template == "commonsense_choice":
        choices = meta.get("choices")
        if isinstance(choices, Mapping) and choices.get("label") and meta.get("stem"):
            return str(meta["stem"]), list(zip(choices["label"], choices["text"]))
        return question, None
    if spec.verifier == "mbpp" and meta.get("test_list"):
        return f"{question}\nYour code should pass this test:\n{meta['test_list'][0]}", None
    return question, None


def load_eval_benchmark(
    name: str,
    *,
    tokenizer: Any,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    code_timeout: float = 10.0,
    sandbox: str | None = None,
) -> EvalBenchmark:
    """Load benchmark ``name`` and format its prompts for ``tokenizer``.

    Args:
        name: a name of :func:`available_eval_benchmarks`.
        tokenizer: chat template source for :func:`gmts.data.prompts.format_prompt` (or None).
        data_dir: folder of the benchmark files (the loader's default when None).
        limit: keep the first ``limit`` questions (file order).
        code_timeout: seconds per program for code benchmarks.
        sandbox: code benchmarks' sandbox backend, "bwrap" or "subprocess" (weaker, explicit
            opt-in); None: ``$GMTS_SANDBOX``, else "bwrap". Checked before the data is loaded.
    """
    from gmts.data.prompts import format_prompt

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    spec = get_spec(name)
    backend = code_sandbox([name], sandbox)  # checked before loading anything
    if spec.verifier == "task":
        from gmts.embedded.tasks import get_task

        task = get_task(name[len(BUILTIN_PREFIX) :])
        problems = task.held_out(limit or 200)
        items = [
            EvalItem(id=str(i), question=p.prompt, answer=p.answer, prompt=p.prompt)
            for i, p in enumerate(problems)
        ]
        return EvalBenchmark(spec, items, lambda c, item: (float(task.reward(c, item.answer)), c))

    from gmts.data.datasets import load_benchmark

    examples = load_benchmark(name, data_dir=data_dir, limit=limit)
    items = []
    for ex in examples:
        meta = dict(ex.meta or {})
        text, choices = prompt_question(spec, ex.question, meta)
        prompt = format_prompt(tokenizer, text, template=spec.template, choices=choices)
        items.append(EvalItem(str(ex.id), ex.question, str(ex.answer), prompt, meta))
    counts = Counter(item.id for item in items)
    if len(counts) != len(items):  # ids are the resume key: duplicates would mix results
        dup = sorted(i for i, c in counts.items() if c > 1)[:5]
        raise ValueError(f"benchmark {name!r} has duplicate question ids: {', '.join(dup)}")
    if backend is not None:
        scorer = _code_scorer(spec.verifier, code_timeout, backend)
    else:
        scorer = _verifier_scorer(spec.verifier)
    return EvalBenchmark(spec, items, scorer)
