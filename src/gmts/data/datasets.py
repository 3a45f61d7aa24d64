"""Benchmark loaders: the paper's evaluation sets and training sets as `Example` records.

Benchmark files are read from a data folder (never copied into the repository): ``data_dir``
if given, else ``$GMTS_DATA_DIR`` (:func:`configured_data_dir`); without either, the
benchmarks of :mod:`gmts.data.benchmarks` load from the Hugging Face Hub. Each benchmark knows
its file, its splits, where its question and gold answer are, and how to normalise the gold
answer (see :mod:`gmts.data.benchmarks` and docs/rewards.md).

Rows whose gold answer is empty or the string "None" (MATH-12K has four) are skipped with one
warning naming them. Any other JSONL/JSON/parquet file loads with `load_jsonl_dataset`; a
Hugging Face hub dataset with `load_hf_dataset` (only where the hub is reachable).
"""

from __future__ import annotations

import gzip
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
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


# row -> Example (or an Example whose answer is bad, reported and skipped by the caller)
RowParser = Callable[[dict[str, Any], int, str], Example]


def _is_bad_answer(answer: str) -> bool:
    return answer.strip() in ("", "None")


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


def configured_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data folder the user named: ``data_dir``, else ``$GMTS_DATA_DIR``, else None.

    A named folder that does not exist raises FileNotFoundError (it is never skipped)."""
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
    return None


def dev_data_dirs() -> list[Path]:
    """The development machines' data folders that exist: ``../shared/data`` next to the
    repository or the working directory (a user's clone has none; nothing depends on them)."""
    repo_root = Path(__file__).resolve().parents[3]
    candidates = [repo_root.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    return [c for c in dict.fromkeys(candidates) if c.is_dir()]


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir``, else ``$GMTS_DATA_DIR``, else a ``../shared/data`` found
    next to the repository or the working directory; FileNotFoundError if none exists.
    (Benchmarks also load from the Hugging Face Hub: :func:`gmts.data.benchmarks.load_benchmark`.)
    """
    named = configured_data_dir(data_dir)
    if named is not None:
        return named
    found = dev_data_dirs()
    if found:
        return found[0]
    raise FileNotFoundError(
        f"no benchmark data folder found: pass --data-dir PATH (data_dir=...) or set "
        f"${DATA_DIR_ENV} to a folder in the layout of docs/evaluation.md"
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
