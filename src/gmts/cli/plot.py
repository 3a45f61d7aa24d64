"""``gmts plot RUN_DIR [RUN_DIR ...] --out FILE.png``: learning curves of one or more runs."""

from __future__ import annotations

import argparse
import sys

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
    from gmts.train.plotting import plot_runs

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    labels = args.labels.split(",") if args.labels else None
    try:
        out = plot_runs(args.runs, args.out, metrics=metrics, smooth=args.smooth, labels=labels)
    except ValueError as exc:
        print(f"gmts plot: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
