"""The display of a training run: one bar over the steps, with the phase of the step in progress.

On a terminal (:class:`gmts._progress.Progress`): the steps done, the total and the time left,
the last step's reward, and the phase running now with its own count and estimate:

- ``rollout 37/192 positions, ~20 s left``: the policy's forward passes while it samples (the
  hf engine runs one per generated position and generation chunk; a chunk whose rows all
  ended stops early, so the count is an upper bound's share). A vllm engine samples outside
  the policy: its rollout shows the time spent;
- ``update 5/9 passes``: the policy's forward passes from the end of the rollout to the end of
  the step (reference and old log-probs, every micro-batch of every mini-batch); the first
  step learns the total, the later ones show it.

In a log: one line per step that took at least :data:`gmts._progress.LOG_AFTER_S` (the reward,
the accuracy, the rollout's and the update's seconds). Only rank 0 shows anything.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

from gmts._progress import LOG_AFTER_S, Progress, count_forwards

__all__ = ["RunProgress"]


class RunProgress:
    """The bar (or log lines) of one run's steps.

    Args:
        what: the bar's label (the run folder's name).
        steps: the run's steps; initial: those already done (a resumed run).
        enabled: show anything (``logging.progress``, rank 0).
        model: the policy whose forward passes are counted.
        rollout_positions: forward passes of one rollout round at most (generation chunks x
            the budget).
    """

    def __init__(
        self,
        what: str,
        *,
        steps: int,
        initial: int,
        enabled: bool,
        model: Any,
        rollout_positions: int,
    ) -> None:
        self.bar = Progress(
            what, total=steps, unit="steps", initial=initial, enabled=enabled, leave=True
        )
        self.model = model if enabled else None
        self.rollout_positions = rollout_positions
        self.update_passes: int | None = None  # learnt from the first step
        self._update = contextlib.ExitStack()
        self._passes = 0
        self._times: dict[str, float] = {}

    @classmethod
    def for_run(
        cls,
        cfg: Any,
        *,
        initial: int,
        enabled: bool,
        model: Any,
        world_size: int,
        max_new_tokens: int,
        what: str,
    ) -> RunProgress:
        """The display of a run of ``cfg`` (its rollout's size read from ``cfg.rollout``)."""
        r = cfg.rollout
        rows = r.questions_per_batch // world_size * r.group_size
        chunks = math.ceil(rows / (r.generation_batch_size or rows)) if rows else 1
        return cls(
            what,
            steps=cfg.optim.steps,
            initial=initial,
            enabled=enabled,
            model=model,
            rollout_positions=chunks * max_new_tokens,
        )

    @contextlib.contextmanager
    def rollout(self) -> Iterator[None]:
        """Around one step's rollout; the update phase begins when it ends."""
        self._end_update()  # a step that raised before step_done
        started = time.perf_counter()
        self.bar.stage("rollout", self.rollout_positions)
        try:
            with count_forwards(self.model, self.bar.advance_stage):
                yield
        finally:
            self._times = {"rollout": time.perf_counter() - started, "started": started}
        self._passes = 0
        self.bar.stage("update", self.update_passes)
        self._update.enter_context(count_forwards(self.model, self._on_update_pass))

    def _on_update_pass(self) -> None:
        self._passes += 1
        self.bar.advance_stage()

    def _end_update(self) -> None:
        self._update.close()
        self._update = contextlib.ExitStack()

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step`` (1-based) finished with ``metrics``: count it, show its reward."""
        self._end_update()
        if self.update_passes is None and self._passes:
            self.update_passes = self._passes
        self.bar.end_stage()
        self.bar.update(1)
        reward, accuracy = metrics.get("reward/mean", 0.0), metrics.get("reward/accuracy", 0.0)
        self.bar.set_postfix(
            f"reward={reward:.3f}, acc={accuracy:.2f}, "
            f"sel={metrics.get('select/fraction', 1.0):.2f}"
        )
        started = self._times.get("started")
        if started is None:
            return
        took = time.perf_counter() - started
        if took >= LOG_AFTER_S:
            rollout = self._times["rollout"]
            self.bar.log(
                f"{self.bar.what}: step {step}/{self.bar.total:.0f}: reward {reward:.3f}, "
                f"accuracy {accuracy:.2f}; {took:.0f} s (rollout {rollout:.0f} s, update "
                f"{took - rollout:.0f} s)"
            )

    def close(self) -> None:
        self._end_update()
        self.bar.close()
