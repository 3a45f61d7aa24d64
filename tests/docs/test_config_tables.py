"""docs/training.md's "Shipped configs" table says what the shipped configs under configs/ hold:
every row's batch, mini-batch, group size, lengths, learning rate, temperature and dataset are
read back from every config file of its folder with the project's own loader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gmts.train.config import TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
TRAINING_MD = ROOT / "docs" / "training.md"
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?")


def _table(markdown: str, heading: str) -> list[dict[str, str]]:
    """The first table under ``heading``: one dict per row, keyed by the header's cells."""
    lines = markdown.split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    header, body = table[0], table[2:]  # table[1] is the |---| line
    return [dict(zip(header, row, strict=True)) for row in body]


def _numbers(cell: str) -> list[float]:
    """The leading number of each ``/``-separated part of a cell (``"30720 / 2048 (paper:
    32768)"`` -> [30720, 2048])."""
    out = []
    for part in cell.split("/"):
        match = NUMBER.search(part.split("(")[0])
        assert match, f"no number in {part!r} of {cell!r}"
        out.append(float(match.group(0)))
    return out


def _config_files(cell: str) -> list[Path]:
    """Every config file a row's folder cell names: ``configs/x/``, ``y/`` (a folder under
    configs/) or ``configs/demo.yaml``."""
    files = []
    for name in re.findall(r"`([^`]+)`", cell):
        if not name.endswith(("/", ".yaml")):
            continue  # e.g. `dapo-random` in a note
        path = ROOT / (name if name.startswith("configs/") else f"configs/{name}")
        files += sorted(path.glob("*.yaml")) if name.endswith("/") else [path]
    return files


def _rows() -> list[dict[str, str]]:
    return _table(TRAINING_MD.read_text(), "## Shipped configs")


def test_the_table_covers_every_shipped_folder() -> None:
    named = {f.parent.name for row in _rows() for f in _config_files(row["folder"])}
    shipped = {p.parent.name for p in (ROOT / "configs").glob("*/base.yaml")}
    assert shipped <= named, f"shipped config folders the table leaves out: {shipped - named}"


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row["folder"][:40])
def test_each_row_matches_its_configs(row: dict[str, str]) -> None:
    files = _config_files(row["folder"])
    assert files, f"no config file named in {row['folder']!r}"
    batch, mini = _numbers(row["batch / mini-batch (questions)"])
    (group,) = _numbers(row["G"])
    (lr,) = _numbers(row["lr"])
    lengths = row["max resp / prompt"]
    temperature = re.search(r"temperature (\d+(?:\.\d+)?)", row["data here"])
    datasets = re.findall(r"`([^`]+)`", row["data here"])
    for path in files:
        if path.name == "base.yaml" and len(files) > 1:
            continue  # the variants read it; it is checked through them
        cfg: TrainConfig = load_config(path)
        where = f"{path.relative_to(ROOT)} vs docs/training.md"
        r = cfg.rollout
        assert (r.questions_per_batch, cfg.mini_batch_questions) == (batch, mini), where
        assert r.group_size == group, where
        assert cfg.optim.lr == pytest.approx(lr), where
        if lengths == "task's own":
            assert r.max_response_length is None and cfg.data.dataset is None, where
        else:
            response, prompt = _numbers(lengths)
            assert (r.max_response_length, r.max_prompt_length) == (response, prompt), where
        if temperature:
            assert r.temperature == float(temperature.group(1)), where
        for name in datasets:  # `math12k`, built-in `addition`
            assert name in (cfg.data.dataset, cfg.data.task if cfg.data.dataset is None else ""), (
                f"{where}: {name!r}"
            )
