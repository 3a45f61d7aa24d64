"""Benchmark loaders: the paper's evaluation sets and training sets as `Example` records.

Files are read from a data folder (never copied into the repository): ``data_dir`` if given,
else ``$GMTS_DATA_DIR``, else ``../shared/data`` next to the repository or the working
directory. Each benchmark knows its file, its splits, where its question and gold answer are,
and how to normalise the gold answer (see `BENCHMARKS` and docs/rewards.md).

Rows whose gold answer is empty or the string "None" (MATH-12K has four) are skipped with one
warning naming them. Any other JSONL/JSON/parquet file loads with `load_jsonl_dataset`; a
Hugging Face hub dataset with `load_hf_dataset` (only where the hub is reachable).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "GMTS_DATA_DIR"


@dataclass(frozen=True)
class Example:
    """One question with its gold answer.

    id: stable identifier within the benchmark (the file's id where it has one).
    question: the problem text shown to the model (multiple choice: stem plus lettered options).
    answer: normalised gold answer (math: LaTeX; csqa: a letter; csqa2: "yes"/"no";
        humaneval/mbpp: the Python test code to run after the program).
    meta: everything else (raw gold answer, solution, subject, choices, prompt, entry point...).
    """

    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("id", "question", "answer"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"Example.{name} must be a str, got {getattr(self, name)!r}")
        if not isinstance(self.meta, dict):
            raise ValueError(f"Example.meta must be a dict, got {type(self.meta).__name__}")


# ----------------------------------------------------------------------------- file reading


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Rows of a ``.jsonl`` / ``.jsonl.gz`` / ``.json`` (list or JSON lines) / ``.parquet`` file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    name = path.name.lower()
    if name.endswith(".parquet"):
        yield from _read_parquet(path)
        return
    opener: Callable[..., Any] = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        if name.endswith((".json", ".json.gz")):
            text = handle.read()
            stripped = text.lstrip()
            if stripped.startswith("["):
                yield from json.loads(text)
                return
            lines: Iterable[str] = text.splitlines()
        else:
            lines = handle
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:  # pragma: no cover - pyarrow comes with `datasets`
        raise ImportError("reading parquet needs pyarrow: pip install 'gmts[data]'") from error
    yield from parquet.read_table(path).to_pylist()


# ----------------------------------------------------------------------------- gold answers


def _normalize_math(answer: Any) -> str:
    from gmts.rewards.math_answer import normalize_answer  # stdlib-only module, cheap

    return normalize_answer(answer)


def _last_boxed(text: str) -> str:
    from gmts.rewards.boxed import extract_boxed

    return extract_boxed(text) or ""


def _is_bad_answer(answer: str) -> bool:
    return answer.strip() in ("", "None")


def _lettered(stem: str, labels: list[str], texts: list[str]) -> str:
    options = "\n".join(f"{label}. {text}" for label, text in zip(labels, texts))
    return f"{stem}\n{options}"


# row -> Example (or an Example whose answer is bad, reported and skipped by the caller)
RowParser = Callable[[dict[str, Any], int, str], Example]


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


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives in the data folder and how its rows become Examples.

    splits: split name -> file path relative to the data folder.
    keep: optional row filter per split (MBPP selects task-id ranges from one file).
    """

    name: str
    splits: Mapping[str, str]
    default_split: str
    parse_row: RowParser
    keep: Callable[[dict[str, Any], str], bool] | None = None


def _mbpp_keep(row: dict[str, Any], split: str) -> bool:
    # the upstream README's split of task ids
    low, high = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600)}.get(
        split, (601, 974)
    )
    return low <= int(row["task_id"]) <= high


