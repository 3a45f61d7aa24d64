"""How a demo runs: each seed's start (its cached warm start and one evaluation of it), then
every method trained from it, in this process or spread over a pool of spawned processes.

A seed's start is evaluated without a ``Trainer`` (:func:`gmts.train.evaluation.evaluate_start`:
the run's starting policy, loaded as its trainer loads it, through the trainer's own
evaluation), once for all of its methods. It says what it is doing as it goes (a line as each
seed's warm start begins, with how long one takes, and a line as the seed's runs begin), and
prints the runs' memory plan once: every run's ``Trainer`` prints its plan when it is built, so
the demo holds those back and shows the first run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmts.cli.demo_plot import plot_demo
from gmts.cli.demo_runs import METHODS, DemoResult, DemoRow, DemoSettings, demo_recipe, method_label
from gmts.train.config import TrainConfig

WARM_START_TIME = "usually 1-2 min on one CPU thread"
"""How long one seed's warm start trains (59-132 s each in benchmarks/results/demo.json)."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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


def _trainer_holding_back_its_plan(cfg: TrainConfig) -> tuple[Any, str | None]:
    """``Trainer(cfg)`` and the memory plan it printed, which is held back: everything else it
    prints to stderr passes through (also when it raises)."""
    from gmts.train.trainer import Trainer

    printed, trainer, plan = io.StringIO(), None, None
    try:
        with contextlib.redirect_stderr(printed):
            trainer = Trainer(cfg, overwrite=True)  # the demo rewrites its runs
    finally:
        text = printed.getvalue()
        if trainer is not None and trainer.memory_plan is not None:
            for shown in (trainer.memory_plan.table(), trainer.memory_plan.summary()):
                if shown + "\n" in text:
                    text, plan = text.replace(shown + "\n", "", 1), shown
                    break
        sys.stderr.write(text)
    return trainer, plan


def _pin_threads(base: TrainConfig) -> None:
    import torch

    if base.threads is not None:  # before the warm start, whose arithmetic depends on it
        torch.set_num_threads(base.threads)


def start_seed(
    base: TrainConfig, settings: DemoSettings, seed: int, progress: bool, announce: bool = False
) -> SeedStart:
    """``seed``'s warm start (cached) and its evaluation, which equals what each of its runs'
    ``Trainer.evaluate()`` gives before step 1 (one job of :func:`run_demo`); ``announce``: say
    what it begins with."""
    import json

    from gmts.embedded import warmstart
    from gmts.train.evaluation import evaluate_start

    _pin_threads(base)
    model_path, info, spent = base.model.path, None, 0.0
    d = base.data
    evaluation = f"evaluate it on {d.eval_questions} held-out questions x {d.eval_samples} samples"
    if model_path == "embedded":
        if announce:
            cached = warmstart.is_cached(d.task, cache_dir=settings.cache_dir, seed=seed)
            what = (
                "its cached warm start" if cached else f"train its warm start ({WARM_START_TIME})"
            )
            _say(f"seed {seed}: {what}, then {evaluation}")
        t0 = time.perf_counter()
        warm = warmstart.warm_start(
            d.task, cache_dir=settings.cache_dir, seed=seed, progress=progress
        )
        info = json.loads((warm / warmstart.INFO_FILE).read_text())
        model_path = str(warm)
        spent = time.perf_counter() - t0
    elif announce:
        _say(f"seed {seed}: {evaluation} ({model_path})")
    cfg = method_config(base, settings.methods[0], model_path, settings.output_dir, progress, seed)
    before = evaluate_start(cfg, progress=progress) or {}
    return SeedStart(seed, model_path, info, spent, before)


def train_method(
    base: TrainConfig,
    settings: DemoSettings,
    start: SeedStart,
    method: str,
    progress: bool,
    show_plan: bool = False,
) -> DemoRow:
    """One method trained from ``start`` (one job of :func:`run_demo`); ``show_plan``: say its
    memory plan (the demo's first run: every run's is the same), which is otherwise held back."""
    import torch

    from gmts.train.metrics_log import EVAL_FILE, read_metrics

    _pin_threads(base)
    cfg = method_config(base, method, start.model_path, settings.output_dir, progress, start.seed)
    trainer, plan = _trainer_holding_back_its_plan(cfg)
    if show_plan and plan is not None:
        _say(f"{plan}  (every run's)")
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


