"""What ``gmts eval`` evaluates: the registered benchmarks of :mod:`gmts.data.benchmarks` (each
with its template, verifier and decoding), ``builtin:<task>`` for the embedded arithmetic
tasks of :mod:`gmts.embedded.tasks`, and a user's own file (``path.jsonl``: its fields, reward
and template named by :class:`FileFields`, read as ``data.dataset`` reads a file for training).

:func:`load_eval_benchmark` turns a name into an :class:`EvalBenchmark`: the questions with
their formatted prompts and a scoring function ``score(completion, item) -> (reward,
extracted)``, by the benchmark's own verifier or, under ``gmts eval --verifier NAME``, by the
reward ``NAME`` of :mod:`gmts.rewards` in its place (:func:`verifier_override`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.data.benchmarks import Benchmark, available_benchmarks, get_benchmark
from gmts.rewards.verifiers import Verifier

BUILTIN_PREFIX = "builtin:"
DATA_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
"""A ``--benchmarks`` entry ending in one of these (and not a registered name) is a file."""


@dataclass(frozen=True)
class FileFields:
    """How the rows of a user's own benchmark file are read, prompted and scored (``gmts eval
    --question-field/--answer-field/--id-field/--reward/--template``; the training side's
    ``data.question_field``, ``data.answer_field``, ``data.reward``, ``data.template``).

    ``template`` ``auto``: the one that fits the model's tokenizer
    (:func:`gmts.data.prompts.resolve_template`). ``max_new_tokens``: the file's generation
    budget (None: :class:`gmts.data.benchmarks.Benchmark`'s default; ``gmts eval`` fits one to
    the model and the answers, :func:`gmts.models.defaults.fit_budget`)."""

    question_field: str = "problem"
    answer_field: str = "answer"
    id_field: str | None = None
    reward: str = "math"
    template: str = "auto"
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        from gmts.data.prompts import check_template
        from gmts.rewards.registry import available_rewards

        if self.reward not in available_rewards():
            raise ValueError(f"unknown reward {self.reward!r}; available: {available_rewards()}")
        check_template(self.template, "template")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


_FILE_BENCHMARKS: dict[str, Benchmark] = {}  # the files named in this process, by name


def is_data_file(name: str) -> bool:
    """Whether ``name`` names a data file rather than a registered benchmark."""
    return name.lower().endswith(DATA_FILE_SUFFIXES) and name not in available_benchmarks()


def reward_verifier(name: str) -> Verifier:
    """A verifier scoring ``reward(completion, example.answer)`` with the registered reward
    ``name``: the benchmark verifier of that name where one exists (it records the extracted
    answer too), else the reward itself (a code reward runs in the verifier's sandbox)."""
    from gmts.rewards.registry import get_reward, reward_runs_code
    from gmts.rewards.verifiers import available_verifiers, get_verifier

    if name in available_verifiers():
        return get_verifier(name)
    bound: dict[str | None, Callable[[str, str], float]] = {}

    def score(completion: str, example: Any, *, backend: str | None = None, **_: Any):
        if backend not in bound:  # a code reward checks (and binds) its sandbox once
            bound[backend] = get_reward(name, sandbox=backend)
        return float(bound[backend](completion, example.answer)), None

    return Verifier(f"reward:{name}", score, runs_code=reward_runs_code(name))


def check_verifier(name: str) -> None:
    """Raise ValueError unless reward ``name`` can score any benchmark in place of its own
    verifier (``gmts eval --verifier``): a registered reward of :mod:`gmts.rewards` that runs
    no code (a code reward's gold is test code, which only code benchmarks hold, and those are
    scored by their own tests)."""
    from gmts.rewards.registry import available_rewards, reward_runs_code

    if name not in available_rewards():
        raise ValueError(
            f"unknown verifier {name!r}; a verifier is a reward of gmts.rewards: "
            f"{', '.join(available_rewards())}"
        )
    if reward_runs_code(name):
        raise ValueError(
            f"verifier {name!r} runs code against gold test code, which no answer benchmark "
            f"holds; code benchmarks are scored by their own tests (your own file of test code: "
            f"--reward {name})"
        )


def verifier_override(name: str, verifier: str | None) -> Verifier | None:
    """The verifier that scores benchmark ``name`` in place of its own under ``gmts eval
    --verifier`` (:func:`reward_verifier` of the reward ``verifier``).

    None when ``verifier`` is None or is the benchmark's own verifier (nothing changes).
    Raises ValueError for a name :func:`check_verifier` refuses and for a code benchmark: its
    score is its tests run in the sandbox, which no answer reward may silently replace.
    """
    if verifier is None:
        return None
    check_verifier(verifier)
    spec = get_spec(name)
    if spec.runs_code:
        raise ValueError(
            f"verifier {verifier!r} cannot score the code benchmark {name!r}: it is scored by "
            "running its tests in the sandbox; evaluate it in a run without --verifier"
        )
    chosen = reward_verifier(verifier)
    return None if chosen.name == spec.verifier.name else chosen


def file_benchmark(path: str, fields: FileFields) -> Benchmark:
    """The benchmark of a user's file ``path`` (its name is ``path`` as given); ValueError when
    it is not a file."""
    from gmts.data.datasets import _field_parser

    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"benchmark file {path!r} not found")
    return Benchmark(
        name=path,
        display=file.name,
        splits={"file": str(file.resolve())},
        default_split="file",
        parse_row=_field_parser(fields.question_field, fields.answer_field, fields.id_field, None),
        template=fields.template,
        verifier=reward_verifier(fields.reward),
        max_new_tokens=fields.max_new_tokens or Benchmark.max_new_tokens,
    )


