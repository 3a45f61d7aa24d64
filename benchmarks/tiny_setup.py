"""The tiny-model training setup shared by the overhead, throughput and learning benchmarks.

The model is the embedded task's warm start (``gmts.train.warmstart.warm_start``: a 0.4M
parameter GPT-2 trained on noisy demonstrations, cached on disk), so rewards are mixed and
dynamic sampling does not spin; one warm start serves every benchmark run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK = "addition"


@dataclass(frozen=True)
class StepShape:
    """Batch of one training step: ``questions`` x ``group_size`` sampled answers."""

    questions: int = 32
    group_size: int = 8

    def __post_init__(self) -> None:
        if self.questions < 1 or self.group_size < 1:
            raise ValueError(f"questions and group_size must be >= 1, got {self}")


def warm_model_path(seed: int = 0) -> Path:
    """The cached warm start of the embedded task (trained on first use: ~1 min idle).

    ``GMTS_BENCH_MODEL=<dir>`` replaces it with any local causal-LM directory (with tokenizer)
    whose vocabulary covers the task's characters.
    """
    import os

    from gmts.train.warmstart import warm_start

    override = os.environ.get("GMTS_BENCH_MODEL")
    if override:
        return Path(override)

    return warm_start(TASK, seed=seed, progress=False)


def train_config(
    model_path: Path | str,
    output_dir: Path | str,
    *,
    algorithm: str = "dapo",
    score: str = "none",
    ratio: float = 0.2,
    largest: bool = True,
    shape: StepShape | None = None,
    steps: int = 1,
    lr: float = 2e-4,
    seed: int = 0,
    dynamic_sampling: bool | None = None,
    overlap_metrics: bool = False,
    eval_questions: int = 0,
    eval_samples: int = 16,
    device: str = "cpu",
) -> Any:
    """A ``TrainConfig`` for the tiny model (the demo's recipe unless overridden), on CPU
    unless ``device`` says otherwise."""
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

    shape = shape or StepShape()
    return TrainConfig(
        algorithm=algorithm,
        seed=seed,
        # bf16 parameters on a GPU (the paper's setting); float32 on the CPU
        model=ModelConfig(
            path=str(model_path),
            device=device,
            dtype="float32" if device == "cpu" else "bfloat16",
        ),
        data=DataConfig(
            task=TASK,
            eval_questions=eval_questions,
            eval_samples=eval_samples,
            eval_before=eval_questions > 0,
        ),
        rollout=RolloutConfig(
            questions_per_batch=shape.questions,
            group_size=shape.group_size,
            dynamic_sampling=dynamic_sampling,
        ),
        selection=SelectionConfig(score=score, ratio=ratio, largest=largest),
        optim=OptimConfig(
            steps=steps,
            lr=lr,
            betas=(0.9, 0.99),
            grad_clip=1.0,
            micro_batch_size=shape.questions * shape.group_size,
        ),
        checkpoint=CheckpointConfig(save_final=False),
        logging=LoggingConfig(
            output_dir=str(output_dir), progress=False, overlap_metrics=overlap_metrics
        ),
    )
