"""Benchmark loaders against the files in ../shared/data, and the generic file loaders."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from gmts.data.benchmarks import available_benchmarks, load_benchmark
from gmts.data.datasets import (
    DATA_DIR_ENV,
    Example,
    load_hf_dataset,
    load_jsonl_dataset,
    resolve_data_dir,
)

# name -> (number of examples, first id, first gold answer), read off the files by hand
EXPECTED = {
    "math500": (500, "test/precalculus/807.json", r"\left( 3, \frac{\pi}{2} \right)"),
    "math12k": (11996, "test/algebra/1.json", "2"),  # 12,000 rows minus 4 without a gold
    "aime24": (30, "60", "204"),
    "amc23": (40, "0", "27"),  # stored as 27.0
    "minerva": (272, "0", "1.6"),  # last \boxed{} of the solution
    "olympiadbench": (675, "1606", "2"),
    "gsm8k": (1319, "gsm8k-test-0", "18"),  # after '####'
    "csqa": (1221, "1afa02df02c908a558b4036e80242fac", "A"),
    "csqa2": (2541, "002b0d519076a42e3cd2aae8c3480450", "yes"),
    "csqa2_train": (9264, "0000488c294c99bd1a6cf10258dae8c1", "yes"),
    "humaneval": (164, "HumanEval/0", None),
    "mbpp": (500, "mbpp/11", None),  # task ids 11-510
    "addition-2digit": (1652, "test-80+73", "153"),  # made by code (gmts.data.generated)
    "word-problems-1digit": (768, "test-Sam-4+6-shells", "10"),  # made by code
}


def test_every_benchmark_is_listed() -> None:
    assert set(available_benchmarks()) == set(EXPECTED)


@pytest.fixture(scope="module")
def math12k(shared_data: Path) -> tuple[list[Example], list[str]]:
    """MATH-12K examples and the warnings loading them gave (loaded once: 12,000 rows)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        examples = load_benchmark("math12k", data_dir=shared_data)
    return examples, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_benchmark_counts_ids_and_first_gold(
    shared_data: Path, name: str, request: pytest.FixtureRequest
) -> None:
    count, first_id, first_answer = EXPECTED[name]
    if name == "math12k":
        examples = request.getfixturevalue("math12k")[0]
    else:
        examples = load_benchmark(name, data_dir=shared_data)
    assert len(examples) == count
    assert all(isinstance(e, Example) and e.question and e.answer for e in examples)
    assert len({e.id for e in examples}) == count
    assert examples[0].id == first_id
    if first_answer is not None:
        assert examples[0].answer == first_answer


def test_math12k_reports_the_four_bad_rows_once(math12k: tuple[list[Example], list[str]]) -> None:
    examples, caught = math12k
    messages = [message for message in caught if "skipped" in message]
    assert len(messages) == 1
    for bad in ("7115.json", "7117.json", "24014.json", "25040.json"):
        assert bad in messages[0]
    assert not any(e.answer.strip() in ("", "None") for e in examples)


def test_gold_extraction_details(shared_data: Path) -> None:
    olympiad = {e.id: e for e in load_benchmark("olympiadbench", data_dir=shared_data)}
    assert all("$" not in e.answer for e in olympiad.values())
    multi = [e for e in olympiad.values() if e.meta["is_multiple_answer"]]
    assert multi and all("," in e.answer for e in multi[:20])
    aime = load_benchmark("aime24", data_dir=shared_data)
    assert "25" in {e.answer for e in aime} and "025" not in {e.answer for e in aime}
    assert all(
        e.answer.lstrip("-").isdigit() for e in load_benchmark("gsm8k", data_dir=shared_data)
    )
    minerva = load_benchmark("minerva", data_dir=shared_data, limit=3)
    assert minerva[0].meta["raw_answer"] in minerva[0].meta["solution"]


def test_csqa_question_lists_lettered_choices(shared_data: Path) -> None:
    first = load_benchmark("csqa", data_dir=shared_data, limit=1)[0]
    assert first.question.endswith("A. bank\nB. library\nC. department store\nD. mall\nE. new york")
    assert first.meta["stem"] in first.question
    assert first.meta["choices"]["label"] == ["A", "B", "C", "D", "E"]


