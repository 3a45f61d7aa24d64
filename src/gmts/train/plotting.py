"""Learning curves from ``metrics.jsonl``: one panel per metric, one line per run."""

from __future__ import annotations

import math
from pathlib import Path

from gmts.train.metrics_log import METRICS_FILE, read_metrics


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (shorter at the start)."""
    if window <= 1:
        return values
    out, acc, buf = [], 0.0, []
    for v in values:
        buf.append(v)
        acc += v
        if len(buf) > window:
            acc -= buf.pop(0)
        out.append(acc / len(buf))
    return out


def plot_runs(
    run_dirs: list[str | Path],
    out: str | Path,
    *,
    metrics: list[str],
    smooth: int = 1,
    labels: list[str] | None = None,
) -> Path:
    """Write a PNG with ``metrics`` (panels) of every run in ``run_dirs`` (lines)."""
    if not metrics:
        raise ValueError("--metrics: give at least one metric")
    if smooth < 1:
        raise ValueError(f"--smooth: must be >= 1 (1: no smoothing), got {smooth}")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs = []
    for d in run_dirs:
        rows = read_metrics(d)
        if not rows:
            raise ValueError(f"{d}: no {METRICS_FILE} with rows")
        runs.append(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, metrics):
        for i, rows in enumerate(runs):
            pts = [(r["step"], r[name]) for r in rows if isinstance(r.get(name), int | float)]
            if not pts:
                continue
            xs, ys = zip(*pts)
            label = labels[i] if labels else Path(run_dirs[i]).name
            ax.plot(xs, _smooth(list(ys), smooth), label=label)
        ax.set_title(name)
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
