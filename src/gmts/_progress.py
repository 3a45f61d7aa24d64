"""Progress of a long phase, one helper for every command: a bar on a terminal, a line in a log.

Every phase that can take more than about ten seconds on a CPU (a model conversion, a held-out
evaluation, a step's rollout and update, ``gmts analyze``'s gradient norms, ``gmts eval``'s
generation) goes through :class:`Progress`:

- on a terminal (the stream is a TTY): a tqdm bar with the count, the total and tqdm's estimate
  of the time left, plus an optional *stage* after it (``sampling 37/128 tokens, ~20 s left``),
  redrawn every second by a small thread, so the elapsed time and the estimates move even while
  one long call (a generation) runs;
- in a log (not a TTY): no bar; one line when the phase ends, ``<what>: 64/64 questions in 93 s``,
  for a phase that took at least ``log_after_s`` (a quick phase adds nothing to a log), and the
  lines a caller passes to :meth:`Progress.log`;
- ``enabled=False``: nothing at all (``--no-progress``, ``logging.progress=false``).

:func:`count_forwards` turns the forward passes of a torch module into progress without
touching the code that runs them: the KV-cached samplers run one forward per generated position,
so counting them gives ``positions sampled / budget`` of a generation call.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

__all__ = ["LOG_AFTER_S", "Progress", "count_forwards", "is_terminal"]

LOG_AFTER_S = 10.0
"""Off a terminal, a phase that took at least this many seconds writes its line."""
REFRESH_S = 1.0
"""On a terminal the bar is redrawn this often while the phase runs."""


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) is a terminal: bars there, lines otherwise."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _seconds(value: float) -> str:
    value = max(0.0, value)
    if value < 90:
        return f"{value:.0f} s"
    minutes, seconds = divmod(int(round(value)), 60)
    return f"{minutes} min {seconds:02d} s"


class _Stage:
    """A stage of a phase: its name, count and total (grown by ``per_round`` past it)."""

    def __init__(self, name: str, total: float | None) -> None:
        self.name = name
        self.done = 0.0
        self.total = total
        self.per_round = total
        self.started = time.perf_counter()

    def advance(self, amount: float) -> None:
        self.done += amount
        while self.per_round and self.total is not None and self.done > self.total:
            self.total += self.per_round


class Progress:
    """One phase's progress (a context manager; :meth:`close` ends it).

    Args:
        what: the phase, e.g. ``"held-out evaluation (64 questions x 2 samples)"``.
        total: the count at which it is done (None: unknown; no estimate then).
        unit: what is counted, e.g. ``"questions"``.
        enabled: False: show and write nothing.
        initial: the count already done (a resumed phase).
        stream: where to write (default ``sys.stderr``); a TTY gets the bar.
        log_after_s: off a terminal, the end line is written when the phase took this long.
        leave: on a terminal, keep the finished bar on screen.
    """

    def __init__(
        self,
        what: str,
        total: float | None = None,
        unit: str = "it",
        *,
        enabled: bool = True,
        initial: float = 0,
        stream: TextIO | None = None,
        log_after_s: float = LOG_AFTER_S,
        leave: bool = False,
    ) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.enabled = enabled
        self.count = initial
        self.stream = sys.stderr if stream is None else stream
        self.log_after_s = log_after_s
        self.started = time.perf_counter()
        self._stage: _Stage | None = None
        self._postfix = ""
        self._lock = threading.Lock()
        self._closed = False
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled and is_terminal(self.stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                desc=what,
                unit=unit,
                file=self.stream,
                dynamic_ncols=True,
                leave=leave,
            )
            self._thread = threading.Thread(target=self._refresh_loop, daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ counting

    @property
    def on_terminal(self) -> bool:
        """Whether a bar is shown (else, when enabled, lines are written)."""
        return self._bar is not None

    def update(self, amount: float = 1) -> None:
        """Add ``amount`` to the count."""
        with self._lock:
            self.count += amount
            if self._bar is not None:
                self._bar.update(amount)

    def set_total(self, total: float | None) -> None:
        """Change the total (a phase whose size is learnt as it runs)."""
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()

    def set_postfix(self, text: str) -> None:
        """Text shown after the bar (e.g. the live reward), before the stage."""
        with self._lock:
            self._postfix = text
            self._show()

    def stage(self, name: str, total: float | None = None) -> None:
        """Begin a stage of the phase (shown after the bar with its own count and estimate)."""
        with self._lock:
            self._stage = _Stage(name, total)
            self._show()

    def advance_stage(self, amount: float = 1) -> None:
        """Add ``amount`` to the stage's count; a count past the stage's total adds its first
        total once more (a generation that needs another round)."""
        with self._lock:
            if self._stage is not None:
                self._stage.advance(amount)

    def end_stage(self) -> None:
        with self._lock:
            self._stage = None
            self._show()

    def stage_text(self) -> str:
        """``"sampling 37/128 tokens, ~20 s left"`` (the estimate once something is counted)."""
        if self._stage is None:
            return ""
        stage = self._stage
        elapsed = time.perf_counter() - stage.started
        if stage.total is None:
            return f"{stage.name} {stage.done:.0f}, {_seconds(elapsed)}"
        text = f"{stage.name} {stage.done:.0f}/{stage.total:.0f}"
        if stage.done > 0 and stage.total > stage.done:
            text += f", ~{_seconds(elapsed * (stage.total - stage.done) / stage.done)} left"
        return text

    # ------------------------------------------------------------------ output

    def log(self, line: str) -> None:
        """Write ``line`` in a log (off a terminal, enabled); nothing on a terminal."""
        if self.enabled and self._bar is None:
            print(line, file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def close(self, summary: str = "") -> None:
        """End the phase: close the bar, or write its line in a log when it took at least
        ``log_after_s`` (``summary`` appended to it)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            with self._lock:
                self._bar.close()
            return
        if not self.enabled or self.elapsed() < self.log_after_s:
            return
        count = f"{self.count:.0f}" + (f"/{self.total:.0f}" if self.total is not None else "")
        counted = f"{count} {self.unit} in " if self.count or self.total else ""
        extra = f"; {summary}" if summary else ""
        print(
            f"{self.what}: {counted}{_seconds(self.elapsed())}{extra}",
            file=self.stream,
            flush=True,
        )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _show(self) -> None:  # under self._lock
        if self._bar is None:
            return
        parts = [p for p in (self._postfix, self.stage_text()) if p]
        self._bar.set_postfix_str(", ".join(parts), refresh=True)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                if self._bar is not None and not self._closed:
                    self._show()


@contextlib.contextmanager
def count_forwards(module: Any, on_forward: Callable[[], None]) -> Iterator[None]:
    """Call ``on_forward()`` after every forward pass of ``module`` inside the block (a
    forward hook, removed on exit). ``module`` None: nothing is counted."""
    if module is None or not hasattr(module, "register_forward_hook"):
        yield
        return
    handle = module.register_forward_hook(lambda *_: on_forward())
    try:
        yield
    finally:
        handle.remove()