def test_code_benchmarks_carry_tests_and_entry_points(shared_data: Path) -> None:
    humaneval = load_benchmark("humaneval", data_dir=shared_data, limit=1)[0]
    assert humaneval.answer.rstrip().endswith("check(has_close_elements)")
    assert humaneval.meta["entry_point"] == "has_close_elements"
    assert humaneval.question == humaneval.meta["prompt"]
    mbpp = load_benchmark("mbpp", data_dir=shared_data)
    ids = [int(e.meta["task_id"]) for e in mbpp]
    assert (min(ids), max(ids)) == (11, 510)
    assert mbpp[0].meta["entry_point"] == "remove_Occ"
    assert 'assert remove_Occ("hello","l") == "heo"' in mbpp[0].answer
    splits = {
        s: len(load_benchmark("mbpp", data_dir=shared_data, split=s))
        for s in ("prompt", "validation", "train")
    }
    assert splits == {"prompt": 10, "validation": 90, "train": 374}


def test_split_and_limit(shared_data: Path) -> None:
    assert len(load_benchmark("gsm8k", data_dir=shared_data, split="train")) == 7473
    assert len(load_benchmark("csqa2", data_dir=shared_data, split="train", limit=7)) == 7
    with pytest.raises(ValueError, match="split"):
        load_benchmark("math500", data_dir=shared_data, split="train")
    with pytest.raises(ValueError, match="limit"):
        load_benchmark("math500", data_dir=shared_data, limit=0)
    with pytest.raises(ValueError, match="valid benchmarks"):
        load_benchmark("math501", data_dir=shared_data)


def test_data_dir_resolution(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(shared_data))
    assert resolve_data_dir() == shared_data
    assert len(load_benchmark("aime24")) == 30
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=DATA_DIR_ENV):
        resolve_data_dir()
    with pytest.raises(FileNotFoundError, match="data_dir"):
        resolve_data_dir(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="aime24"):
        load_benchmark("aime24", data_dir=tmp_path)  # a folder without the file


def test_no_data_folder_error_says_to_pass_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gmts.data.datasets as datasets_module

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    fake_module_file = tmp_path / "a" / "b" / "c" / "datasets.py"  # repo root = tmp_path/a
    monkeypatch.setattr(datasets_module, "__file__", str(fake_module_file))
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        resolve_data_dir()


def _write_rows(path: Path, rows: list[dict]) -> None:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


ROWS = [
    {"q": "1+1?", "a": "2", "id": "x"},
    {"q": "bad", "a": "None", "id": "y"},
    {"q": "empty", "a": "", "id": "z"},
    {"q": "2+2?", "a": 4, "id": "w"},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json", ".parquet"])
def test_load_jsonl_dataset_any_format(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"data{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([dict(r, a=str(r["a"])) for r in ROWS])
        pq.write_table(table, path)
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    else:
        _write_rows(path, ROWS)
    with pytest.warns(UserWarning, match=r"skipped 2 row\(s\).*y, z"):
        examples = load_jsonl_dataset(path, "q", "a", id_field="id")
    assert [(e.id, e.question, e.answer) for e in examples] == [
        ("x", "1+1?", "2"),
        ("w", "2+2?", "4"),
    ]
    assert examples[0].meta["id"] == "x"


def test_load_jsonl_dataset_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    _write_rows(path, [{"q": "1", "a": "1"}])
    with pytest.raises(ValueError, match="'answer'"):
        load_jsonl_dataset(path, "q", "answer")
    with pytest.raises(FileNotFoundError):
        load_jsonl_dataset(tmp_path / "nope.jsonl", "q", "a")
    path.write_text('{"q": 1, "a": 1}\nnot json\n')
    with pytest.raises(ValueError, match="d.jsonl:2"):
        load_jsonl_dataset(path, "q", "a")


def test_load_jsonl_dataset_answer_fn(tmp_path: Path) -> None:
    from gmts.rewards import normalize_answer

    path = tmp_path / "d.jsonl"
    _write_rows(path, [{"q": "x", "a": 27.0}, {"q": "y", "a": "$\\frac12$"}])
    examples = load_jsonl_dataset(path, "q", "a", answer_fn=normalize_answer, limit=5)
    assert [e.answer for e in examples] == ["27", "\\frac12"]


@pytest.mark.slow  # importing `datasets` takes ~5 s
def test_load_hf_dataset_offline_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="load_jsonl_dataset"):
        load_hf_dataset("gmts-test/does-not-exist", "q", "a")


def test_example_validates_types() -> None:
    with pytest.raises(ValueError, match="answer"):
        Example("1", "q", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="meta"):
        Example("1", "q", "a", meta=[])  # type: ignore[arg-type]