BENCHMARKS: dict[str, Benchmark] = {
    spec.name: spec
    for spec in (
        Benchmark("math500", {"test": "math/math500_test.jsonl"}, "test",
                  _math_row("problem", "unique_id")),
        Benchmark("math12k", {"train": "math/math12k_train.jsonl.gz"}, "train",
                  _math_row("problem", "unique_id")),
        Benchmark("aime24", {"test": "math/aime24_test.jsonl"}, "test", _math_row("problem", "id")),
        Benchmark("amc23", {"test": "math/amc23_test.jsonl"}, "test", _math_row("problem", "id")),
        Benchmark("minerva", {"test": "math/minerva_math_test.jsonl"}, "test", _minerva_row),
        Benchmark("olympiadbench", {"test": "math/olympiadbench_test.jsonl"}, "test",
                  _olympiad_row),
        Benchmark("gsm8k", {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"}, "test",
                  _gsm8k_row),
        Benchmark("csqa", {"dev": "commonsense/csqa_dev.jsonl"}, "dev", _csqa_row),
        Benchmark("csqa2", {"dev": "commonsense/csqa2_dev.jsonl",
                            "train": "commonsense/csqa2_train.jsonl"}, "dev", _csqa2_row),
        Benchmark("csqa2_train", {"train": "commonsense/csqa2_train.jsonl"}, "train", _csqa2_row),
        Benchmark("humaneval", {"test": "code/HumanEval.jsonl.gz"}, "test", _humaneval_row),
        Benchmark("mbpp", {split: "code/mbpp.jsonl"
                           for split in ("test", "train", "validation", "prompt")}, "test",
                  _mbpp_row, _mbpp_keep),
    )
}  # fmt: skip


def available_benchmarks() -> list[str]:
    """Names `load_benchmark` accepts."""
    return list(BENCHMARKS)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir``, else ``$GMTS_DATA_DIR``, else a ``../shared/data`` found
    next to the repository or the working directory; FileNotFoundError if none exists."""
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data_dir {str(path)!r} is not a folder")
        return path
    from_env = os.environ.get(DATA_DIR_ENV)
    if from_env:
        path = Path(from_env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${DATA_DIR_ENV}={from_env!r} is not a folder")
        return path
    repo_root = Path(__file__).resolve().parents[3]
    candidates = [repo_root.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"no benchmark data folder found (tried {tried}); pass --data-dir PATH (data_dir=...) "
        f"or set ${DATA_DIR_ENV}"
    )


def _collect(
    rows: Iterable[tuple[int, dict[str, Any]]],
    parse_row: RowParser,
    split: str,
    limit: int | None,
    source: str,
) -> list[Example]:
    examples: list[Example] = []
    bad_ids: list[str] = []
    for index, row in rows:
        example = parse_row(row, index, split)
        if _is_bad_answer(example.answer):
            bad_ids.append(example.id)
            continue
        examples.append(example)
        if limit is not None and len(examples) >= limit:
            break
    if bad_ids:
        warnings.warn(
            f"{source}: skipped {len(bad_ids)} row(s) with an empty or 'None' gold answer: "
            f"{', '.join(bad_ids)}",
            UserWarning,
            stacklevel=3,
        )
    return examples


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")


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
        data_dir: the data folder (see `resolve_data_dir` for the default).
        split: one of the benchmark's splits (default: its evaluation split; MBPP "test" is
            task ids 11-510).
        limit: keep only the first ``limit`` good examples.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; available: {available_benchmarks()}")
    spec = BENCHMARKS[name]
    split = spec.default_split if split is None else split
    if split not in spec.splits:
        raise ValueError(f"benchmark {name!r} has no split {split!r}; splits: {list(spec.splits)}")
    _check_limit(limit)
    path = resolve_data_dir(data_dir) / spec.splits[split]
    if not path.is_file():
        raise FileNotFoundError(f"benchmark {name!r} ({split}): file not found at {path}")
    rows = (
        (index, row)
        for index, row in enumerate(read_records(path))
        if spec.keep is None or spec.keep(row, split)
    )
    return _collect(rows, spec.parse_row, split, limit, f"{name} ({split})")


def _field_parser(
    question_field: str,
    answer_field: str,
    id_field: str | None,
    answer_fn: Callable[[Any], str] | None,
) -> RowParser:
    def parse(row: dict[str, Any], index: int, split: str) -> Example:
        for needed in (question_field, answer_field):
            if needed not in row:
                raise ValueError(f"row {index} has no field {needed!r}; fields: {sorted(row)}")
        raw = row[answer_field]
        answer = answer_fn(raw) if answer_fn is not None else ("" if raw is None else str(raw))
        row_id = str(row[id_field]) if id_field and row.get(id_field) is not None else str(index)
        meta = {k: v for k, v in row.items() if k not in (question_field,)}
        return Example(row_id, str(row[question_field]), str(answer).strip(), meta)

    return parse


def load_jsonl_dataset(
    path: str | os.PathLike,
    question_field: str,
    answer_field: str,
    *,
    id_field: str | None = None,
    answer_fn: Callable[[Any], str] | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Examples from any local ``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.parquet`` file.

    Args:
        path: the file.
        question_field, answer_field: the row fields holding the question and the gold answer.
        id_field: field holding a row id (default: the row number).
        answer_fn: turns the raw answer value into the gold string (default: ``str``), e.g.
            ``gmts.rewards.normalize_answer`` for math answers.
        limit: keep only the first ``limit`` good examples.
    Rows with an empty or "None" answer are skipped with one warning; a missing field raises.
    """
    _check_limit(limit)
    parse_row = _field_parser(question_field, answer_field, id_field, answer_fn)
    rows = enumerate(read_records(path))
    return _collect(rows, parse_row, "file", limit, str(path))


def load_hf_dataset(
    dataset_id: str,
    question_field: str,
    answer_field: str,
    *,
    split: str = "train",
    config_name: str | None = None,
    id_field: str | None = None,
    answer_fn: Callable[[Any], str] | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Examples from a Hugging Face hub dataset via ``datasets.load_dataset`` (needs the hub
    or a local cache). Same field mapping and bad-row handling as `load_jsonl_dataset`."""
    _check_limit(limit)
    try:
        import datasets as hf_datasets
    except ImportError as error:
        raise ImportError(
            "load_hf_dataset needs the `datasets` package: pip install 'gmts[data]'"
        ) from error
    try:
        table = hf_datasets.load_dataset(dataset_id, config_name, split=split)
    except Exception as error:  # noqa: BLE001 - offline/unknown id/network: one clear message
        raise RuntimeError(
            f"could not load {dataset_id!r} (split {split!r}) with datasets.load_dataset: "
            f"{type(error).__name__}: {error}. Is the Hugging Face Hub reachable (HF_HUB_OFFLINE "
            "unset)? Otherwise download the data and use load_jsonl_dataset(path, ...)."
        ) from error
    parse_row = _field_parser(question_field, answer_field, id_field, answer_fn)
    return _collect(enumerate(table), parse_row, split, limit, dataset_id)
