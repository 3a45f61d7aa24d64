"""What a demo records: one seed's starting point (:class:`SeedStart`), one run
(:class:`DemoRow`) and the whole result (:class:`DemoResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gmts.train.config import TrainConfig


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
