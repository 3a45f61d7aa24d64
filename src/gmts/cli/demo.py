"""``gmts demo [section.field=value ...]``: all tokens vs ETS vs GMTS under one recipe, from one
warm start.

The recipe is ``demo.yaml`` next to this file (the one copy; ``configs/demo.yaml`` links to it).
The three policies differ only in ``selection.score``: they start from the same cached warm
start (gmts.embedded.warmstart), see the same questions in the same order (same seed) and get the
same budget (steps x questions x samples). Held-out average@k is measured before training, every
``data.eval_every`` steps and at the end, on the task's reserved questions: the table prints that
learning curve and its mean over training (area under the curve / steps), and the curves are
drawn to ``<output_dir>/curves.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.train.config import TrainConfig, load_config

DEMO_CONFIG = Path(__file__).with_name("demo.yaml")
"""The demo's training recipe (a ``gmts train`` config)."""

METHODS = {"all tokens": "none", "ETS": "entropy", "GMTS": "gmts"}
"""Demo method -> ``selection.score``; ETS and GMTS keep the recipe's ``selection.ratio``."""

PLOT_METRICS = ("average@{k}", "reward/accuracy", "policy/entropy")
"""Panels of the demo's curves.png: held-out average@k (eval.jsonl), then training metrics."""


def demo_recipe(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The demo's ``TrainConfig``: ``demo.yaml`` with ``section.field=value`` overrides."""
    return load_config(DEMO_CONFIG, list(overrides))


@dataclass(frozen=True)
class DemoSettings:
    """What one demo invocation chooses beyond the recipe (which is ``demo.yaml``).

    Attributes:
        overrides: ``section.field=value`` items applied to ``demo.yaml`` (as for gmts train).
        output_dir: the runs go to ``<output_dir>/<selection.score>``, the plot to
            ``<output_dir>/curves.png``.
        cache_dir: warm-start cache (None: ``gmts.embedded.warmstart.default_cache_dir()``).
        methods: a subset of ``METHODS``, in table order.
    """

    overrides: tuple[str, ...] = ()
    output_dir: str = "runs/demo"
    cache_dir: str | None = None
    methods: tuple[str, ...] = tuple(METHODS)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"unknown demo methods {unknown}; valid: {list(METHODS)}")


@dataclass
class DemoRow:
    """One policy's line of the table. ``curve`` maps RL step -> held-out metrics (keys
    ``average@k``/``pass@k``), step 0 being the warm start and the last step the final policy."""

    method: str
    curve: dict[int, dict[str, float]]
    step_time_s: float
    selected_fraction: float
    train_time_s: float
    run_dir: str

    def average(self, k: int) -> list[tuple[int, float]]:
        """(step, average@k) in step order."""
        return [(s, m[f"average@{k}"]) for s, m in sorted(self.curve.items())]

    def area_mean(self, k: int) -> float:
        """Mean held-out average@k over training: trapezoid area under the curve / steps."""
        points = self.average(k)
        if len(points) < 2:
            return float("nan")
        area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(points, points[1:]))
        return area / (points[-1][0] - points[0][0])


@dataclass
class DemoResult:
    """The recipe, the warm start, one row per method, the plot and the wall-clock times."""

    config: TrainConfig
    warm_start: dict[str, Any]
    warm_start_s: float
    rows: list[DemoRow] = field(default_factory=list)
    total_s: float = 0.0
    plot: str | None = None


def method_label(method: str, cfg: TrainConfig) -> str:
    """'all tokens', 'ETS top 20%', 'GMTS top 20%' (the ratio is the recipe's)."""
    if METHODS[method] == "none":
        return method
    side = "top" if cfg.selection.largest else "bottom"
    return f"{method} {side} {cfg.selection.ratio:.0%}"


def method_config(
    base: TrainConfig, method: str, model_path: str, output_dir: str | Path, progress: bool
) -> TrainConfig:
    """``base`` for one demo policy: its score, its run directory, the warm start's path; the
    starting policy is evaluated once by the demo, not by each run."""
    score = METHODS[method]
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, path=model_path),
        data=dataclasses.replace(base.data, eval_before=False),
        selection=dataclasses.replace(base.selection, score=score),
        logging=dataclasses.replace(
            base.logging, output_dir=str(Path(output_dir) / score), progress=progress
        ),
    )


def run_demo(settings: DemoSettings | None = None, *, progress: bool = True) -> DemoResult:
    """Warm start (cached), evaluate it once, train each method, plot the curves."""
    import json

    import torch

    from gmts.embedded.warmstart import INFO_FILE, warm_start
    from gmts.train.metrics_log import EVAL_FILE, read_metrics
    from gmts.train.trainer import Trainer

    settings = settings or DemoSettings()
    base = demo_recipe(settings.overrides)  # a bad override fails here, before any work
    if base.data.dataset is not None or base.data.eval_questions < 1:
        raise ValueError("the demo needs a built-in task (data.task) and data.eval_questions >= 1")
    if base.threads is not None:  # before the warm start, whose arithmetic depends on it
        torch.set_num_threads(base.threads)
    t0 = time.perf_counter()
    model_path = base.model.path
    info: dict[str, Any] = {}
    if model_path == "embedded":
        warm = warm_start(
            base.data.task, cache_dir=settings.cache_dir, seed=base.seed, progress=progress
        )
        model_path = str(warm)
        info = json.loads((warm / INFO_FILE).read_text())
    result = DemoResult(config=base, warm_start=info, warm_start_s=time.perf_counter() - t0)
    before: dict[str, float] | None = None
    for method in settings.methods:
        cfg = method_config(base, method, model_path, settings.output_dir, progress)
        trainer = Trainer(cfg)
        if before is None:  # the same starting policy for every method
            before = trainer.evaluate() or {}
        trainer.logger.log(0, before, EVAL_FILE)  # step 0 of each run's curve
        t1 = time.perf_counter()
        run = trainer.run()
        hist = run.history
        result.rows.append(
            DemoRow(
                method=method_label(method, cfg),
                curve={int(r["step"]): r for r in read_metrics(run.run_dir, EVAL_FILE)},
                step_time_s=sum(h["time/step_s"] for h in hist) / max(len(hist), 1),
                selected_fraction=sum(h.get("select/fraction", 1.0) for h in hist)
                / max(len(hist), 1),
                train_time_s=time.perf_counter() - t1,
                run_dir=str(run.run_dir),
            )
        )
        del trainer
        torch.set_grad_enabled(True)
    result.plot = str(plot_demo(result, Path(settings.output_dir) / "curves.png"))
    result.total_s = time.perf_counter() - t0
    return result