@dataclass
class _Progress:
    """One demo's bookkeeping while it runs: the seeds' starts and the finished runs, and the
    lines it says (``progress``: the progress lines; the first run says the memory plan
    regardless)."""

    base: TrainConfig
    settings: DemoSettings
    jobs: int
    progress: bool
    result: DemoResult
    t0: float = dataclasses.field(default_factory=time.perf_counter)
    starts: dict[int, SeedStart] = dataclasses.field(default_factory=dict)
    rows: dict[tuple[int, str], DemoRow] = dataclasses.field(default_factory=dict)
    plan_asked: bool = False

    @property
    def runs(self) -> str:
        runs, steps = len(self.settings.methods), self.base.optim.steps
        return f"{runs} run{'s' * (runs != 1)} of {steps} step{'s' * (steps != 1)}"

    def begin(self) -> None:
        if self.progress:
            _say(
                f"gmts demo: {len(self.result.seeds)} seed(s) x {self.runs} on "
                f"'{self.base.data.task}', {self.jobs} process(es) side by side"
                + (" (each imports torch first)" if self.jobs > 1 else "")
            )

    def show_plan(self) -> bool:
        """Whether the run about to begin is the first (it says the memory plan)."""
        first, self.plan_asked = not self.plan_asked, True
        return first

    def started(self, start: SeedStart, counter: str = "") -> None:
        """Record ``start``; say that its runs begin."""
        self.starts[start.seed] = start
        if start.warm_start is not None:
            self.result.warm_starts[start.seed] = start.warm_start
        self.result.warm_start_s += start.warm_start_s
        if self.progress:
            k = self.base.data.eval_samples
            score = start.before.get(f"average@{k}")
            ready = "evaluated" if start.warm_start is None else "warm start ready"
            took = "" if start.warm_start is None else f" after {start.warm_start_s:.0f} s"
            held_out = "" if score is None else f", held-out average@{k} {100 * score:.1f}%"
            _say(
                f"{counter}seed {start.seed}: {ready}{took}{held_out}; its {self.runs} "
                + ("begin" if self.jobs == 1 else "are queued")
            )

    def finished(self, row: DemoRow, method: str, counter: str) -> None:
        self.rows[row.seed, method] = row
        if self.progress:
            _say(f"{counter}seed {row.seed}: {row.method} done")


def _run_here(p: _Progress) -> None:
    """Every seed's start and then its runs, one after another in this process."""
    base, settings, progress = p.base, p.settings, p.progress
    for seed in p.result.seeds:
        p.started(start_seed(base, settings, seed, progress, announce=progress))
        for method in settings.methods:
            start = p.starts[seed]
            row = train_method(base, settings, start, method, progress, p.show_plan())
            p.rows[seed, method] = row


def _run_in_pool(p: _Progress) -> None:
    """The seeds' starts, then each seed's runs as soon as its start is done, over ``p.jobs``
    spawned processes (fresh workers: no state but the job's)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    base, settings = p.base, p.settings
    total = len(p.result.seeds) * (1 + len(settings.methods))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=p.jobs, mp_context=context) as pool:
        pending: dict[Future[Any], tuple[int, str | None]] = {
            pool.submit(start_seed, base, settings, seed, False, p.progress): (seed, None)
            for seed in p.result.seeds
        }
        done_jobs = 0
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                seed, method = pending.pop(future)
                done_jobs += 1
                elapsed = time.perf_counter() - p.t0
                counter = f"[{done_jobs}/{total}, {elapsed:.0f} s, {p.jobs} processes] "
                if method is None:
                    p.started(future.result(), counter)
                    for m in settings.methods:
                        start = p.starts[seed]
                        job = pool.submit(
                            train_method, base, settings, start, m, False, p.show_plan()
                        )
                        pending[job] = (seed, m)
                else:
                    p.finished(future.result(), method, counter)


def run_demo(settings: DemoSettings | None = None, *, progress: bool = True) -> DemoResult:
    """For each seed: its warm start (cached), one evaluation of it, every method trained from
    it; then plot the curves. With ``jobs > 1`` the seeds' starts and then their runs are
    spread over that many processes (a seed's runs begin as soon as its start is done)."""
    settings = settings or DemoSettings()
    base = demo_recipe(settings.overrides)  # a bad override fails here, before any work
    if base.data.dataset is not None or base.data.eval_questions < 1:
        raise ValueError("the demo needs a built-in task (data.task) and data.eval_questions >= 1")
    seeds = [base.seed + i for i in range(settings.seeds)]
    jobs = settings.jobs or default_jobs(base, len(seeds) * len(settings.methods))
    result = DemoResult(config=base, warm_starts={}, warm_start_s=0.0, seeds=seeds)
    p = _Progress(base, settings, jobs, progress, result)
    p.begin()
    (_run_here if jobs == 1 else _run_in_pool)(p)
    result.rows = [p.rows[seed, method] for seed in seeds for method in settings.methods]
    result.plot = str(plot_demo(result, Path(settings.output_dir) / "curves.png"))
    result.total_s = time.perf_counter() - p.t0
    return result
