"""Render ``benchmarks/results/*.json`` as markdown tables inside docs/results.md.

docs/results.md is prose written by hand around generated blocks; each block sits between
``<!-- results:NAME:begin -->`` and ``<!-- results:NAME:end -->`` and is replaced wholesale
from ``results/NAME.json``. Run ``python benchmarks/report.py`` to refresh it without
re-running anything (run.py does this after each full run).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
DOC = BENCH_DIR.parent / "docs" / "results.md"


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _fmt_x(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}x"


def _fmt_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.0f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _measured(cell: dict[str, Any]) -> str:
    if cell.get("ok"):
        return _fmt_s(cell["median_s"])
    return "fails: " + cell.get("error", "?").split("\n")[0][:70]


def render_selection(record: dict[str, Any]) -> str:
    rows = []
    for r in record["rows"]:
        rows.append(
            [
                f"{r['n_tokens'] / 2**20:g}M",
                str(r["repeats"]),
                _measured(r["select_tokens"]),
                _measured(r["quantile"]),
                _measured(r["sort"]),
                _fmt_x(r["speedup_vs_quantile"]),
                _fmt_x(r["speedup_vs_sort"]),
                "yes" if r["exact_count"] and r["is_top_k"] else "NO",
            ]
        )
    header = [
        "N tokens",
        "repeats",
        "select_tokens",
        "torch.quantile (TRL)",
        "full sort",
        "speed-up vs quantile",
        "speed-up vs sort",
        "exact top-k",
    ]
    return _table(header, rows)


def render_logprobs(record: dict[str, Any]) -> str:
    s = record["settings"]
    rows = []
    for r in record["rows"]:
        if not r.get("ok"):
            rows.append([r["variant"], "—", "—", "—", "—", r.get("error", "failed")[:80]])
            continue
        rows.append(
            [
                r["variant"],
                _fmt_s(r["median_s"]),
                _fmt_x(r.get("time_vs_naive")),
                _fmt_bytes(r["peak_beyond_params_grads_bytes"]),
                _fmt_x(r.get("memory_reduction_vs_naive"), 1),
                "yes" if r.get("agrees_with_naive", True) else "NO",
            ]
        )
    header = [
        "variant",
        "fwd+bwd time (median)",
        "time vs naive",
        "peak memory beyond params+grads",
        "memory reduction vs naive",
        "same results as naive",
    ]
    head = (
        f"N = {s['n_tokens']}, V = {s['vocab']}, H = {s['hidden']}, float32, "
        f"{s['repeats']} timed runs per variant, one process per variant.\n\n"
    )
    return head + _table(header, rows)


def render_generic(record: dict[str, Any]) -> str:
    """Fallback: one row per result row with its scalar fields."""
    rows = record.get("rows", [])
    if not rows:
        return "_no rows_"
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float, str, bool))]
    return _table(keys, [[_cell(r.get(k)) for k in keys] for r in rows])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_goals(record: dict[str, Any]) -> str:
    goals = record.get("goals", [])
    if not goals:
        return ""
    rows = [
        [
            g["name"],
            g["target"],
            g["measured"],
            {True: "met", False: "NOT MET"}.get(g["met"], "n/a"),
        ]
        for g in goals
    ]
    return "\n\n" + _table(["goal", "target", "measured", "status"], rows)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "selection": render_selection,
    "logprobs": render_logprobs,
}


def render(record: dict[str, Any]) -> str:
    """Markdown for one result record: provenance line, table, goals."""
    name = record.get("benchmark", "?")
    if record.get("status") != "ok":
        body = f"**This benchmark failed in the recorded run:** `{record.get('error')}`"
    else:
        body = RENDERERS.get(name, render_generic)(record) + render_goals(record)
    machine = record.get("machine", {})
    provenance = (
        f"_Run {record.get('date')} at commit `{record.get('commit')}` with "
        f"`{record.get('command')}` ({record.get('threads')} torch thread(s), "
        f"{record.get('wall_s')} s wall). Load before: `{machine.get('uptime', '?')}`; "
        f"after: `{record.get('uptime_after', '?')}`._"
    )
    return provenance + "\n\n" + body


def update_results_doc(results_dir: Path, doc: Path = DOC) -> list[str]:
    """Replace every generated block of ``doc`` whose JSON exists; return the names updated."""
    if not doc.exists():
        print(f"[report] {doc} does not exist; nothing to update", file=sys.stderr)
        return []
    text = doc.read_text()
    updated = []
    for path in sorted(results_dir.glob("*.json")):
        name = path.stem
        pattern = re.compile(
            rf"(<!-- results:{re.escape(name)}:begin -->\n).*?(\n<!-- results:{re.escape(name)}:end -->)",
            re.S,
        )
        if not pattern.search(text):
            continue
        block = render(json.loads(path.read_text()))
        text = pattern.sub(lambda m, b=block: m.group(1) + b + m.group(2), text)
        updated.append(name)
    doc.write_text(text)
    print(f"[report] refreshed {doc.name}: {', '.join(updated) or 'nothing'}")
    return updated


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else BENCH_DIR / "results"
    update_results_doc(folder)