def plot_demo(result: DemoResult, out: Path) -> Path:
    """The demo's learning curves (``PLOT_METRICS``), one line per method."""
    from gmts.cli.plot import plot_runs

    k = result.config.data.eval_samples
    return plot_runs(
        [r.run_dir for r in result.rows],
        out,
        metrics=[m.format(k=k) for m in PLOT_METRICS],
        smooth=5,
        labels=[r.method for r in result.rows],
    )


def format_table(result: DemoResult) -> str:
    """The fixed-format table the README quotes (held-out average@k in %)."""
    c = result.config
    k = c.data.eval_samples
    r = c.rollout
    steps = sorted({s for row in result.rows for s in row.curve})
    head = [
        f"{c.algorithm.upper()} on '{c.data.task}' from one warm start: {c.optim.steps} steps x "
        f"{r.questions_per_batch} questions x {r.group_size} samples, lr {c.optim.lr:g}, "
        f"seed {c.seed}",
        f"held-out average@{k} (%) on {c.data.eval_questions} questions by RL step (0: the warm "
        f"start); mean: area under that curve / steps; pass@{k} (%) at the end",
    ]
    cols = (
        f"{'method':<14}"
        + "".join(f"{s:>7d}" for s in steps)
        + f" {'gain':>7} {'mean':>6} {'pass@' + str(k):>8} {'s/step':>7} {'selected':>9}"
    )
    lines = [*head, cols, "-" * len(cols)]
    for row in result.rows:
        curve = dict(row.average(k))
        first, last = curve[steps[0]], curve[steps[-1]]
        lines.append(
            f"{row.method:<14}"
            + "".join(f"{100 * curve[s]:>7.1f}" if s in curve else f"{'-':>7}" for s in steps)
            + f" {100 * (last - first):>+6.1f}p {100 * row.area_mean(k):>6.1f}"
            + f" {100 * row.curve[steps[-1]][f'pass@{k}']:>8.1f}"
            + f" {row.step_time_s:>7.3f} {row.selected_fraction:>9.3f}"
        )
    if result.warm_start:
        lines.append(_warm_start_line(result))
    lines.append(f"total {result.total_s:.0f} s")
    if result.plot:
        lines.append(f"curves: {result.plot}  (view: xdg-open {result.plot})")
    return "\n".join(lines)


def _warm_start_line(result: DemoResult) -> str:
    """How the warm start ended (its early stop, or that it missed it) and what it cost."""
    w = result.warm_start
    target = w.get("settings", {}).get("config", {}).get("stop_at_greedy")
    check = w.get("check_accuracy")
    if target is None or check is None:
        stop = ""
    elif check >= target:
        stop = f" (stopped at {100 * check:.0f}% greedy on the check questions)"
    else:
        stop = f" (did NOT reach its {100 * target:.0f}% check target: {100 * check:.0f}%)"
    return (
        f"warm start: {w['steps_done']} supervised steps{stop}, held-out greedy accuracy "
        f"{100 * w['greedy_accuracy']:.1f}%; {result.warm_start_s:.0f} s (cached after the first "
        "run)"
    )


# ------------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoSettings()
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="Changes to the recipe (configs/demo.yaml), as for gmts train, e.g. "
        "optim.lr=3e-4 rollout.questions_per_batch=16.",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps (optim.steps).")
    parser.add_argument("--seed", type=int, default=None, help="Warm start and RL seed (seed).")
    parser.add_argument("--task", default=None, help="Built-in task (data.task).")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (threads; the recipe says 1: the tiny model's matrices are "
        "small, so more threads mostly synchronise; see docs/training.md).",
    )
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="Comma-separated subset of %(default)s, in table order.",
    )
    parser.add_argument(
        "--output-dir", default=d.output_dir, help="Where the runs and curves.png go."
    )
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache directory.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bars.")
    parser.add_argument("--json", default=None, help="Also write the results to this JSON file.")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    shortcuts = {
        "optim.steps": args.steps,
        "seed": args.seed,
        "data.task": args.task,
        "threads": args.threads,
    }
    overrides = [*args.overrides, *(f"{k}={v}" for k, v in shortcuts.items() if v is not None)]
    try:
        settings = DemoSettings(
            overrides=tuple(overrides),
            output_dir=args.output_dir,
            cache_dir=args.cache_dir,
            methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        )
        result = run_demo(settings, progress=not args.no_progress)
    except ValueError as exc:
        print(f"gmts demo: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dataclasses.asdict(result), fh, indent=2)
    return 0
