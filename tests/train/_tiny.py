"""Helpers shared by the trainer tests (not a test module): a tiny saved model, a reward with
partial credit (so a random model gets non-zero advantages), small configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gmts.train.config import load_config


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_heads=2, seed=seed))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def partial_credit(completion: str, answer: str) -> float:
    """Fraction of answer characters matched position by position (graded, in [0, 1])."""
    return sum(a == b for a, b in zip(completion, answer)) / max(len(answer), 1)


def small_overrides(model_dir: Path, run_dir: Path) -> list[str]:
    """The trainer tests' small run, as ``section.field=value`` items (``gmts train``'s)."""
    return [
        f"model.path={model_dir}",
        f"logging.output_dir={run_dir}",
        "logging.progress=false",
        "data.eval_questions=0",
        "rollout.questions_per_batch=4",
        "rollout.group_size=4",
        "optim.steps=2",
        "optim.lr=1e-3",
        "optim.micro_batch_size=8",
        "checkpoint.save_final=false",
    ]


def small_config(model_dir: Path, run_dir: Path, *overrides: str):
    return load_config(None, [*small_overrides(model_dir, run_dir), *overrides])


def rollout_batch(model: Any, tokenizer: Any, *, problem_seed: int, sample_seed: int) -> Any:
    """A ScoredBatch of 4 addition questions x 4 samples (9 new tokens) from ``model``, rewarded
    with :func:`partial_credit`, with the old log-probs/entropies (no grad) and no reference."""
    import random

    from gmts.core.advantages import group_advantages
    from gmts.embedded.tasks import get_task
    from gmts.sampling.rollout import generate_rollouts
    from gmts.train.batch import TrainBatch
    from gmts.train.scoring import TokenScorer

    problems = get_task("addition").sample(4, random.Random(problem_seed))
    roll = generate_rollouts(
        model, tokenizer, problems, num_samples=4, max_new_tokens=9, seed=sample_seed
    )
    rewards = torch.tensor([partial_credit(c, a) for c, a in zip(roll.completions, roll.answers)])
    batch = TrainBatch.from_rollout(roll, rewards, group_advantages(rewards, 4))
    return batch.scored(TokenScorer().no_grad(model, batch, micro_batch_size=16), None)


def params_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
