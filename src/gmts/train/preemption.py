"""Preemption: a signal asks the trainer to stop at the next step boundary, with a checkpoint.

SLURM, Kubernetes and spot instances send SIGTERM (or a signal the job asks for, e.g. SLURM's
``--signal=B:USR1@300``) some time before they kill a job. During ``Trainer.run`` a
:class:`PreemptionGuard` owns SIGTERM and ``checkpoint.preempt_signal``:

- the handler only records the signal number (one attribute store: no I/O, no lock, no
  allocation that the interrupted code could be holding), so it is safe wherever it
  interrupts the main thread, in the middle of a checkpoint write included; a second or third
  signal records again and changes nothing;
- the trainer calls :meth:`PreemptionGuard.stop_at_boundary` at step boundaries (after the
  step's metrics are logged and its periodic checkpoint written, and after an evaluation); its
  poll, :meth:`PreemptionGuard.stop_requested`, is under ``torchrun`` one all-reduce (MAX) of
  a one-element tensor, so a signal that reached a single rank stops every rank at the same
  step;
- when the poll answers yes, the guard has the trainer write the checkpoint of the finished
  step (atomic, :mod:`gmts.train.checkpoint`), writes :data:`MARKER_FILE` into the run
  directory and raises :class:`TrainingPreempted`, a ``SystemExit`` with status
  :data:`PREEMPTED_EXIT_CODE`.

The whole policy (what is saved when the signal arrives during the first step, an
evaluation, after the last step; torchrun; the SLURM recipe) is docs/training.md,
"Preemption".
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from gmts.core.distributed import all_reduce_max
from gmts.models.loading import step_dir_name
from gmts.scale.distributed import DistInfo, barrier
from gmts.train.checkpoint import checkpoint_dir
from gmts.train.config import PREEMPT_SIGNALS

__all__ = [
    "MARKER_FILE",
    "PREEMPTED_EXIT_CODE",
    "PreemptionGuard",
    "TrainingPreempted",
    "clear_marker",
    "write_marker",
]

PREEMPTED_EXIT_CODE = 75
"""Exit status after a preemption checkpoint: ``EX_TEMPFAIL`` of sysexits.h ("temporary
failure; the user is invited to retry"). It differs from 0 (finished), 1 (a Python error), 2
(a bad config) and from 128 + N (killed by signal N with nothing saved: 143 for an unhandled
SIGTERM, 137 for SIGKILL), so a requeue script, or slurm.conf's ``RequeueExit=75``, can tell
"saved, run me again with --resume" from the rest."""

MARKER_FILE = "preempted.json"
"""Written into the run directory (by rank 0) after a preemption checkpoint, removed when the
next run in that directory starts. Under torchrun the launcher's own exit status is 1 whatever
its workers returned, so this file is how a job script learns that the run was preempted."""

STOP_SIGNALS = ("SIGTERM",)
"""Always handled; ``checkpoint.preempt_signal`` adds one of :data:`PREEMPT_SIGNALS`."""


class TrainingPreempted(SystemExit):
    """Raised by ``Trainer.run`` after a preemption signal: the run stopped at a step boundary.

    Being a ``SystemExit``, it ends a script that does not catch it with
    :data:`PREEMPTED_EXIT_CODE`, after ``finally`` blocks (leaving the process group) ran.
    ``checkpoint`` is the checkpoint to resume from (None when the signal came before the
    first step: nothing had changed, ``--resume`` starts afresh).
    """

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.signal_name = signal_name
        self.step = step
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = (
            f"checkpoint {self.checkpoint} saved"
            if self.checkpoint is not None
            else "no step had run, nothing to save"
        )
        return (
            f"stopped by {self.signal_name} after step {self.step}: {saved}; continue with "
            f"--resume (exit status {PREEMPTED_EXIT_CODE})"
        )


class PreemptionGuard:
    """Records SIGTERM and ``extra_signal`` while entered; answers "stop now?" for all ranks.

    ``with PreemptionGuard("SIGUSR1", info, device) as guard: ... guard.stop_requested()``.
    The previous handlers come back on exit. Outside the main thread Python cannot install
    handlers: the guard then warns and handles nothing (a signal acts as it did before).
    ``device``: where the poll's one-element tensor lives (the process group's device: CUDA
    under NCCL).
    """

    def __init__(
        self, extra_signal: str | None, info: DistInfo, device: torch.device | str = "cpu"
    ) -> None:
        names = STOP_SIGNALS + ((extra_signal,) if extra_signal else ())
        unknown = [n for n in names[1:] if n not in PREEMPT_SIGNALS or not hasattr(signal, n)]
        if unknown:
            raise ValueError(
                f"checkpoint.preempt_signal: expected one of {list(PREEMPT_SIGNALS)} or null, "
                f"got {unknown[0]!r}"
            )
        self.signals = tuple(signal.Signals[n] for n in names)
        self.info = info
        self.device = torch.device(device)
        self.received: int | None = None  # the last signal number seen by THIS process
        self.agreed: int | None = None  # the signal the ranks stopped for (largest number)
        self._previous: dict[signal.Signals, Any] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum  # the whole handler: see the module docstring

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "Trainer.run is not in the main thread, where Python handles signals: "
                f"{', '.join(s.name for s in self.signals)} will not stop training at a step "
                "boundary with a checkpoint (they act as they did before)",
                RuntimeWarning,
                stacklevel=2,
            )
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def stop_requested(self) -> bool:
        """Whether any rank has received a stop signal. A collective under several processes:
        every rank calls it at the same step boundary (one all-reduce of one number)."""
        local = self.received or 0
        if self.info.world_size > 1:
            flag = torch.tensor([local], dtype=torch.int32, device=self.device)
            local = int(all_reduce_max(flag, self.info.group).item())
        if local:
            self.agreed = local
        return bool(local)

    @property
    def signal_name(self) -> str:
        """The name of the signal the run stops for (after :meth:`stop_requested` said yes)."""
        number = self.agreed or self.received
        return signal.Signals(number).name if number else "no signal"

    def stop_at_boundary(
        self,
        step: int,
        run_dir: Path,
        *,
        save: Callable[[], None],
        close: Sequence[Any],
    ) -> None:
        """At a step boundary, after ``step`` steps (collective): if any rank got a stop signal,
        save this step with ``save`` (nothing before the first step), close each of ``close``
        that is not None (the steps' bar, the metrics log), write :data:`MARKER_FILE` (rank 0)
        and raise :class:`TrainingPreempted` on every rank; otherwise return."""
        if not self.stop_requested():
            return
        checkpoint = None
        if step > 0:
            save()
            checkpoint = checkpoint_dir(run_dir) / step_dir_name(step)
        stopped = TrainingPreempted(self.signal_name, step, checkpoint)
        for part in close:
            if part is not None:
                part.close()
        if self.info.is_main:
            write_marker(run_dir, stopped)
            print(f"gmts train: {stopped}", file=sys.stderr)
        barrier(self.info)  # no rank exits (torchrun then stops the rest) before rank 0 is done
        raise stopped

    def note_after_the_end(self) -> None:
        """Rank 0, the run complete: say so if a signal arrived after the last step's
        checkpoint (during the final evaluation), which the run did not stop for."""
        if self.received is not None and self.info.is_main:
            print(
                f"gmts train: {self.signal_name} arrived after the last step's checkpoint "
                "(during the final evaluation); the run is complete",
                file=sys.stderr,
            )


def write_marker(run_dir: str | Path, stopped: TrainingPreempted) -> Path:
    """Write :data:`MARKER_FILE` (signal, step, checkpoint, time) atomically; returns its path."""
    path = Path(run_dir) / MARKER_FILE
    record = {
        "signal": stopped.signal_name,
        "step": stopped.step,
        "checkpoint": str(stopped.checkpoint) if stopped.checkpoint is not None else None,
        "exit_status": PREEMPTED_EXIT_CODE,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = path.with_name(f"{MARKER_FILE}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def clear_marker(run_dir: str | Path) -> None:
    """Remove :data:`MARKER_FILE` (a run is starting in ``run_dir``)."""
    (Path(run_dir) / MARKER_FILE).unlink(missing_ok=True)
