"""The standalone RLVR trainer's loop: steps, checkpoints, held-out evaluations, preemption.

A run's parts are built by :func:`gmts.train.run_parts.build_run`; one step's algorithm is
:mod:`gmts.train.step` (rollout, scoring, selection, update) and its metrics row
:mod:`gmts.train.step_row`. :class:`Trainer` decides when to step, save, evaluate and stop.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.train.collect import CollectedBatch, collect_batch
from gmts.train.config import TrainConfig
from gmts.train.evaluation import evaluate_held_out
from gmts.train.metrics_log import EVAL_FILE
from gmts.train.preemption import PreemptionGuard, clear_marker
from gmts.train.run_folder import ResumeMode
from gmts.train.run_parts import build_run, lr_lambda
from gmts.train.run_progress import RunProgress
from gmts.train.saving import save_run
from gmts.train.signal_watch import ZERO_SIGNAL_STEPS, TruncationWatch, ZeroSignalWatch
from gmts.train.sources import RewardFn
from gmts.train.step import score_rollout, update_policy
from gmts.train.step_row import step_row


@dataclass
class TrainResult:
    """What :func:`train` returns: the run directory, per-step metrics and held-out evals."""

    run_dir: Path
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    eval_before: dict[str, float] | None = None
    eval_after: dict[str, float] | None = None


class Trainer:
    """The training loop over a run's parts (:func:`gmts.train.run_parts.build_run`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume: ResumeMode = False,
        overwrite: bool = False,
        allow_config_change: bool = False,
        reward_fn: RewardFn | None = None,
    ) -> None:
        """Build the run's parts (every check, the policy, the engine, the logs): see
        :func:`gmts.train.run_parts.build_run` for the arguments and the order."""
        parts = self.parts = build_run(
            cfg,
            resume=resume,
            overwrite=overwrite,
            allow_config_change=allow_config_change,
            reward_fn=reward_fn,
        )
        # the parts the loop and its callers use, by name
        self.cfg, self.info, self.device = parts.cfg, parts.processes.info, parts.processes.device
        self.run_dir, self.resume_from = parts.folder.path, parts.folder.resume_from
        self.source, self.rollout_engine, self.logger = (
            parts.data.source,
            parts.engine,
            parts.logger,
        )
        m, o = parts.model, parts.optimization
        self.tokenizer, self.strategy, self.model, self.ref_model = (
            m.tokenizer, m.strategy, m.model, m.reference
        )  # fmt: skip
        self.prompt_tokens, self.memory_plan = m.checked.prompt_tokens, m.checked.memory_plan
        self.optimizer, self.scheduler, self.scorer, self.loss = (
            o.optimizer, o.scheduler, o.scorer, o.loss
        )  # fmt: skip
        self.single_pass = o.single_pass
        # the loop's own state
        self.step, self.skipped_total = parts.counters.step, parts.counters.skipped_total
        self._signal_watch: ZeroSignalWatch | None = None  # made at the first step (rank 0)
        self._truncation_watch: TruncationWatch | None = None
        self.display: RunProgress | None = None  # the steps' bar, made by run()

    def collect(self, step: int) -> CollectedBatch:
        """This rank's rollout batch for ``step`` (rewards, dynamic sampling, advantages)."""
        shown = self.display.rollout() if self.display else contextlib.nullcontext()
        with self.rollout_engine.session(), shown:
            return collect_batch(
                self.rollout_engine,
                self.source,
                self.parts.data.reward_fn,
                self.cfg.rollout,
                seed=self.cfg.seed,
                step=step,
                max_new_tokens=self.parts.data.max_new_tokens,
                info=self.info,
                device=self.device,
            )

    # ------------------------------------------------------------------ one step

    def train_step(self, step: int) -> dict[str, float]:
        """One step of GRPO / DAPO with token selection (:mod:`gmts.train.step`, in order);
        returns its metrics row."""
        cfg, micro = self.cfg, self.cfg.optim.micro_batch_size
        t0 = time.perf_counter()
        # 1. Rollout: G answers per question, rewards, DAPO dynamic sampling, advantages.
        collected = self.collect(step)
        self._watch_signal(collected, step)
        t_rollout = time.perf_counter() - t0
        # 2-3. The reference's and the rollout policy's statistics, the correction's weights.
        batch, forward = score_rollout(
            self.model,
            self.ref_model,
            collected.batch,
            scorer=self.scorer,
            selection=cfg.selection,
            correction=self.parts.optimization.correction,
            micro_batch_size=micro,
            single_pass=self.single_pass,
        )
        # 4. Per epoch, per mini-batch: scores, ONE global selection, one update.
        updates = update_policy(
            self.model,
            batch,
            cfg=cfg,
            parts=self.parts.optimization,
            strategy=self.strategy,
            step=step,
            forward=forward,
        )
        row = step_row(
            collected,
            batch,
            updates,
            rollout=cfg.rollout,
            correction=self.parts.optimization.correction,
            engine_metrics=self.rollout_engine.metrics(),
            info=self.info,
            skipped_before=self.skipped_total,
            lr=self.scheduler.get_last_lr()[0],
            source=self.source,
            times=(t_rollout, time.perf_counter() - t0),
        )
        self.skipped_total = int(row["update/skipped_total"])
        return row

    def _watch_signal(self, collected: CollectedBatch, step: int) -> None:
        """Rank 0: warn once when the run's first steps have no group of differing rewards
        (:mod:`gmts.train.signal_watch`)."""
        if not self.info.is_main:
            return
        if self._signal_watch is None:
            self._signal_watch = ZeroSignalWatch(
                *self.parts.data.reward_expects,
                dynamic_sampling=bool(self.cfg.rollout.dynamic_sampling),
                steps=max(1, min(ZERO_SIGNAL_STEPS, self.cfg.optim.steps - step)),
            )
            self._truncation_watch = TruncationWatch(self.parts.data.max_new_tokens)
        self._signal_watch.observe(collected)
        assert self._truncation_watch is not None
        self._truncation_watch.observe(collected)

    # ------------------------------------------------------------------ evaluation, saving

    def evaluate(self) -> dict[str, float] | None:
        """average@k / pass@k on the held-out questions (rank 0): the task's, or those of
        ``data.eval_dataset``; None without any (:func:`gmts.train.evaluation.evaluate_held_out`)."""
        data = self.parts.data
        target = data.task if data.task is not None else data.held_out
        return evaluate_held_out(
            self.cfg, self.model, self.tokenizer, target, strategy=self.strategy, info=self.info
        )

    def save(self) -> None:
        """Checkpoint this step (collective; :func:`gmts.train.saving.save_run`)."""
        save_run(self.parts, self.step, self.skipped_total)

    def close(self) -> None:
        """Release the rollout engine (a vLLM engine's memory; under torchrun its teardown also
        leaves the process group, so this comes after the run's last collective)."""
        self.rollout_engine.close()

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainResult:
        """Train to ``optim.steps``. SIGTERM (and ``checkpoint.preempt_signal``) stop the run at
        the next step boundary with a checkpoint: :class:`TrainingPreempted` (exit status 75)
        is raised, and ``--resume`` continues exactly (gmts/train/preemption.py)."""
        with PreemptionGuard(self.cfg.checkpoint.preempt_signal, self.info, self.device) as guard:
            return self._run(guard)

    def _run(self, guard: PreemptionGuard) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(run_dir=self.run_dir, steps=cfg.optim.steps)
        # the step whose checkpoint exists already: a resumed run does not write it again
        self._saved_step = self.step if self.resume_from is not None else None
        if self.info.is_main:
            clear_marker(self.run_dir)
        if self.step == 0 and cfg.data.eval_before:
            result.eval_before = self._evaluate_and_log()
        elif self._evaluation_due():  # resumed: this step's evaluation comes after its save
            self._evaluate_and_log()
        bar = self.display = RunProgress.for_run(
            cfg,
            initial=self.step,
            enabled=cfg.logging.progress and self.info.is_main,
            model=self.model,
            world_size=self.info.world_size,
            max_new_tokens=self.parts.data.max_new_tokens,
            what=self.run_dir.name,
        )
        self._stop_if_requested(guard, bar)  # a signal during the evaluation before step 1
        every = cfg.checkpoint.every
        t_start = time.perf_counter()
        while self.step < cfg.optim.steps:
            metrics = self.train_step(self.step)
            self.step += 1
            metrics["time/elapsed_s"] = time.perf_counter() - t_start
            self.logger.log(self.step, metrics)
            result.history.append(metrics)
            bar.step_done(self.step, metrics)
            if every and (self.step % every == 0 or self.step == cfg.optim.steps):
                self._save_once()  # the last step too, whatever save_final says
            self._stop_if_requested(guard, bar)  # a signal during the step or its save
            if self._evaluation_due():
                self._evaluate_and_log()
                self._stop_if_requested(guard, bar)  # a signal during the evaluation
        bar.close()
        if cfg.checkpoint.save_final:
            self._save_once()
        self._stop_if_requested(guard, None)  # a signal during the final save
        result.eval_after = self._evaluate_and_log()
        self.logger.close()
        guard.note_after_the_end()
        return result

    def _evaluation_due(self) -> bool:
        """Whether ``data.eval_every`` asks for an evaluation after step ``self.step``."""
        d_every = self.cfg.data.eval_every
        return bool(d_every) and self.step % d_every == 0 and 0 < self.step < self.cfg.optim.steps

    def _evaluate_and_log(self) -> dict[str, float] | None:
        """:meth:`evaluate`, its metrics logged at this step (``eval.jsonl``) and returned."""
        ev = self.evaluate()
        if ev is not None:
            self.logger.log(self.step, ev, EVAL_FILE)
        return ev

    def _save_once(self) -> None:
        """:meth:`save` unless this step's checkpoint is already written."""
        if self._saved_step != self.step:
            self.save()
            self._saved_step = self.step

    def _stop_if_requested(self, guard: PreemptionGuard, bar: Any) -> None:
        """At a step boundary: stop the run with this step's checkpoint if any rank got a stop
        signal (:meth:`PreemptionGuard.stop_at_boundary`)."""
        guard.stop_at_boundary(
            self.step, self.run_dir, save=self._save_once, close=(bar, self.logger)
        )


def train(
    cfg: TrainConfig,
    *,
    resume: ResumeMode = False,
    overwrite: bool = False,
    allow_config_change: bool = False,
    reward_fn: RewardFn | None = None,
) -> TrainResult:
    """Train a policy as ``cfg`` says; see :class:`Trainer`. Returns the history and evals."""
    trainer = Trainer(
        cfg,
        resume=resume,
        overwrite=overwrite,
        allow_config_change=allow_config_change,
        reward_fn=reward_fn,
    )
    try:
        return trainer.run()
    finally:
        trainer.close()


__all__ = ["TrainResult", "Trainer", "lr_lambda", "train"]
