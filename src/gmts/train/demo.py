"""``gmts demo``: all tokens vs ETS top 20% vs GMTS top 20% under DAPO, from one warm start.

The three policies start from the same cached warm start (gmts.train.warmstart), see the same
questions in the same order (same seed) and get the same budget (steps x questions x samples).
Before/after numbers are held-out average@16 and pass@16 on the task's reserved questions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gmts.core.config import SelectionConfig
from gmts.train.config import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
)

METHODS = {"all tokens": "none", "ETS top 20%": "entropy", "GMTS top 20%": "gmts"}


@dataclass(frozen=True)
class DemoSettings:
    """The demo's budget; the defaults are what the README quotes."""

    task: str = "addition"
    steps: int = 100
    sampling_rounds: int = 1
    questions: int = 32
    group_size: int = 8
    lr: float = 2e-4
    ratio: float = 0.2
    eval_questions: int = 200
    eval_samples: int = 16
    seed: int = 0
    output_dir: str = "runs/demo"
    cache_dir: str | None = None
    methods: tuple[str, ...] = tuple(METHODS)

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "sampling_rounds",
            "questions",
            "group_size",
            "eval_questions",
            "eval_samples",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown demo methods {unknown}; valid: {list(METHODS)}")


@dataclass
class DemoRow:
    """One policy's line of the demo table (held-out metrics keyed ``average@k``/``pass@k``)."""

    method: str
    before: dict[str, float]
    after: dict[str, float]
    step_time_s: float
    selected_fraction: float
    train_time_s: float


@dataclass
class DemoResult:
    """The settings, one row per method, and the wall-clock times of the whole demo."""

    settings: DemoSettings
    warm_start_s: float
    rows: list[DemoRow] = field(default_factory=list)
    total_s: float = 0.0


def demo_config(
    settings: DemoSettings, model_path: str, method: str, progress: bool
) -> TrainConfig:
    """The TrainConfig of one demo policy (also what ``configs/demo.yaml`` holds)."""
    score = METHODS[method]
    return TrainConfig(
        algorithm="dapo",
        seed=settings.seed,
        model=ModelConfig(path=model_path),
        data=DataConfig(
            task=settings.task,
            eval_questions=settings.eval_questions,
            eval_samples=settings.eval_samples,
            eval_before=False,
        ),
        rollout=RolloutConfig(
            questions_per_batch=settings.questions,
            group_size=settings.group_size,
            max_sampling_rounds=settings.sampling_rounds,
        ),
        selection=SelectionConfig(score=score, ratio=settings.ratio),
        optim=OptimConfig(
            steps=settings.steps,
            lr=settings.lr,
            betas=(0.9, 0.99),
            grad_clip=1.0,
            micro_batch_size=settings.questions * settings.group_size,
        ),
        checkpoint=CheckpointConfig(save_final=False),
        logging=LoggingConfig(output_dir=str(Path(settings.output_dir) / score), progress=progress),
    )


def run_demo(settings: DemoSettings | None = None, *, progress: bool = True) -> DemoResult:
    """Warm start (cached), evaluate it, train the three policies, evaluate each."""
    import torch

    from gmts.train.trainer import Trainer
    from gmts.train.warmstart import warm_start

    settings = settings or DemoSettings()
    t0 = time.perf_counter()
    warm = warm_start(
        settings.task,
        cache_dir=settings.cache_dir,
        seed=settings.seed,
        progress=progress,
    )
    result = DemoResult(settings=settings, warm_start_s=time.perf_counter() - t0)
    before = None
    for method in settings.methods:
        cfg = demo_config(settings, str(warm), method, progress)
        trainer = Trainer(cfg)
        if before is None:  # the same warm start for every method: evaluate it once
            before = trainer.evaluate() or {}  # measured exactly as the trainer's eval_after
        t1 = time.perf_counter()
        run = trainer.run()
        hist = run.history
        result.rows.append(
            DemoRow(
                method=method,
                before=before,
                after=run.eval_after or {},
                step_time_s=sum(h["time/step_s"] for h in hist) / max(len(hist), 1),
                selected_fraction=sum(h.get("select/fraction", 1.0) for h in hist)
                / max(len(hist), 1),
                train_time_s=time.perf_counter() - t1,
            )
        )
        del trainer
        torch.set_grad_enabled(True)
    result.total_s = time.perf_counter() - t0
    return result


def format_table(result: DemoResult) -> str:
    """The fixed-format table the README quotes."""
    s = result.settings
    k = s.eval_samples
    head = (
        f"DAPO on '{s.task}': {s.steps} steps x {s.questions} questions x {s.group_size} "
        f"samples, lr {s.lr:g}, sampling rounds {s.sampling_rounds}, seed {s.seed}; "
        f"held-out {s.eval_questions} questions x {k}"
    )
    cols = (
        f"{'method':<14} {'avg@' + str(k) + ' before':>15} {'after':>7} {'gain':>7} "
        f"{'pass@' + str(k) + ' before':>16} {'after':>7} {'s/step':>7} {'selected':>9}"
    )
    lines = [head, cols, "-" * len(cols)]
    for r in result.rows:
        a0, a1 = r.before.get(f"average@{k}", float("nan")), r.after.get(f"average@{k}", 0.0)
        p0, p1 = r.before.get(f"pass@{k}", float("nan")), r.after.get(f"pass@{k}", 0.0)
        lines.append(
            f"{r.method:<14} {a0:>15.3f} {a1:>7.3f} {100 * (a1 - a0):>+6.1f}p "
            f"{p0:>16.3f} {p1:>7.3f} {r.step_time_s:>7.3f} {r.selected_fraction:>9.3f}"
        )
    lines.append(
        f"warm start {result.warm_start_s:.0f} s (cached after the first run); "
        f"total {result.total_s:.0f} s"
    )
    return "\n".join(lines)
