"""The demo's JSON record (``gmts demo --json``): the printed table, the paired comparisons,
every run and where it ran (``benchmarks/report.py`` renders ``benchmarks/results/demo.json``
into the docs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gmts.demo.comparisons import compare
from gmts.demo.records import DemoResult
from gmts.demo.tables import format_table
from gmts.provenance import load, utc_now


def demo_record(
    result: DemoResult, *, command: str, machine: dict[str, Any], commit: str | None
) -> dict[str, Any]:
    """The demo's JSON: the printed table, the paired comparisons, every run and where it ran
    (``benchmarks/report.py`` renders ``benchmarks/results/demo.json`` into the docs).
    ``commit``: the checkout's commit when the runs started (:func:`gmts.provenance.git_commit`)."""
    return {
        "benchmark": "demo",
        "status": "ok",
        "command": command,
        "date": utc_now(),
        "commit": commit,
        "threads": result.config.threads,
        "wall_s": round(result.total_s, 1),
        "machine": machine,
        "uptime_after": load(),
        "table": format_table(result),
        "comparisons": [dataclasses.asdict(c) for c in compare(result)],
        "result": dataclasses.asdict(result),
    }


def write_demo_record(
    path: str | Path,
    result: DemoResult,
    *,
    command: str,
    machine: dict[str, Any],
    commit: str | None,
) -> Path:
    """Write :func:`demo_record` to ``path`` (indented JSON, its folder made); returns the path."""
    record = demo_record(result, command=command, machine=machine, commit=commit)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path
