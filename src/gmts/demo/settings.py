"""What a demo runs: its recipe (``demo.yaml``, beside this file), its methods (one
``selection.score`` each) and the settings of one invocation (:class:`DemoSettings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def method_label(method: str, cfg: TrainConfig) -> str:
    """'all tokens', 'ETS top 20%', 'GMTS top 20%' (the ratio is the recipe's)."""
    if METHODS[method] == "none":
        return method
    side = "top" if cfg.selection.largest else "bottom"
    return f"{method} {side} {cfg.selection.ratio:.0%}"
