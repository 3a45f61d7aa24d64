"""Run math-verify comparisons in a helper process that is killed when it runs too long.

Why a process: math-verify bounds its own run time with ``signal.alarm``, which only works in
the main thread (it raises ``ValueError`` in trainer/reward worker threads) and cannot interrupt
long C-level work (one huge big-integer operation never returns to the interpreter to run the
signal handler). A separate process can always be killed.

Design:
- The parent keeps a small pool of long-lived worker processes (one per concurrently calling
  thread, at most ``max_workers``) that talk JSON lines over pipes. A worker imports math-verify once, so a call costs
  a parse and a verify plus well under a millisecond of pipe traffic.
- Inside the worker (its main thread), a ``setitimer`` alarm raises a ``BaseException`` after
  the call's budget, which math-verify's ``except Exception`` handlers cannot swallow; math-verify's
  own alarms are disabled so they cannot cancel ours. The worker also caps its address space.
- The parent waits for the answer with ``select`` until the call's deadline; on a miss it kills
  the worker (SIGKILL) and counts the answer as wrong. The next call starts a fresh worker.
- If a worker cannot be started at all, `MathVerifierPool` falls back to checking in-process
  (signal guard in the main thread, no guard elsewhere) and warns once.

The worker's side lives in ``_math_server.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from gmts.rewards.final_answer import extract_final_answer
from gmts.rewards.math_answer import (
    MAX_ANSWER_CHARS,
    answers_match,
    check_with_deadline,
    normalize_answer,
    strings_match,
)

# the first start imports SymPy and math-verify, which can take seconds on a busy machine
WORKER_START_TIMEOUT_S = 120.0
_READY = "ready"
_SERVER_SCRIPT = Path(__file__).with_name("_math_server.py")


class _Worker:
    """One worker process and its pipes (parent side)."""

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        # a script path, not `-m gmts...`: importing the gmts package would import torch
        self.process = subprocess.Popen(
            [sys.executable, str(_SERVER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._buffer = b""
        line = self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S)
        if line != _READY:
            self.kill()
            raise RuntimeError(f"math worker did not start (said {line!r})")

    def _read_line(self, deadline: float) -> str | None:
        """One line from the worker, or None at the deadline or when the worker died."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # EOF: the worker died
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace")

    def check(self, predicted: str, gold: str, timeout: float) -> bool | None:
        """True/False from the worker, or None if it missed the deadline or died."""
        deadline = time.monotonic() + timeout
        budget = max(timeout * 0.8, timeout - 0.25)
        request = json.dumps({"pred": predicted, "gold": gold, "budget": budget}) + "\n"
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(request.encode("utf-8"))
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self._read_line(deadline)
        if line is None:
            return None
        try:
            return bool(json.loads(line)["match"])
        except (ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class MathVerifierPool:
    """Thread-safe pool of math workers; `check` never raises and never outlives its timeout.

    A call hands its comparison to an idle worker (starting one if none is idle; at most
    ``max_workers`` run at once, default ``min(8, cpu_count)``). A worker that
    misses the deadline is killed and replaced on a later call. After ``fork`` the child process
    leaves the parent's workers alone and starts its own.
    """

    def __init__(self, max_workers: int | None = None) -> None:
        if max_workers is None:
            max_workers = min(8, os.cpu_count() or 1)
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        # callers beyond max_workers wait here (not counted in their timeout): each worker
        # holds SymPy in memory, so 64 reward threads must not mean 64 processes
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pid = os.getpid()
        self._inline = False
        self.kills = 0  # number of workers killed at their deadline (for tests and logs)

    def _take(self) -> _Worker | None:
        with self._lock:
            if os.getpid() != self._pid:  # forked: the pipes belong to the parent process
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
            if self._inline:
                return None
        try:
            return _Worker()
        except (OSError, RuntimeError) as error:
            with self._lock:
                if not self._inline:
                    self._inline = True
                    warnings.warn(
                        f"gmts.rewards: could not start a math-verify worker process ({error}); "
                        "checking answers in-process, where pathological LaTeX is only time-bounded "
                        "in the main thread and C-level stalls cannot be interrupted",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            return None

    def check(self, predicted: str, gold: str, timeout: float) -> bool:
        """Whether ``predicted`` matches ``gold``; False on timeout, crash or any error."""
        with self._slots:
            return self._check(predicted, gold, timeout)

    def _check(self, predicted: str, gold: str, timeout: float) -> bool:
        worker = self._take()
        if worker is None:
            return check_inline(predicted, gold, timeout)
        result = worker.check(predicted, gold, timeout)
        if result is None:
            worker.kill()
            self.kills += 1
            return False
        with self._lock:
            if os.getpid() == self._pid:
                self._idle.append(worker)
        return result

    def close(self) -> None:
        """Stop every idle worker (they also exit by themselves when this process exits)."""
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            if worker.owner_pid == os.getpid():
                worker.kill()


_inline_warned = False


def check_inline(predicted: str, gold: str, timeout: float) -> bool:
    """In-process check: alarm-guarded in the main thread, unguarded (warned once) elsewhere."""
    global _inline_warned
    can_alarm = (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0  # do not clobber a caller's timer
    )
    try:
        if can_alarm:
            return check_with_deadline(predicted, gold, timeout)
        if not _inline_warned:
            _inline_warned = True
            warnings.warn(
                "gmts.rewards: in-process math check without a time bound (not the main thread "
                "or a timer is already running)",
                RuntimeWarning,
                stacklevel=3,
            )
        return answers_match(predicted, gold)
    except Exception:  # noqa: BLE001 - a verifier must never raise on model output
        return False


@functools.lru_cache(maxsize=1)
def _math_verify_installed() -> bool:
    return importlib.util.find_spec("math_verify") is not None


_POOL = MathVerifierPool()
atexit.register(_POOL.close)
ISOLATIONS = ("process", "inline")


def math_reward(
    completion: str,
    answer: str,
    *,
    timeout: float = 5.0,
    isolation: str = "process",
    rule: str = "boxed",
) -> float:
    """1.0 if the final answer of ``completion`` equals the gold ``answer``, else 0.0.

    The final answer is read by ``rule`` (:mod:`gmts.rewards.final_answer`): ``"boxed"``, the
    last complete ``\\boxed{...}`` (a completion without one scores 0), or
    ``"boxed-or-last-number"``, that box or else the last number of the text. It and the gold
    answer are normalised (`normalize_answer`: ``$`` removed, trailing period, ``27.0`` ->
    ``27``, ``025`` -> ``25``) and compared by exact string or by math-verify (symbolic and
    numeric equality).

    Args:
        completion: model output; any text (never raises on it).
        answer: gold answer as the benchmark stores it (``str``, or a number for AMC).
        rule: how the final answer is read (see above).
        timeout: seconds one call may take (the worker's first start-up excluded); a check that
            runs longer scores 0.0.
        isolation: ``"process"`` (default) checks in a killable worker process; ``"inline"``
            checks in this process, time-bounded only in the main thread (see module docstring).
    """
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if not _math_verify_installed():
        raise ImportError("math_reward needs the math-verify package: pip install 'gmts[rewards]'")
    predicted = extract_final_answer(completion, rule) if isinstance(completion, str) else None
    if not predicted or answer is None:
        return 0.0
    gold = answer if isinstance(answer, str) else normalize_answer(answer)
    if len(predicted) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        # far too long to parse: only an exact (normalised) match counts
        return 1.0 if strings_match(predicted, gold) else 0.0
    if isolation == "inline":
        return 1.0 if check_inline(predicted, gold, float(timeout)) else 0.0
    return 1.0 if _POOL.check(predicted, gold, float(timeout)) else 0.0
