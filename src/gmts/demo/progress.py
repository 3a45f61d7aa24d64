"""What a running demo keeps and says: the seeds' starts and the finished runs as they come
in, and its progress lines on stderr (a line as the demo begins, as each seed's runs begin and,
from a pool, as each job ends)."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass

from gmts.demo.records import DemoResult, DemoRow, SeedStart
from gmts.demo.settings import DemoSettings
from gmts.train.config import TrainConfig


def say(line: str) -> None:
    """One progress line, on stderr (the table goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class DemoProgress:
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
            say(
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
            say(
                f"{counter}seed {start.seed}: {ready}{took}{held_out}; its {self.runs} "
                + ("begin" if self.jobs == 1 else "are queued")
            )

    def finished(self, row: DemoRow, method: str, counter: str) -> None:
        self.rows[row.seed, method] = row
        if self.progress:
            say(f"{counter}seed {row.seed}: {row.method} done")
