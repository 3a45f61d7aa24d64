"""How a demo runs: each seed's start, then every method trained from it
(:mod:`gmts.demo.jobs`), in this process or spread over a pool of spawned processes; then the
curves (:mod:`gmts.demo.plot`).

It says what it is doing as it goes (a line as each seed's warm start begins, with how long one
takes, and a line as the seed's runs begin), and prints the runs' memory plan once (the first
run's: every run's is the same).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gmts.demo.jobs import start_seed, train_method
from gmts.demo.plot import plot_demo
from gmts.demo.progress import DemoProgress
from gmts.demo.records import DemoResult
from gmts.demo.settings import DemoSettings, demo_recipe
from gmts.train.config import TrainConfig


def default_jobs(base: TrainConfig, runs: int) -> int:
    """Processes for ``runs`` runs of ``base``: the usable CPUs over its thread count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(runs, cpus // max(base.threads or cpus, 1)))


def _run_here(p: DemoProgress) -> None:
    """Every seed's start and then its runs, one after another in this process."""
    base, settings, progress = p.base, p.settings, p.progress
    for seed in p.result.seeds:
        p.started(start_seed(base, settings, seed, progress, announce=progress))
        for method in settings.methods:
            start = p.starts[seed]
            row = train_method(base, settings, start, method, progress, p.show_plan())
            p.rows[seed, method] = row


def _run_in_pool(p: DemoProgress) -> None:
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
    p = DemoProgress(base, settings, jobs, progress, result)
    p.begin()
    (_run_here if jobs == 1 else _run_in_pool)(p)
    result.rows = [p.rows[seed, method] for seed in seeds for method in settings.methods]
    result.plot = str(plot_demo(result, Path(settings.output_dir) / "curves.png"))
    result.total_s = time.perf_counter() - p.t0
    return result
