"""``gmts demo [section.field=value ...]``: all tokens vs ETS vs GMTS under one recipe, from one
warm start, over several RL seeds.

The recipe is ``demo.yaml`` next to this file (the one copy; ``configs/demo.yaml`` links to it).
The three policies differ only in ``selection.score``: within a seed they start from the same
cached warm start (gmts.embedded.warmstart), see the same questions in the same order and get
the same budget (steps x questions x samples). Each method is trained once per seed (``--seeds
N``: the recipe's ``seed`` and the N - 1 after it), each seed with its own warm start, so the
methods are compared seed by seed (paired) and the table says whether a difference is larger
than the spread between seeds (gmts.cli.demo_stats). One seed's ordering is not a measurement:
the warm start, and so every curve, moves with the seed and with the CPU's floating-point path
(docs/training.md); a warm start per seed puts that variation into the spread. Held-out average@k is measured before training,
every ``data.eval_every`` steps and at the end, on the task's reserved questions: the table
prints that learning curve and its mean over training (area under the curve / steps), and the
curves are drawn to ``<output_dir>/curves.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.cli.demo_stats import PairedDifference, mean_std, paired_difference
from gmts.train.config import TrainConfig, load_config

DEMO_CONFIG = Path(__file__).with_name("demo.yaml")
"""The demo's training recipe (a ``gmts train`` config)."""

METHODS = {"all tokens": "none", "ETS": "entropy", "GMTS": "gmts"}
"""Demo method -> ``selection.score``; ETS and GMTS keep the recipe's ``selection.ratio``."""

PLOT_METRICS = ("average@{k}", "reward/accuracy", "policy/entropy")
"""Panels of the demo's curves.png: held-out average@k (eval.jsonl), then training metrics."""

DEFAULT_SEEDS = 3
"""RL seeds per method by default (9 runs; docs/training.md has the wall time)."""

FLOAT_PATH_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "OMP_NUM_THREADS")
"""Environment variables that change the floating-point path (recorded in the JSON when set)."""


