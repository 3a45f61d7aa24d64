"""Results of ``gmts eval``: typed summary records, the paper-style table, the JSON file.

The table follows the layout of the paper's Table 1: one row per model, one column per
benchmark (average@n or pass@1 in %, two decimals), and ``Avg.``, the unweighted mean of the
columns (each benchmark counts once, whatever its size, as in the paper).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.eval.results_store import QuestionRecord

RESULTS_FORMAT = "gmts-eval-results/1"


@dataclass(frozen=True)
class BenchmarkResult:
    """Score of one model on one benchmark.

    Attributes:
        name: benchmark name; display: its column header.
        metric: "average@16", "pass@1", ...
        score: the metric in [0, 1].
        num_questions: questions scored.
        samples_per_question: n.
        records: per-question results, in benchmark order.
        verifier_override: the reward that scored it in place of the benchmark's own verifier
            (``gmts eval --verifier``); None: its own verifier.
    """

    name: str
    display: str
    metric: str
    score: float
    num_questions: int
    samples_per_question: int
    records: list[QuestionRecord] = field(default_factory=list, repr=False)
    verifier_override: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "display": self.display,
            "metric": self.metric,
            "score": self.score,
            "percent": round(100.0 * self.score, 2),
            "num_questions": self.num_questions,
            "samples_per_question": self.samples_per_question,
            "verifier_override": self.verifier_override,
        }


@dataclass(frozen=True)
class EvalReport:
    """All benchmarks of one model."""

    model: str
    benchmarks: list[BenchmarkResult]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def average(self) -> float:
        """Unweighted mean of the benchmark scores (the paper's ``Avg.``)."""
        if not self.benchmarks:
            return 0.0
        return sum(b.score for b in self.benchmarks) / len(self.benchmarks)

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "benchmarks": {b.name: b.summary() for b in self.benchmarks},
            "average": self.average,
            "average_percent": round(100.0 * self.average, 2),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RESULTS_FORMAT,
            "settings": self.settings,
            "summary": self.summary(),
            "results": {b.name: [r.to_json() for r in b.records] for b in self.benchmarks},
        }

    def table(self) -> str:
        return format_table([self.summary()])


def write_report(report: EvalReport, path: str | os.PathLike[str]) -> Path:
    """Write ``report`` as JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(report.to_json(), fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def load_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``summary`` block of a results JSON written by :func:`write_report`."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path} is not a gmts eval results file (format {data.get('format')!r})")
    return data["summary"]


def format_table(summaries: list[dict[str, Any]]) -> str:
    """A Markdown table: rows = models, columns = benchmarks (first-seen order) + ``Avg.``.

    Each summary is :meth:`EvalReport.summary`'s dict. Scores are percentages with two
    decimals; a model missing a benchmark shows ``-`` (and its Avg. covers what it has). A
    score that a reward gave in place of the benchmark's own verifier (``verifier_override``)
    carries the reward's name, ``12.50 [math]``, and the last line says what that means.
    """
    columns: list[tuple[str, str]] = []
    for summary in summaries:
        for name, bench in summary["benchmarks"].items():
            if name not in [c[0] for c in columns]:
                columns.append((name, bench.get("display", name)))
    metrics = {b["metric"] for s in summaries for b in s["benchmarks"].values()}
    overrides = {
        b["verifier_override"]
        for s in summaries
        for b in s["benchmarks"].values()
        if b.get("verifier_override")  # absent in files written before the option existed
    }
    header = ["Model"] + [display for _, display in columns] + ["Avg."]
    rows = [header]
    for summary in summaries:
        row = [str(summary["model"])]
        for name, _ in columns:
            bench = summary["benchmarks"].get(name)
            cell = f"{100.0 * bench['score']:.2f}" if bench else "-"
            if bench and bench.get("verifier_override"):
                cell += f" [{bench['verifier_override']}]"
            row.append(cell)
        row.append(f"{100.0 * summary['average']:.2f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "| " + " | ".join(padded) + " |"

    sep = (
        "|"
        + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths))
        + "|"
    )
    out = [line(rows[0]), sep] + [line(r) for r in rows[1:]]
    notes = [f"{', '.join(sorted(metrics))} in %"]
    notes += [
        f"[{name}]: scored by the reward {name}, not the benchmark's own verifier"
        for name in sorted(overrides)
    ]
    out.append(f"({'; '.join(notes)})")
    return "\n".join(out)
