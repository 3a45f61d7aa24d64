"""Per-step metrics: ``metrics.jsonl`` always, TensorBoard or W&B optionally.

One JSON object per line, ``{"step": N, "<name>": value, ...}``. Wall-clock fields
(:data:`TIMING_KEYS`) are the only ones that differ between two runs with the same seed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
TIMING_KEYS = frozenset(
    {
        "time/step_s",
        "time/rollout_s",
        "time/update_s",
        "time/tokens_per_s",
        "time/elapsed_s",
        "time/weight_sync_s",
    }
)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf": strict JSON has no non-finite numbers
    return value


def read_metrics(run_dir: str | Path, name: str = METRICS_FILE) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/<name>`` in order ([] if the file does not exist)."""
    path = Path(run_dir) / name
    if not path.is_file():
        return []
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a kill: ignore it
                    continue
    return rows


def metric_points(rows: list[dict[str, Any]], name: str) -> list[tuple[int, float]]:
    """(step, value) of every row (of :func:`read_metrics`) that logged ``name`` as a number."""
    return [(r["step"], r[name]) for r in rows if isinstance(r.get(name), int | float)]


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (shorter at the start), for curves of a
    logged metric."""
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


def truncate_metrics(run_dir: str | Path, last_step: int, name: str = METRICS_FILE) -> None:
    """Keep only rows with ``step <= last_step`` (used on resume: a killed run may have logged
    steps after its last checkpoint, and those steps are about to be re-run)."""
    path = Path(run_dir) / name
    if not path.is_file():
        return
    rows = [r for r in read_metrics(run_dir, name) if r.get("step", 0) <= last_step]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    tmp.replace(path)


class MetricsLogger:
    """Writes metrics rows; only rank 0 writes anything."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        report_to: str = "none",
        enabled: bool = True,
        wandb_project: str = "gmts",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise RuntimeError(
                    "logging.report_to=tensorboard needs the tensorboard package"
                ) from exc
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        elif report_to == "wandb":
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("logging.report_to=wandb needs the wandb package") from exc
            self._wandb = wandb.init(
                project=wandb_project, dir=str(self.run_dir), config=config or {}, resume="allow"
            )

    def log(self, step: int, metrics: dict[str, Any], name: str = METRICS_FILE) -> None:
        """Append one row to ``name`` (and mirror its numbers to TensorBoard / W&B)."""
        if not self.enabled:
            return
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with open(self.run_dir / name, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        prefix = "eval/" if name == EVAL_FILE else ""
        numeric = {
            prefix + k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"
        }
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