def demo_recipe(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The demo's ``TrainConfig``: ``demo.yaml`` with ``section.field=value`` overrides."""
    return load_config(DEMO_CONFIG, list(overrides))


@dataclass(frozen=True)
class DemoSettings:
    """What one demo invocation chooses beyond the recipe (which is ``demo.yaml``).

    Attributes:
        overrides: ``section.field=value`` items applied to ``demo.yaml`` (as for gmts train).
        output_dir: the runs go to ``<output_dir>/seed<S>/<selection.score>``, the plot to
            ``<output_dir>/curves.png``.
        cache_dir: warm-start cache (None: ``gmts.embedded.warmstart.default_cache_dir()``).
        methods: a subset of ``METHODS``, in table order.
        seeds: seeds per method: the recipe's ``seed`` and the ``seeds - 1`` after it; each
            seed has its own warm start (when ``model.path`` is "embedded") and RL seed.
        jobs: processes that run the warm starts and the runs side by side (None: as many as
            the CPUs this process may use hold runs of the recipe's ``threads``). Every run
            pins its own thread count and seeds, so the table does not depend on ``jobs``.
    """

    overrides: tuple[str, ...] = ()
    output_dir: str = "runs/demo"
    cache_dir: str | None = None
    methods: tuple[str, ...] = tuple(METHODS)
    seeds: int = DEFAULT_SEEDS
    jobs: int | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"unknown demo methods {unknown}; valid: {list(METHODS)}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"demo methods listed twice: {list(self.methods)}")
        if not isinstance(self.seeds, int) or isinstance(self.seeds, bool) or self.seeds < 1:
            raise ValueError(f"seeds must be an integer >= 1, got {self.seeds!r}")
        if self.jobs is not None and (
            not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs < 1
        ):
            raise ValueError(f"jobs must be an integer >= 1, got {self.jobs!r}")


@dataclass
class DemoRow:
    """One run: one method with one RL seed. ``curve`` maps RL step -> held-out metrics (keys
    ``average@k``/``pass@k``), step 0 being the warm start and the last step the final policy."""

    method: str
    seed: int
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

    def final(self, k: int) -> float:
        """Held-out average@k of the final policy."""
        return self.average(k)[-1][1]

    def gain(self, k: int) -> float:
        """Final minus starting held-out average@k."""
        points = self.average(k)
        return points[-1][1] - points[0][1]


@dataclass
class DemoResult:
    """The recipe, each seed's warm start (``warmstart.json``; none for a ``model.path``
    given), one row per (seed, method), the plot and the times."""

    config: TrainConfig
    warm_starts: dict[int, dict[str, Any]]
    warm_start_s: float
    seeds: list[int] = field(default_factory=list)
    rows: list[DemoRow] = field(default_factory=list)
    total_s: float = 0.0
    plot: str | None = None

    @property
    def methods(self) -> list[str]:
        """Method labels in table order."""
        return list(dict.fromkeys(r.method for r in self.rows))

    def runs(self, method: str) -> list[DemoRow]:
        """``method``'s rows in seed order."""
        return sorted((r for r in self.rows if r.method == method), key=lambda r: r.seed)


@dataclass(frozen=True)
class Comparison:
    """Method ``a`` minus method ``b``, seed by seed, in points of held-out average@k: the
    ``mean`` over training (learning speed) and the ``final`` evaluation."""

    a: str
    b: str
    mean: PairedDifference
    final: PairedDifference


def compare(result: DemoResult) -> list[Comparison]:
    """Every pair of methods, a later one in table order minus an earlier one (the last method
    first: GMTS - ETS, GMTS - all tokens, ETS - all tokens), paired by seed; a seed that lacks
    one of the two runs is left out of that pair."""
    k = result.config.data.eval_samples
    methods = result.methods
    out = []
    for j in reversed(range(len(methods))):
        a = methods[j]
        for b in reversed(methods[:j]):
            runs_a = {r.seed: r for r in result.runs(a)}
            runs_b = {r.seed: r for r in result.runs(b)}
            pairs = [(runs_a[s], runs_b[s]) for s in sorted(set(runs_a) & set(runs_b))]
            if not pairs:
                continue
            out.append(
                Comparison(
                    a=a,
                    b=b,
                    mean=paired_difference(
                        [100 * x.area_mean(k) for x, _ in pairs],
                        [100 * y.area_mean(k) for _, y in pairs],
                    ),
                    final=paired_difference(
                        [100 * x.final(k) for x, _ in pairs], [100 * y.final(k) for _, y in pairs]
                    ),
                )
            )
    return out


def method_label(method: str, cfg: TrainConfig) -> str:
    """'all tokens', 'ETS top 20%', 'GMTS top 20%' (the ratio is the recipe's)."""
    if METHODS[method] == "none":
        return method
    side = "top" if cfg.selection.largest else "bottom"
    return f"{method} {side} {cfg.selection.ratio:.0%}"


def method_config(
    base: TrainConfig,
    method: str,
    model_path: str,
    output_dir: str | Path,
    progress: bool,
    seed: int | None = None,
) -> TrainConfig:
    """``base`` for one demo run: its score, its RL seed (None: the recipe's), its run
    directory ``<output_dir>/seed<S>/<score>`` and the warm start's path; the starting policy
    is evaluated once per seed by the demo, not by each run. No checkpoints: the recipe's
    (for ``gmts train --config configs/demo.yaml --resume``) would add their save time
    (0.14-0.44 s each on the 2-core CPU) to the demo's timings; they change no result."""
    score = METHODS[method]
    seed = base.seed if seed is None else seed
    return dataclasses.replace(
        base,
        seed=seed,
        model=dataclasses.replace(base.model, path=model_path),
        data=dataclasses.replace(base.data, eval_before=False),
        checkpoint=dataclasses.replace(base.checkpoint, every=0, save_final=False),
        selection=dataclasses.replace(base.selection, score=score),
        logging=dataclasses.replace(
            base.logging,
            output_dir=str(Path(output_dir) / f"seed{seed}" / score),
            progress=progress,
        ),
    )


@dataclass(frozen=True)
class SeedStart:
    """One seed's starting point, shared by its methods: the warm start (or ``model.path``),
    its ``warmstart.json`` (None without a warm start), the time it took to train (0 when
    cached) and its one held-out evaluation (step 0 of every method's curve)."""

    seed: int
    model_path: str
    warm_start: dict[str, Any] | None
    warm_start_s: float
    before: dict[str, float]


def _pin_threads(base: TrainConfig) -> None:
    import torch

    if base.threads is not None:  # before the warm start, whose arithmetic depends on it
        torch.set_num_threads(base.threads)


def start_seed(base: TrainConfig, settings: DemoSettings, seed: int, progress: bool) -> SeedStart:
    """``seed``'s warm start (cached) and its evaluation (one job of :func:`run_demo`)."""
    import json

    from gmts.embedded.warmstart import INFO_FILE, warm_start
    from gmts.train.trainer import Trainer

    _pin_threads(base)
    model_path, info, spent = base.model.path, None, 0.0
    if model_path == "embedded":
        t0 = time.perf_counter()
        warm = warm_start(
            base.data.task, cache_dir=settings.cache_dir, seed=seed, progress=progress
        )
        info = json.loads((warm / INFO_FILE).read_text())
        model_path = str(warm)
        spent = time.perf_counter() - t0
    cfg = method_config(base, settings.methods[0], model_path, settings.output_dir, progress, seed)
    before = Trainer(cfg, overwrite=True).evaluate() or {}  # the demo rewrites its runs
    return SeedStart(seed, model_path, info, spent, before)


def train_method(
    base: TrainConfig, settings: DemoSettings, start: SeedStart, method: str, progress: bool
) -> DemoRow:
    """One method trained from ``start`` (one job of :func:`run_demo`)."""
    import torch

    from gmts.train.metrics_log import EVAL_FILE, read_metrics
    from gmts.train.trainer import Trainer

    _pin_threads(base)
    cfg = method_config(base, method, start.model_path, settings.output_dir, progress, start.seed)
    trainer = Trainer(cfg, overwrite=True)  # the demo rewrites its runs
    trainer.logger.log(0, start.before, EVAL_FILE)  # step 0 of the curve
    t0 = time.perf_counter()
    run = trainer.run()
    hist = run.history
    row = DemoRow(
        method=method_label(method, cfg),
        seed=start.seed,
        curve={int(r["step"]): r for r in read_metrics(run.run_dir, EVAL_FILE)},
        step_time_s=sum(h["time/step_s"] for h in hist) / max(len(hist), 1),
        selected_fraction=sum(h.get("select/fraction", 1.0) for h in hist) / max(len(hist), 1),
        train_time_s=time.perf_counter() - t0,
        run_dir=str(run.run_dir),
    )
    del trainer
    torch.set_grad_enabled(True)
    return row


def default_jobs(base: TrainConfig, runs: int) -> int:
    """Processes for ``runs`` runs of ``base``: the usable CPUs over its thread count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(runs, cpus // max(base.threads or cpus, 1)))


def run_demo(settings: DemoSettings | None = None, *, progress: bool = True) -> DemoResult:
    """For each seed: its warm start (cached), one evaluation of it, every method trained from
    it; then plot the curves. With ``jobs > 1`` the seeds' starts and then their runs are
    spread over that many processes (a seed's runs begin as soon as its start is done)."""
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    settings = settings or DemoSettings()
    base = demo_recipe(settings.overrides)  # a bad override fails here, before any work
    if base.data.dataset is not None or base.data.eval_questions < 1:
        raise ValueError("the demo needs a built-in task (data.task) and data.eval_questions >= 1")
    t0 = time.perf_counter()
    seeds = [base.seed + i for i in range(settings.seeds)]
    jobs = settings.jobs or default_jobs(base, len(seeds) * len(settings.methods))
    result = DemoResult(config=base, warm_starts={}, warm_start_s=0.0, seeds=seeds)
    starts: dict[int, SeedStart] = {}
    rows: dict[tuple[int, str], DemoRow] = {}

    def started(start: SeedStart) -> None:
        starts[start.seed] = start
        if start.warm_start is not None:
            result.warm_starts[start.seed] = start.warm_start
        result.warm_start_s += start.warm_start_s

    if jobs == 1:
        for seed in seeds:
            started(start_seed(base, settings, seed, progress))
            for method in settings.methods:
                rows[seed, method] = train_method(base, settings, starts[seed], method, progress)
    else:
        import multiprocessing

        total = len(seeds) * (1 + len(settings.methods))
        context = multiprocessing.get_context("spawn")  # fresh workers: no state but the job's
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            pending: dict[Future[Any], tuple[int, str | None]] = {
                pool.submit(start_seed, base, settings, seed, False): (seed, None) for seed in seeds
            }
            done_jobs = 0
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    seed, method = pending.pop(future)
                    done_jobs += 1
                    if method is None:
                        started(future.result())
                        for m in settings.methods:
                            job = pool.submit(train_method, base, settings, starts[seed], m, False)
                            pending[job] = (seed, m)
                        what = "warm start and its evaluation"
                    else:
                        rows[seed, method] = future.result()
                        what = rows[seed, method].method
                    if progress:
                        elapsed = time.perf_counter() - t0
                        print(
                            f"[{done_jobs}/{total}, {elapsed:.0f} s, {jobs} processes] "
                            f"seed {seed}: {what} done",
                            file=sys.stderr,
                            flush=True,
                        )
    result.rows = [rows[seed, method] for seed in seeds for method in settings.methods]
    result.plot = str(plot_demo(result, Path(settings.output_dir) / "curves.png"))
    result.total_s = time.perf_counter() - t0
    return result


def plot_demo(result: DemoResult, out: Path) -> Path:
    """The demo's learning curves (``PLOT_METRICS``), one line per run."""
    from gmts.cli.plot import plot_runs

    k = result.config.data.eval_samples
    several = len(result.seeds) > 1
    return plot_runs(
        [r.run_dir for r in result.rows],
        out,
        metrics=[m.format(k=k) for m in PLOT_METRICS],
        smooth=5,
        labels=[f"{r.method}, seed {r.seed}" if several else r.method for r in result.rows],
    )


# ------------------------------------------------------------------------------- the table


def format_table(result: DemoResult) -> str:
    """The demo's printed result: one seed's exact table, or the seeds' mean±std table with the
    paired differences; then the warm start, the time and the plot."""
    c = result.config
    r = c.rollout
    seeds = result.seeds or sorted({row.seed for row in result.rows})
    start = "from its warm start" if c.model.path == "embedded" else f"from {c.model.path}"
    seed_text = (
        f"seed {seeds[0]}"
        if len(seeds) == 1
        else f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), each {start}"
    )
    lines = [
        f"{c.algorithm.upper()} on '{c.data.task}': {c.optim.steps} steps x "
        f"{r.questions_per_batch} questions x {r.group_size} samples, lr {c.optim.lr:g}, "
        + seed_text
    ]
    lines += _one_seed_table(result) if len(seeds) == 1 else _seeds_table(result, len(seeds))
    lines += _warm_start_lines(result)
    lines.append(f"total {result.total_s:.0f} s")
    if result.plot:
        lines.append(f"curves: {result.plot}  (view: xdg-open {result.plot})")
    return "\n".join(lines)


def _one_seed_table(result: DemoResult) -> list[str]:
    """One seed's runs, held-out average@k in %, exactly as measured."""
    c = result.config
    k = c.data.eval_samples
    steps = sorted({s for row in result.rows for s in row.curve})
    cols = (
        f"{'method':<14}"
        + "".join(f"{s:>7d}" for s in steps)
        + f" {'gain':>7} {'mean':>6} {'pass@' + str(k):>8} {'s/step':>7} {'selected':>9}"
    )
    lines = [
        f"held-out average@{k} (%) on {c.data.eval_questions} questions by RL step (0: the warm "
        f"start); mean: area under that curve / steps; pass@{k} (%) at the end",
        cols,
        "-" * len(cols),
    ]
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
    lines.append(
        "one seed: this order of the methods is not a measurement (the seed and the CPU's "
        "floating-point path move every curve); --seeds 3 measures the spread"
    )
    return lines


def _pm(values: list[float], signed: bool = False) -> str:
    """'mean±std' of values already in points (the mean alone for one value)."""
    mean, std = mean_std(values)
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}"
    return text if std is None else f"{text}±{std:.1f}"


