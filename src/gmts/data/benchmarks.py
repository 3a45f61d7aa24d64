"""The named benchmarks: each registered once with its files, row parser, prompt template,
verifier and decoding, so that loading (training data, ``gmts eval``) and scoring read one
record.

The paper's protocol: math and commonsense benchmarks are sampled (average@16 at temperature
1.0); code benchmarks are decoded greedily and scored pass@1.

Where a split is read from, first found wins (:func:`read_benchmark`):
1. a data folder the user named (``data_dir`` / ``gmts eval --data-dir``, else
   ``$GMTS_DATA_DIR``), in the layout of ``Benchmark.splits`` (never copied into the
   repository); a named folder without the file is an error, never skipped;
2. a development machine's ``../shared/data`` (:func:`gmts.data.datasets.dev_data_dirs`);
3. the Hugging Face Hub copy of ``Benchmark.hub`` through ``datasets.load_dataset`` (cached
   by ``datasets``; offline, a cached copy still loads).
Neither: one error line naming both ways.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gmts._registry import Registry
from gmts.data.datasets import (
    DATA_DIR_ENV,
    Example,
    RowParser,
    _check_limit,
    _collect,
    configured_data_dir,
    dev_data_dirs,
    read_records,
)
from gmts.data.generated import (
    addition_example,
    addition_rows,
    ask_for_number,
    word_problem_example,
    word_problem_rows,
)
from gmts.rewards.verifiers import Verifier, get_verifier

__all__ = [
    "Benchmark",
    "HubSource",
    "available_benchmarks",
    "get_benchmark",
    "load_benchmark",
    "read_benchmark",
    "register_benchmark",
]

Decoding = Literal["sample", "greedy"]


@dataclass(frozen=True)
class HubSource:
    """One split of a benchmark on the Hugging Face Hub.

    Attributes:
        path: the dataset id (``datasets.load_dataset``'s ``path``), e.g. "HuggingFaceH4/MATH-500".
        split: the hub's split name.
        config: the hub's configuration name (None: the default).
        parse_row: the row parser of the hub's fields (None: the benchmark's own, when the hub
            rows carry the file's fields).
    """

    path: str
    split: str
    config: str | None = None
    parse_row: RowParser | None = None


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: where it lives, how its rows become Examples, how it is evaluated.

    Attributes:
        name: the name ``load_benchmark`` and ``gmts eval --benchmarks`` take.
        display: column header in the results table (the paper's spelling).
        splits: split name -> file path relative to the data folder (or an absolute path:
            a user's own file, read from there).
        default_split: the split loaded when none is asked for (its evaluation split).
        parse_row: ``(row, index, split) -> Example``; None for a benchmark not read from files
            (``gmts eval``'s ``builtin:<task>``).
        template: prompt template name (:mod:`gmts.data.prompts`; a user's file may say
            ``auto``: the one that fits the model's tokenizer).
        verifier: how a completion is scored (:mod:`gmts.rewards.verifiers`).
        decoding: "sample" (average@n at the chosen temperature) or "greedy" (pass@1).
        max_new_tokens: default generation budget.
        keep: optional row filter per split (MBPP selects task-id ranges from one file).
        hub: split name -> its copy on the Hugging Face Hub, read when no data folder has it.
        generate: ``split -> rows`` for a benchmark made by code (:mod:`gmts.data.generated`):
            its rows come from there, never from a folder or the hub.
    """

    name: str
    display: str
    splits: Mapping[str, str]
    default_split: str
    parse_row: RowParser | None
    template: str
    verifier: Verifier
    decoding: Decoding = "sample"
    max_new_tokens: int = 2048
    keep: Callable[[dict[str, Any], str], bool] | None = None
    hub: Mapping[str, HubSource] = field(default_factory=dict)
    generate: Callable[[str], Iterable[dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        if self.decoding not in ("sample", "greedy"):
            raise ValueError(f"decoding must be 'sample' or 'greedy', got {self.decoding!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.splits and self.default_split not in self.splits:
            raise ValueError(f"default_split {self.default_split!r} is not one of the splits")
        unknown = sorted(set(self.hub) - set(self.splits))
        if unknown:
            raise ValueError(f"hub names splits the benchmark does not have: {unknown}")

    @property
    def runs_code(self) -> bool:
        """Whether scoring executes the model's output (in the code sandbox)."""
        return self.verifier.runs_code


_BENCHMARKS = Registry[Benchmark]("benchmark")


register_benchmark = _BENCHMARKS.register
get_benchmark = _BENCHMARKS.get


def available_benchmarks() -> list[str]:
    """Names `load_benchmark` accepts, in registration order."""
    return list(_BENCHMARKS)


# ----------------------------------------------------------------------------- row parsers


def _normalize_math(answer: Any) -> str:
    from gmts.rewards.math_answer import normalize_answer  # stdlib-only module, cheap

    return normalize_answer(answer)


def _last_boxed(text: str) -> str:
    from gmts.rewards.boxed import extract_boxed

    return extract_boxed(text) or ""


def _lettered(stem: str, labels: list[str], texts: list[str]) -> str:
    options = "\n".join(f"{label}. {text}" for label, text in zip(labels, texts))
    return f"{stem}\n{options}"


def _math_row(question_key: str, id_key: str | None) -> RowParser:
    def parse(row: dict[str, Any], index: int, split: str) -> Example:
        raw = row.get("answer")
        meta = {k: v for k, v in row.items() if k not in (question_key,)}
        meta["raw_answer"] = raw
        row_id = str(row[id_key]) if id_key and row.get(id_key) is not None else str(index)
        return Example(row_id, str(row[question_key]), _normalize_math(raw), meta)

    return parse


def _minerva_row(row: dict[str, Any], index: int, split: str) -> Example:
    gold = _last_boxed(str(row.get("solution", "")))
    meta = {k: v for k, v in row.items() if k != "problem"}
    meta["raw_answer"] = gold
    return Example(str(row.get("idx", index)), str(row["problem"]), _normalize_math(gold), meta)


def _olympiad_row(row: dict[str, Any], index: int, split: str) -> Example:
    finals = row.get("final_answer") or []
    if isinstance(finals, str):
        finals = [finals]
    # one string per row in practice; several would be one comma-separated answer
    gold = ",".join(_normalize_math(part) for part in finals)
    question = str(row["question"])
    if row.get("context"):
        question = f"{row['context']}\n\n{question}"
    meta = {k: v for k, v in row.items() if k != "question"}
    meta["raw_answer"] = finals
    return Example(str(row.get("id", index)), question, gold, meta)


def _gsm8k_row(row: dict[str, Any], index: int, split: str) -> Example:
    solution = str(row.get("answer", ""))
    gold = solution.split("####")[-1].strip().replace(",", "") if "####" in solution else ""
    meta = {"solution": solution, "raw_answer": gold}
    return Example(f"gsm8k-{split}-{index}", str(row["question"]), _normalize_math(gold), meta)


def _csqa_row(row: dict[str, Any], index: int, split: str) -> Example:
    choices = row.get("choices") or {}
    labels = [str(label) for label in choices.get("label", [])]
    texts = [str(text) for text in choices.get("text", [])]
    stem = str(row["question"])
    meta = {
        "stem": stem,
        "choices": {"label": labels, "text": texts},
        "question_concept": row.get("question_concept"),
    }
    answer = str(row.get("answerKey") or "").strip().upper()
    return Example(str(row.get("id", index)), _lettered(stem, labels, texts), answer, meta)


def _csqa2_row(row: dict[str, Any], index: int, split: str) -> Example:
    answer = str(row.get("answer") or "").strip().lower()
    meta = {k: v for k, v in row.items() if k in ("confidence", "date", "relational_prompt")}
    return Example(str(row.get("id", index)), str(row["question"]), answer, meta)


def _humaneval_row(row: dict[str, Any], index: int, split: str) -> Example:
    entry_point = str(row["entry_point"])
    tests = f"{row['test']}\n\ncheck({entry_point})\n"
    meta = {
        "task_id": row.get("task_id"),
        "prompt": row["prompt"],
        "entry_point": entry_point,
        "canonical_solution": row.get("canonical_solution", ""),
        "test": row["test"],
    }
    return Example(str(row.get("task_id", index)), str(row["prompt"]), tests, meta)


_ASSERT_CALL = re.compile(r"assert\s+\(?\s*(?:not\s+)?\(?\s*(?:set\()?\s*([A-Za-z_]\w*)\s*\(")


def _mbpp_row(row: dict[str, Any], index: int, split: str) -> Example:
    test_list = [str(test) for test in row.get("test_list", [])]
    setup = str(row.get("test_setup_code") or "")
    tests = setup + "\n" + "\n".join(test_list) + "\n"
    match = _ASSERT_CALL.search(test_list[0]) if test_list else None
    meta = {
        "task_id": row.get("task_id"),
        "text": row.get("text"),
        "test_list": test_list,
        "test_setup_code": setup,
        "canonical_solution": row.get("code", ""),
        "entry_point": match.group(1) if match else None,
    }
    return Example(f"mbpp/{row.get('task_id', index)}", str(row["text"]), tests, meta)


# ----------------------------------------------------------------------------- benchmark table


def _mbpp_keep(row: dict[str, Any], split: str) -> bool:
    # the upstream README's split of task ids
    low, high = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600)}.get(
        split, (601, 974)
    )
    return low <= int(row["task_id"]) <= high


# ----------------------------------------------------------------------------- the table

# the paper's format: the math benchmarks read the last \boxed{} (the `math` verifier, which
# also reads an unboxed final number, scores `addition-2digit` and your own files)
_MATH, _CHOICE, _YES_NO = get_verifier("math-boxed"), get_verifier("choice"), get_verifier("yes_no")
_HUMANEVAL, _MBPP = get_verifier("humaneval"), get_verifier("mbpp")
_MBPP_SPLITS = {split: "code/mbpp.jsonl" for split in ("test", "train", "validation", "prompt")}
# The hub copies (the paper names none): ones whose rows match the files of ../shared/data
# (SOURCES.md) where such a copy exists; docs/evaluation.md lists them.
_GSM8K = "openai/gsm8k"
_CSQA2 = "tasksource/commonsense_qa_2.0"
_MBPP_HUB = {s: HubSource("google-research-datasets/mbpp", s, "full") for s in _MBPP_SPLITS}

# fmt: off
for _benchmark in (
    # the paper's five math benchmarks (Table 1 column order) and the other math sets
    Benchmark("aime24", "AIME24", {"test": "math/aime24_test.jsonl"}, "test",
              _math_row("problem", "id"), "math", _MATH,
              hub={"test": HubSource("HuggingFaceH4/aime_2024", "train")}),
    Benchmark("amc23", "AMC23", {"test": "math/amc23_test.jsonl"}, "test",
              _math_row("problem", "id"), "math", _MATH,
              hub={"test": HubSource("math-ai/amc23", "test",
                                     parse_row=_math_row("question", "id"))}),
    Benchmark("math500", "MATH-500", {"test": "math/math500_test.jsonl"}, "test",
              _math_row("problem", "unique_id"), "math", _MATH,
              hub={"test": HubSource("HuggingFaceH4/MATH-500", "test")}),
    Benchmark("minerva", "Minerva", {"test": "math/minerva_math_test.jsonl"}, "test",
              _minerva_row, "math", _MATH,
              hub={"test": HubSource("math-ai/minervamath", "test",
                                     parse_row=_math_row("question", None))}),
    Benchmark("olympiadbench", "OlympiadBench", {"test": "math/olympiadbench_test.jsonl"},
              "test", _olympiad_row, "math", _MATH,
              hub={"test": HubSource("Hothan/OlympiadBench", "train", "OE_TO_maths_en_COMP")}),
    Benchmark("gsm8k", "GSM8K", {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"},
              "test", _gsm8k_row, "math", _MATH,
              hub={s: HubSource(_GSM8K, s, "main") for s in ("test", "train")}),
    Benchmark("math12k", "MATH-12K", {"train": "math/math12k_train.jsonl.gz"}, "train",
              _math_row("problem", "unique_id"), "math", _MATH,
              hub={"train": HubSource("hiyouga/math12k", "train")}),
    # commonsense (Tables 4-5, right)
    Benchmark("csqa", "CS-QA", {"dev": "commonsense/csqa_dev.jsonl"}, "dev", _csqa_row,
              "commonsense_choice", _CHOICE,
              hub={"dev": HubSource("tau/commonsense_qa", "validation")}),
    Benchmark("csqa2", "CS-QA2", {"dev": "commonsense/csqa2_dev.jsonl",
                                  "train": "commonsense/csqa2_train.jsonl"}, "dev",
              _csqa2_row, "commonsense_yesno", _YES_NO,
              hub={"dev": HubSource(_CSQA2, "validation"), "train": HubSource(_CSQA2, "train")}),
    Benchmark("csqa2_train", "CS-QA2 (train)", {"train": "commonsense/csqa2_train.jsonl"},
              "train", _csqa2_row, "commonsense_yesno", _YES_NO,
              hub={"train": HubSource(_CSQA2, "train")}),
    # code (Tables 4-5, left): greedy pass@1
    Benchmark("humaneval", "HumanEval", {"test": "code/HumanEval.jsonl.gz"}, "test",
              _humaneval_row, "code", _HUMANEVAL, "greedy",
              hub={"test": HubSource("openai/openai_humaneval", "test")}),
    # made by code (gmts.data.generated): within a small instruction-tuned model's reach
    Benchmark("addition-2digit", "Addition (2 digits)", {"train": "", "test": ""}, "test",
              addition_example, "plain", get_verifier("math"), max_new_tokens=128,
              generate=addition_rows(10, 99, ask_for_number)),
    Benchmark("word-problems-1digit", "Word problems (1 digit, steps)", {"train": "", "test": ""},
              "test", word_problem_example, "plain", get_verifier("math"), max_new_tokens=128,
              generate=word_problem_rows(2, 9)),
    Benchmark("mbpp", "MBPP", _MBPP_SPLITS, "test", _mbpp_row, "code", _MBPP, "greedy",
              keep=_mbpp_keep, hub=_MBPP_HUB),
):
    register_benchmark(_benchmark)
# fmt: on


def load_benchmark(
    name: str,
    *,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Examples of benchmark ``name`` (see `available_benchmarks`), in file order.

    Args:
        name: e.g. "math500", "aime24", "csqa", "humaneval", "mbpp".
        data_dir: the data folder (default: ``$GMTS_DATA_DIR``; neither: a development
            machine's ``../shared/data``, else the Hugging Face Hub; see the module docstring).
        split: one of the benchmark's splits (default: its evaluation split; MBPP "test" is
            task ids 11-510).
        limit: keep only the first ``limit`` good examples.
    """
    return read_benchmark(get_benchmark(name), data_dir=data_dir, split=split, limit=limit)


def read_benchmark(
    spec: Benchmark,
    *,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Examples of the benchmark ``spec`` (registered or not), as :func:`load_benchmark`.

    Raises FileNotFoundError (one line) when the split is in no data folder and its hub copy
    cannot be loaded (or it has none), naming both ways to provide it.
    """
    split = spec.default_split if split is None else split
    if split not in spec.splits:
        raise ValueError(
            f"benchmark {spec.name!r} has no split {split!r}; splits: {list(spec.splits)}"
        )
    _check_limit(limit)
    records, parse_row = _split_records(spec, split, data_dir)
    assert parse_row is not None, f"benchmark {spec.name!r} is not read from files"
    rows = (
        (index, row)
        for index, row in enumerate(records)
        if spec.keep is None or spec.keep(row, split)
    )
    return _collect(rows, parse_row, split, limit, f"{spec.name} ({split})")


def _split_records(
    spec: Benchmark, split: str, data_dir: str | os.PathLike | None
) -> tuple[Iterable[dict[str, Any]], RowParser | None]:
    """The rows of one split and their parser, from the first place that has them."""
    if spec.generate is not None:  # made by code: nothing to find
        return spec.generate(split), spec.parse_row
    relative = spec.splits[split]
    if Path(relative).is_absolute():  # a user's own file
        return read_records(relative), spec.parse_row
    named = configured_data_dir(data_dir)
    if named is not None:
        path = named / relative
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark {spec.name!r} ({split}): file not found at {path} (the data folder "
                f"given; without --data-dir and ${DATA_DIR_ENV} it loads from the Hugging Face "
                "Hub)"
            )
        return read_records(path), spec.parse_row
    for folder in dev_data_dirs():
        if (folder / relative).is_file():
            return read_records(folder / relative), spec.parse_row
    source = spec.hub.get(split)
    how = (
        f"pass --data-dir PATH (data_dir=...) or set ${DATA_DIR_ENV}=PATH to a folder holding "
        f"{relative} (docs/evaluation.md)"
    )
    if source is None:
        raise FileNotFoundError(
            f"benchmark {spec.name!r} ({split}): no data folder and no Hugging Face Hub copy: {how}"
        )
    try:
        table = _load_from_hub(source)
    except Exception as error:  # noqa: BLE001 - offline, no package, unknown id: one line
        reason = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise FileNotFoundError(
            f"benchmark {spec.name!r} ({split}): no data folder given and the Hugging Face Hub "
            f"copy {source.path} ({source.config or 'default'}/{source.split}) could not be "
            f"loaded ({reason}); {how}, or make the hub reachable"
        ) from error
    return table, source.parse_row or spec.parse_row


def hub_location(source: HubSource) -> str:
    """What ``datasets.load_dataset`` is given as ``path`` for ``source``: its hub id (tests
    swap in a local folder laid out like a hub repository)."""
    return source.path


def _load_from_hub(source: HubSource) -> Iterable[dict[str, Any]]:
    """The rows of ``source`` through ``datasets.load_dataset`` (cached by ``datasets``)."""
    try:
        import datasets as hf_datasets
    except ImportError as error:
        raise ImportError("the `datasets` package is missing: pip install 'gmts[data]'") from error
    return hf_datasets.load_dataset(hub_location(source), source.config, split=source.split)
