"""What a demo is: its recipe (``demo.yaml``), the settings of one invocation, one record per
run (:class:`DemoRow`), the whole result (:class:`DemoResult`) and the paired comparisons of its
methods (:func:`compare`, statistics in :mod:`gmts.cli.demo_stats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.cli.demo_stats import PairedDifference, paired_difference
from gmts.train.config import TrainConfig, load_config

DEMO_CONFIG = Path(__file__).with_name("demo.yaml")
"""The demo's training recipe (a ``gmts train`` config)."""

METHODS = {"all tokens": "none", "ETS": "entropy", "GMTS": "gmts"}
"""Demo method -> ``selection.score``; ETS and GMTS keep the recipe's ``selection.ratio``."""

DEFAULT_SEEDS = 3
"""RL seeds per method by default (9 runs; docs/training.md has the wall time)."""


def demo_recipe(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The demo's ``TrainConfig``: ``demo.yaml`` with ``section.field=value`` overrides."""
    return load_config(DEMO_CONFIG, list(overrides))


@dataclass(frozen=True)
class DemoSettings:
    """What one demo invocation chooses beyond the recipe (which is ``demo.yaml``).

    Attributes:
        overrides: ``section.field=value`` items applied to ``demo.yaml`` (as for gmts train).
        output_dir: the runs go to ``<output_dir>/seed<S>/<selection.score>``, the plot to
            ``<output_dir>/curves.png``.
        cache_dir: warm-start cache (None: ``gmts.embedded.warmstart.default_cache_dir()``).
        methods: a subset of ``METHODS``, in table order.
        seeds: seeds per method: the recipe's ``seed`` and the ``seeds - 1`` after it; each
            seed has its own warm start (when ``model.path`` is "embedded") and RL seed.
        jobs: processes that run the warm starts and the runs side by side (None: as many as
            the CPUs this process may use hold runs of the recipe's ``threads``). Every run
            pins its own thread count and seeds, so the table does not depend on ``jobs``.
    """

    overrides: tuple[str, ...] = ()
    output_dir: str = "runs/demo"
    cache_dir: str | None = None
    methods: tuple[str, ...] = tuple(METHODS)
    seeds: int = DEFAULT_SEEDS
    jobs: int | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"unknown demo methods {unknown}; valid: {list(METHODS)}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"demo methods listed twice: {list(self.methods)}")
        if not isinstance(self.seeds, int) or isinstance(self.seeds, bool) or self.seeds < 1:
            raise ValueError(f"seeds must be an integer >= 1, got {self.seeds!r}")
        if self.jobs is not None and (
            not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs < 1
        ):
            raise ValueError(f"jobs must be an integer >= 1, got {self.jobs!r}")


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


@dataclass(frozen=True)
class Comparison:
    """Method ``a`` minus method ``b``, seed by seed, in points of held-out average@k: the
    ``mean`` over training (learning speed) and the ``final`` evaluation."""

    a: str
    b: str
    mean: PairedDifference
    final: PairedDifference


def compare(result: DemoResult) -> list[Comparison]:
    """Every pair of methods, a later one in table order minus an earlier one (the last method
    first: GMTS - ETS, GMTS - all tokens, ETS - all tokens), paired by seed; a seed that lacks
    one of the two runs is left out of that pair."""
    k = result.config.data.eval_samples
    methods = result.methods
    out = []
    for j in reversed(range(len(methods))):
        a = methods[j]
        for b in reversed(methods[:j]):
            runs_a = {r.seed: r for r in result.runs(a)}
            runs_b = {r.seed: r for r in result.runs(b)}
            pairs = [(runs_a[s], runs_b[s]) for s in sorted(set(runs_a) & set(runs_b))]
            if not pairs:
                continue
            out.append(
                Comparison(
                    a=a,
                    b=b,
                    mean=paired_difference(
                        [100 * x.area_mean(k) for x, _ in pairs],
                        [100 * y.area_mean(k) for _, y in pairs],
                    ),
                    final=paired_difference(
                        [100 * x.final(k) for x, _ in pairs], [100 * y.final(k) for _, y in pairs]
                    ),
                )
            )
    return out


def method_label(method: str, cfg: TrainConfig) -> str:
    """'all tokens', 'ETS top 20%', 'GMTS top 20%' (the ratio is the recipe's)."""
    if METHODS[method] == "none":
        return method
    side = "top" if cfg.selection.largest else "bottom"
    return f"{method} {side} {cfg.selection.ratio:.0%}"