def _seeds_table(result: DemoResult, n_seeds: int) -> list[str]:
    """Mean±std over seeds of each method's curve, then the paired differences."""
    c = result.config
    k = c.data.eval_samples
    steps = sorted({s for row in result.rows for s in row.curve})
    w = 11
    cols = (
        f"{'method':<14}"
        + "".join(f"{s:>{w}d}" for s in steps)
        + f"{'gain':>{w}}{'mean':>{w}}{'pass@' + str(k):>{w}}{'s/step':>8}{'selected':>9}"
    )
    lines = [
        f"held-out average@{k} (%) on {c.data.eval_questions} questions by RL step (0: the warm "
        f"start), mean±std over {n_seeds} seeds; mean: area under the curve / steps; "
        f"pass@{k} (%) at the end",
        cols,
        "-" * len(cols),
    ]
    for method in result.methods:
        runs = result.runs(method)
        cells = []
        for s in steps:
            values = [100 * dict(run.average(k))[s] for run in runs if s in run.curve]
            cells.append(_pm(values) if values else "-")
        lines.append(
            f"{method:<14}"
            + "".join(f"{cell:>{w}}" for cell in cells)
            + f"{_pm([100 * run.gain(k) for run in runs], signed=True):>{w}}"
            + f"{_pm([100 * run.area_mean(k) for run in runs]):>{w}}"
            + f"{_pm([100 * run.curve[max(run.curve)][f'pass@{k}'] for run in runs]):>{w}}"
            + f"{mean_std([run.step_time_s for run in runs])[0]:>8.3f}"
            + f"{mean_std([run.selected_fraction for run in runs])[0]:>9.3f}"
        )
    comparisons = compare(result)
    if comparisons:
        lines.append(
            "paired by seed, A - B in points (mean: over training; final: last evaluation): "
            "mean±std over seeds [95% t interval]"
        )
        for cmp in comparisons:
            name = f"{cmp.a} - {cmp.b}"
            for what, d in (("mean", cmp.mean), ("final", cmp.final)):
                lines.append(f"  {name:<28} {what:<5} {describe_difference(d, cmp.a, cmp.b)}")
                name = ""
    return lines