def _task_names() -> list[str]:
    from gmts.embedded.tasks import available_tasks

    return list(available_tasks())


def available_eval_benchmarks() -> list[str]:
    """Every name ``gmts eval`` accepts: the registered benchmarks, then ``builtin:*`` (and any
    file ending in one of ``DATA_FILE_SUFFIXES``)."""
    return available_benchmarks() + [BUILTIN_PREFIX + t for t in _task_names()]


def _builtin(name: str) -> Benchmark:
    """A built-in task as a benchmark: its held-out questions, scored by the task's reward."""
    from gmts.embedded.tasks import get_task

    task = get_task(name[len(BUILTIN_PREFIX) :])

    def score(completion: str, item: Any, **_: Any) -> tuple[float, Any]:
        return float(task.reward(completion, item.answer)), completion

    verifier = Verifier(f"task:{task.name}", score)
    return Benchmark(
        name, name, {}, "held-out", None, "plain", verifier, "sample", task.max_new_tokens
    )


def get_spec(name: str) -> Benchmark:
    """The benchmark ``name`` (registered, ``builtin:<task>`` or a file named to
    :func:`parse_benchmarks`); unknown names list valid ones."""
    if name in _FILE_BENCHMARKS:
        return _FILE_BENCHMARKS[name]
    if name.startswith(BUILTIN_PREFIX) and name[len(BUILTIN_PREFIX) :] in _task_names():
        return _builtin(name)
    if name in available_benchmarks():
        return get_benchmark(name)
    raise ValueError(
        f"unknown benchmark {name!r}; valid benchmarks: {', '.join(available_eval_benchmarks())}"
        f", or a file ending in {', '.join(DATA_FILE_SUFFIXES)}"
    )


def parse_benchmarks(text: str | list[str], file_fields: FileFields | None = None) -> list[str]:
    """Split a comma-separated list, drop blanks and duplicates, and check every name.

    A name ending in one of ``DATA_FILE_SUFFIXES`` is a user's file, read and scored as
    ``file_fields`` says (default :class:`FileFields`); from here on :func:`get_spec` knows it.
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
        if is_data_file(name):
            _FILE_BENCHMARKS[name] = file_benchmark(name, file_fields or FileFields())
            continue
        try:
            get_spec(name)
        except ValueError:
            bad.append(name)
    if bad:
        raise ValueError(
            f"unknown benchmark(s) {', '.join(map(repr, bad))}; valid benchmarks: "
            f"{', '.join(available_eval_benchmarks())}, or a file ending in "
            f"{', '.join(DATA_FILE_SUFFIXES)}"
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
    """A loaded benchmark: spec, items in file order, and its scorer.

    ``verifier_override``: the reward that scores it in place of ``spec.verifier``
    (:func:`verifier_override`); None when its own verifier scores it.
    """

    spec: Benchmark
    items: list[EvalItem]
    score: Scorer
    verifier_override: str | None = None


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


def prompt_question(spec: Benchmark, question: str, meta: Mapping[str, Any]) -> tuple[str, Any]:
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
    if spec.verifier.name == "mbpp" and meta.get("test_list"):
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
    verifier: str | None = None,
) -> EvalBenchmark:
    """Load benchmark ``name`` and format its prompts for ``tokenizer``.

    Args:
        name: a name of :func:`available_eval_benchmarks` or a file given to
            :func:`parse_benchmarks`.
        tokenizer: chat template source for :func:`gmts.data.prompts.format_prompt` (or None).
        data_dir: folder of the benchmark files (the loader's default when None).
        limit: keep the first ``limit`` questions (file order).
        code_timeout: seconds per program for code benchmarks.
        sandbox: code benchmarks' sandbox backend, "bwrap" or "subprocess" (weaker, explicit
            opt-in); None: ``$GMTS_SANDBOX``, else "bwrap". Checked before the data is loaded.
        verifier: a reward of :mod:`gmts.rewards` scoring in place of the benchmark's own
            verifier (:func:`verifier_override`, checked before the data is loaded); None: its
            own.
    """
    from gmts.data.prompts import format_prompt

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    spec = get_spec(name)
    override = verifier_override(name, verifier)  # checked before loading anything
    scoring = override or spec.verifier
    backend = code_sandbox([name], sandbox)
    if name.startswith(BUILTIN_PREFIX):
        from gmts.embedded.tasks import get_task

        problems = get_task(name[len(BUILTIN_PREFIX) :]).held_out(limit or 200)
        items = [
            EvalItem(id=str(i), question=p.prompt, answer=p.answer, prompt=p.prompt)
            for i, p in enumerate(problems)
        ]
    else:
        from gmts.data.benchmarks import read_benchmark

        items = []
        for ex in read_benchmark(spec, data_dir=data_dir, limit=limit):
            meta = dict(ex.meta or {})
            text, choices = prompt_question(spec, ex.question, meta)
            prompt = format_prompt(tokenizer, text, template=spec.template, choices=choices)
            items.append(EvalItem(str(ex.id), ex.question, str(ex.answer), prompt, meta))
        counts = Counter(item.id for item in items)
        if len(counts) != len(items):  # ids are the resume key: duplicates would mix results
            dup = sorted(i for i, c in counts.items() if c > 1)[:5]
            raise ValueError(f"benchmark {name!r} has duplicate question ids: {', '.join(dup)}")

    def score(completion: str, item: EvalItem) -> tuple[float, Any]:
        return scoring.score(completion, item, backend=backend, timeout=code_timeout)

    return EvalBenchmark(spec, items, score, verifier if override else None)
