"""The two jobs a demo runs, here or in a spawned process: one seed's start (its cached warm
start and one evaluation of it) and one method trained from that start.

A seed's start is evaluated without a ``Trainer`` (:func:`gmts.train.evaluation.evaluate_start`:
the run's starting policy, loaded as its trainer loads it, through the trainer's own
evaluation), once for all of its methods. Every run's ``Trainer`` prints its memory plan when it
is built; a run holds it back unless asked to show it (the demo shows the first run's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import time
from pathlib import Path
from typing import Any

from gmts.demo.progress import say
from gmts.demo.records import DemoRow, SeedStart
from gmts.demo.settings import METHODS, DemoSettings, method_label
from gmts.train.config import TrainConfig

WARM_START_TIME = "usually 1-2 min on one CPU thread"
"""How long one seed's warm start trains (59-132 s each in benchmarks/results/demo.json)."""


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
            say(f"seed {seed}: {what}, then {evaluation}")
        t0 = time.perf_counter()
        warm = warmstart.warm_start(
            d.task, cache_dir=settings.cache_dir, seed=seed, progress=progress
        )
        info = json.loads((warm / warmstart.INFO_FILE).read_text())
        model_path = str(warm)
        spent = time.perf_counter() - t0
    elif announce:
        say(f"seed {seed}: {evaluation} ({model_path})")
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
        say(f"{plan}  (every run's)")
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
