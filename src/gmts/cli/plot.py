"""``gmts plot RUN_DIR [RUN_DIR ...] --out FILE.png``: learning curves of one or more runs.

Curves come from ``metrics.jsonl`` and ``eval.jsonl``: one panel per metric, one line per run. A
metric logged by the held-out evaluation (``average@16``, ``pass@16``) is read from
``eval.jsonl`` and drawn with markers, unsmoothed; training metrics come from ``metrics.jsonl``.
(The demo's ``curves.png``, its seeds' means and spreads, is :mod:`gmts.demo.plot`.)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gmts.train.metrics_log import (
    EVAL_FILE,
    METRICS_FILE,
    metric_points,
    moving_average,
    read_metrics,
)

DEFAULT_METRICS = (
    "reward/mean",
    "reward/accuracy",
    "response/length_mean",
    "policy/entropy",
    "select/fraction",
    "select/gmts_ets_jaccard",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Run directories.")
    parser.add_argument("--out", "-o", default="curves.png", help="Output PNG file.")
    parser.add_argument(
        "--metrics",
        default=",".join(DEFAULT_METRICS),
        help="Comma-separated keys of metrics.jsonl or eval.jsonl (e.g. average@16), one panel "
        "each (default: %(default)s).",
    )
    parser.add_argument(
        "--smooth", type=int, default=1, help="Moving-average window in steps (default 1)."
    )
    parser.add_argument("--labels", default=None, help="Comma-separated legend labels.")


def run(args: argparse.Namespace) -> int:
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    labels = args.labels.split(",") if args.labels else None
    try:
        out = plot_runs(args.runs, args.out, metrics=metrics, smooth=args.smooth, labels=labels)
    except ValueError as exc:
        print(f"gmts plot: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def plot_runs(
    run_dirs: list[str | Path],
    out: str | Path,
    *,
    metrics: list[str],
    smooth: int = 1,
    labels: list[str] | None = None,
) -> Path:
    """Write a PNG with ``metrics`` (panels) of every run in ``run_dirs`` (lines).

    A metric is read from ``metrics.jsonl`` (smoothed over ``smooth`` steps) or, where the run's
    training rows do not have it, from ``eval.jsonl`` (held-out evaluations, unsmoothed).
    """
    if not metrics:
        raise ValueError("--metrics: give at least one metric")
    if smooth < 1:
        raise ValueError(f"--smooth: must be >= 1 (1: no smoothing), got {smooth}")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs = []  # per run: (training rows, evaluation rows)
    for d in run_dirs:
        rows, evals = read_metrics(d), read_metrics(d, EVAL_FILE)
        if not rows and not evals:
            raise ValueError(f"{d}: no {METRICS_FILE} or {EVAL_FILE} with rows")
        runs.append((rows, evals))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, metrics):
        held_out = False
        for i, (rows, evals) in enumerate(runs):
            label = labels[i] if labels else Path(run_dirs[i]).name
            pts = metric_points(rows, name)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, moving_average(list(ys), smooth), label=label)
            elif pts := metric_points(evals, name):
                held_out = True
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_title(f"{name} (held-out)" if held_out else name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