def describe_difference(d: PairedDifference, a: str, b: str) -> str:
    """One paired difference in words: its size, its interval, the seeds each way, the verdict
    (clear only when the 95% interval excludes 0)."""
    if d.std is None or d.low is None or d.high is None:
        return f"{d.mean:+.1f} (one seed: no spread)"
    short_a, short_b = a.split()[0], b.split()[0]
    if d.clear:
        leader = short_a if d.mean > 0 else short_b
        verdict = f"{leader} ahead by more than the seed spread"
    else:
        verdict = "within the seed spread (no clear order)"
    return (
        f"{d.mean:+5.1f}±{d.std:.1f} [{d.low:+.1f}, {d.high:+.1f}]; {short_a} ahead on {d.ahead} "
        f"of {d.n} seeds; {verdict}"
    )


def _warm_start_lines(result: DemoResult) -> list[str]:
    """How each seed's warm start ended (its early stop, or that it missed it) and the time."""
    lines = []
    several = len(result.warm_starts) > 1
    for seed, w in sorted(result.warm_starts.items()):
        config = w.get("settings", {}).get("config", {})
        target = config.get("stop_at_greedy")
        check = w.get("check_accuracy")
        window = config.get("stop_window", 1)
        over = f", mean of the last {window} checks" if window > 1 else ""
        if target is None or check is None:
            stop = ""
        elif check >= target:
            stop = f" (stopped at {100 * check:.1f}% greedy on the check questions{over})"
        else:
            stop = (
                f" (did NOT reach its {100 * target:.0f}% check target: {100 * check:.1f}%{over})"
            )
        name = f"warm start of seed {seed}" if several else "warm start"
        lines.append(
            f"{name}: {w['steps_done']} supervised steps{stop}, held-out greedy accuracy "
            f"{100 * w['greedy_accuracy']:.1f}%"
        )
    if lines:
        summed = " summed over the seeds" if several else ""
        lines.append(
            f"warm start time: {result.warm_start_s:.0f} s{summed} (cached after the first run)"
        )
    return lines


