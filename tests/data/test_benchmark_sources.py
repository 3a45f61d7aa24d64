"""Where a benchmark is read from: a named data folder, ``$GMTS_DATA_DIR``, or the Hugging Face
Hub through ``datasets`` (here a local folder laid out like a hub repository stands in for the
hub id; ``datasets.load_dataset`` itself does the loading), and the error when none works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gmts.data.benchmarks as benchmarks
from gmts.data.benchmarks import HubSource, available_benchmarks, get_benchmark, load_benchmark
from gmts.data.datasets import DATA_DIR_ENV


@pytest.fixture
def clone_without_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's clone: no $GMTS_DATA_DIR and no ../shared/data anywhere."""
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(benchmarks, "dev_data_dirs", lambda: [])


def _hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(source: HubSource):
        raise ConnectionError(f"Couldn't reach '{source.path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(benchmarks, "_load_from_hub", refuse)


def test_every_split_of_every_benchmark_read_from_files_has_a_hub_copy() -> None:
    generated = []
    for name in available_benchmarks():
        spec = get_benchmark(name)
        if spec.generate is not None:  # made by code (gmts.data.generated): no file, no hub
            generated.append(name)
            assert not spec.hub, name
            continue
        assert set(spec.hub) == set(spec.splits), name
    assert generated == ["addition-2digit", "word-problems-1digit"]


def test_no_folder_and_no_hub_is_one_line_naming_both_ways(
    clone_without_data: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hub_unreachable(monkeypatch)
    with pytest.raises(FileNotFoundError) as caught:
        load_benchmark("math500")
    message = str(caught.value)
    assert "\n" not in message
    for part in ("--data-dir", DATA_DIR_ENV, "HuggingFaceH4/MATH-500", "math/math500_test.jsonl"):
        assert part in message


def test_a_named_folder_wins_over_the_hub(
    shared_data: Path, clone_without_data: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hub_unreachable(monkeypatch)
    monkeypatch.setenv(DATA_DIR_ENV, str(shared_data))
    assert len(load_benchmark("aime24")) == 30
    monkeypatch.delenv(DATA_DIR_ENV)
    assert len(load_benchmark("amc23", data_dir=shared_data)) == 40


def test_a_named_folder_without_the_file_is_an_error_not_a_hub_download(
    tmp_path: Path, clone_without_data: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(source: HubSource):
        raise AssertionError("the hub was asked although a data folder was named")

    monkeypatch.setattr(benchmarks, "_load_from_hub", never)
    with pytest.raises(FileNotFoundError, match="aime24_test.jsonl"):
        load_benchmark("aime24", data_dir=tmp_path)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="Hugging Face Hub"):
        load_benchmark("aime24")


# ----------------------------------------------------------------------- the real datasets path


def _hub_repo(root: Path, splits: dict[str, list[dict]], config: str | None) -> Path:
    """A folder laid out like a hub dataset repository: parquet files per split and a README
    whose YAML header declares the configuration, as the hub's own repositories do."""
    import datasets

    name = config or "default"
    lines = ["---", "configs:", f"- config_name: {name}", "  data_files:"]
    for split, rows in splits.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_list(rows).to_parquet(str(root / name / f"{split}-0.parquet"))
        lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    (root / "README.md").write_text("\n".join([*lines, "---", ""]))
    return root


@pytest.mark.slow  # importing `datasets` takes ~5 s
def test_hub_copies_load_through_datasets_and_are_cached(
    tmp_path: Path, clone_without_data: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    gsm8k = {
        "test": [
            {"question": "2+2?", "answer": "two and two #### 4"},
            {"question": "3*3?", "answer": "#### 9"},
        ],
        "train": [{"question": "1+1?", "answer": "#### 2"}],
    }
    amc23 = {  # math-ai/amc23's fields: the question is in "question", the answer a float
        "test": [{"id": 7, "question": "Find x.", "answer": 27.0, "url": "u"}],
    }
    repos = {
        "openai/gsm8k": _hub_repo(tmp_path / "gsm8k", gsm8k, "main"),
        "math-ai/amc23": _hub_repo(tmp_path / "amc23", amc23, None),
    }
    monkeypatch.setattr(benchmarks, "hub_location", lambda source: str(repos[source.path]))

    test = load_benchmark("gsm8k")
    assert [(e.id, e.question, e.answer) for e in test] == [
        ("gsm8k-test-0", "2+2?", "4"),
        ("gsm8k-test-1", "3*3?", "9"),
    ]
    assert [e.answer for e in load_benchmark("gsm8k", split="train")] == ["2"]
    assert len(load_benchmark("gsm8k", limit=1)) == 1
    (example,) = load_benchmark("amc23")
    assert (example.id, example.question, example.answer) == ("7", "Find x.", "27")
    assert any(cache.rglob("*.arrow")), "datasets did not cache what it loaded"


@pytest.mark.slow  # importing `datasets` takes ~5 s
def test_offline_hub_without_a_cached_copy_names_both_ways(
    clone_without_data: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))
    monkeypatch.setattr(benchmarks, "hub_location", lambda source: "gmts-test/not-cached")
    with pytest.raises(FileNotFoundError) as caught:
        load_benchmark("math500")
    message = str(caught.value)
    assert "\n" not in message and "--data-dir" in message and DATA_DIR_ENV in message
    assert "HuggingFaceH4/MATH-500" in message


def test_own_file_split_is_read_from_its_absolute_path(tmp_path: Path) -> None:
    from gmts.data.benchmarks import Benchmark, read_benchmark
    from gmts.data.datasets import _field_parser
    from gmts.rewards.verifiers import get_verifier

    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"q": "1+1=", "a": "2"}) + "\n")
    spec = Benchmark(
        "mine", "mine", {"file": str(path)}, "file", _field_parser("q", "a", None, None),
        "plain", get_verifier("math"),
    )  # fmt: skip
    (example,) = read_benchmark(spec)
    assert (example.question, example.answer) == ("1+1=", "2")
