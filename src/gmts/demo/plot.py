"""The demo's ``curves.png``: per method, the mean over its seeds as a line and the spread
between them (min to max) as a shaded band, one panel per metric, the legend below the panels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gmts.demo.records import DemoResult, DemoRow
from gmts.train.metrics_log import EVAL_FILE, metric_points, moving_average, read_metrics

__all__ = ["PLOT_METRICS", "SMOOTH", "MethodCurve", "method_curve", "plot_demo"]

PLOT_METRICS = ("average@{k}", "reward/accuracy", "policy/entropy")
"""Panels of the demo's curves.png: held-out average@k (eval.jsonl), then training metrics."""

SMOOTH = 5
"""Moving-average window (steps) of the training metrics; held-out evaluations are unsmoothed."""


@dataclass(frozen=True)
class MethodCurve:
    """One method's curve of one metric over its seeds, at the steps every seed logged.

    Attributes:
        steps: the RL steps, ascending.
        mean, low, high: per step, the mean, the minimum and the maximum over the seeds.
        seeds: how many runs the curve summarises.
        held_out: read from ``eval.jsonl`` (held-out evaluations) rather than ``metrics.jsonl``.
    """

    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    seeds: int
    held_out: bool


def _run_series(run_dir: str, name: str) -> tuple[dict[int, float], bool]:
    """(step -> value, held out) of ``name`` in one run: its training rows smoothed, else its
    held-out evaluations."""
    if points := metric_points(read_metrics(run_dir), name):
        steps, values = zip(*points)
        return dict(zip(steps, moving_average(list(values), SMOOTH))), False
    return dict(metric_points(read_metrics(run_dir, EVAL_FILE), name)), True


def method_curve(runs: list[DemoRow], name: str) -> MethodCurve:
    """The mean and the min-max spread of ``name`` over ``runs`` (one method's seeds)."""
    series = [_run_series(run.run_dir, name) for run in runs]
    common = set.intersection(*(set(values) for values, _ in series)) if series else set()
    steps = sorted(common)
    per_step = [[values[s] for values, _ in series] for s in steps]
    return MethodCurve(
        steps=steps,
        mean=[sum(v) / len(v) for v in per_step],
        low=[min(v) for v in per_step],
        high=[max(v) for v in per_step],
        seeds=len(runs),
        held_out=any(held for _, held in series),
    )


def plot_demo(result: DemoResult, out: Path) -> Path:
    """Write ``curves.png``: a panel per ``PLOT_METRICS`` entry, per method its mean over the
    seeds and (with several seeds) the min-max band; returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    k = result.config.data.eval_samples
    metrics = [m.format(k=k) for m in PLOT_METRICS]
    methods = result.methods
    n_seeds = max((len(result.runs(m)) for m in methods), default=0)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.4 * len(metrics), 3.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes.flat, metrics):
        held_out = False
        for i, method in enumerate(methods):
            curve = method_curve(result.runs(method), name)
            color = colors[i % len(colors)]
            marker = "o" if curve.held_out else None
            ax.plot(curve.steps, curve.mean, color=color, marker=marker, markersize=3)
            if curve.seeds > 1:
                ax.fill_between(curve.steps, curve.low, curve.high, color=color, alpha=0.2, lw=0)
            held_out = held_out or curve.held_out
        smoothed = f"{name} (moving average of {SMOOTH} steps)"
        ax.set_title(f"{name} (held-out)" if held_out else smoothed, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], color=colors[i % len(colors)], label=method)
        for i, method in enumerate(methods)
    ]
    title = "one seed"
    if n_seeds > 1:
        title = f"line: mean of {n_seeds} seeds; band: min to max over them"
        handles.append(Patch(color="grey", alpha=0.3, label="min to max over the seeds"))
    fig.legend(
        handles=handles,
        title=title,
        loc="lower center",
        ncol=len(handles),
        frameon=False,
        fontsize=9,
        title_fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.14, 1, 1))  # the legend's row below the panels
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