# ------------------------------------------------------------------------------- the JSON


def machine_record() -> dict[str, Any]:
    """What the demo's arithmetic depends on besides the recipe: the CPU and its SIMD flags,
    the kernels torch picked, the versions, the environment that changes them, the load."""
    import torch

    cpu, flags = platform.processor() or "?", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    try:
        import transformers

        transformers_version: str | None = transformers.__version__
    except ImportError:  # pragma: no cover - the train extra requires it
        transformers_version = None
    return {
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "simd_flags": sorted(f for f in flags if f in ("avx2", "avx512f", "amx_tile")),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "transformers": transformers_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "env": {k: os.environ[k] for k in FLOAT_PATH_ENV if k in os.environ},
        "uptime": _uptime(),
    }


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _git_commit() -> str | None:
    """The commit when gmts runs from a git checkout (None otherwise)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def demo_record(
    result: DemoResult, *, command: str, machine: dict[str, Any], commit: str | None
) -> dict[str, Any]:
    """The demo's JSON: the printed table, the paired comparisons, every run and where it ran
    (``benchmarks/report.py`` renders ``benchmarks/results/demo.json`` into the docs).
    ``commit``: the checkout's commit when the runs started (:func:`_git_commit`)."""
    return {
        "benchmark": "demo",
        "status": "ok",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "commit": commit,
        "threads": result.config.threads,
        "wall_s": round(result.total_s, 1),
        "machine": machine,
        "uptime_after": _uptime(),
        "table": format_table(result),
        "comparisons": [dataclasses.asdict(c) for c in compare(result)],
        "result": dataclasses.asdict(result),
    }


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
    parser.add_argument(
        "--seed", type=int, default=None, help="The first seed (seed): warm start and RL."
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=d.seeds,
        help="Seeds per method (default %(default)s): --seed and the ones after it, each with "
        "its own warm start; the table pairs the methods seed by seed and says whether a "
        "difference is larger than the seed spread.",
    )
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
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="Processes running warm starts and runs side by side (default: the usable CPUs "
        "divided by the recipe's threads). The table does not depend on it.",
    )
    parser.add_argument("--no-progress", action="store_true", help="No progress bars.")
    parser.add_argument(
        "--json",
        default=None,
        help="Also write the table, the paired comparisons, every run and the machine to this "
        "JSON file (benchmarks/report.py renders benchmarks/results/demo.json into the docs).",
    )


def run(args: argparse.Namespace) -> int:
    import json
    import shlex

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
            seeds=args.seeds,
            jobs=args.jobs,
        )
        machine = machine_record()  # before the runs: the load they started under
        commit = _git_commit()  # the code that runs (the checkout may move on meanwhile)
        result = run_demo(settings, progress=not args.no_progress)
    except ValueError as exc:
        print(f"gmts demo: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    if args.json:
        argv = sys.argv[sys.argv.index("demo") + 1 :] if "demo" in sys.argv else sys.argv[1:]
        record = demo_record(
            result,
            command=("gmts demo " + " ".join(shlex.quote(a) for a in argv)).strip(),
            machine=machine,
            commit=commit,
        )
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0
