"""The tiny-model training setup shared by the overhead, throughput and learning benchmarks.

The recipe is the demo's (``gmts/demo/demo.yaml``, read through ``gmts.demo.settings.demo_recipe``);
a benchmark changes only what it measures. The model is the embedded task's warm start
(``gmts.embedded.warmstart.warm_start``: a 0.4M parameter GPT-2 trained on noisy demonstrations,
cached on disk), so rewards are mixed and dynamic sampling does not spin; one warm start serves
every benchmark run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _recipe() -> Any:
    """The demo's TrainConfig (gmts/demo/demo.yaml): the one source of the tiny-model recipe."""
    from gmts.demo.settings import demo_recipe

    return demo_recipe()


TASK: str = _recipe().data.task


@dataclass(frozen=True)
class StepShape:
    """Batch of one training step: ``questions`` x ``group_size`` sampled answers (default: the
    demo recipe's)."""

    questions: int = field(default_factory=lambda: _recipe().rollout.questions_per_batch)
    group_size: int = field(default_factory=lambda: _recipe().rollout.group_size)

    def __post_init__(self) -> None:
        if self.questions < 1 or self.group_size < 1:
            raise ValueError(f"questions and group_size must be >= 1, got {self}")


def warm_model_path(seed: int | None = None) -> Path:
    """The cached warm start of the embedded task (trained on first use: minutes); ``seed``
    None: the recipe's.

    ``GMTS_BENCH_MODEL=<dir>`` replaces it with any local causal-LM directory (with tokenizer)
    whose vocabulary covers the task's characters.
    """
    import os

    from gmts.embedded.warmstart import warm_start

    override = os.environ.get("GMTS_BENCH_MODEL")
    if override:
        return Path(override)
    recipe = _recipe()
    return warm_start(TASK, seed=recipe.seed if seed is None else seed, progress=False)


def train_config(
    model_path: Path | str,
    output_dir: Path | str,
    *,
    algorithm: str | None = None,
    score: str = "none",
    ratio: float | None = None,
    largest: bool = True,
    shape: StepShape | None = None,
    steps: int = 1,
    lr: float | None = None,
    seed: int = 0,
    dynamic_sampling: bool | None = None,
    overlap_metrics: bool = False,
    eval_questions: int = 0,
    eval_samples: int | None = None,
    device: str = "cpu",
) -> Any:
    """The demo's ``TrainConfig`` with what a benchmark varies: None keeps the recipe's value
    (algorithm, ratio, lr, eval_samples); no intermediate evaluations, no progress bar, on CPU
    unless ``device`` says otherwise (bf16 parameters on a GPU, the paper's setting)."""
    from dataclasses import replace

    from gmts.demo.settings import demo_recipe

    shape = shape or StepShape()
    overrides = {
        "algorithm": algorithm,
        "selection.ratio": ratio,
        "optim.lr": lr,
        "data.eval_samples": eval_samples,
    }
    cfg = demo_recipe([f"{k}={v}" for k, v in overrides.items() if v is not None])
    return replace(
        cfg,
        seed=seed,
        threads=None,  # the benchmark runner sets the thread count
        model=replace(
            cfg.model,
            path=str(model_path),
            device=device,
            dtype="float32" if device == "cpu" else "bfloat16",
        ),
        data=replace(
            cfg.data,
            eval_questions=eval_questions,
            eval_before=eval_questions > 0,
            eval_every=0,
        ),
        rollout=replace(
            cfg.rollout,
            questions_per_batch=shape.questions,
            group_size=shape.group_size,
            dynamic_sampling=dynamic_sampling,
        ),
        selection=replace(cfg.selection, score=score, largest=largest),
        optim=replace(cfg.optim, steps=steps, micro_batch_size=shape.questions * shape.group_size),
        logging=replace(
            cfg.logging, output_dir=str(output_dir), progress=False, overlap_metrics=overlap_metrics
        ),
    )
