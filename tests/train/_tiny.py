"""Helpers shared by the trainer tests (not a test module): a tiny saved model, a reward with
partial credit (so a random model gets non-zero advantages), small configs."""

from __future__ import annotations

from pathlib import Path

import torch

from gmts.train.config import load_config


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    from gmts.data.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.data.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_heads=2, seed=seed))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def partial_credit(completion: str, answer: str) -> float:
    """Fraction of answer characters matched position by position (graded, in [0, 1])."""
    return sum(a == b for a, b in zip(completion, answer)) / max(len(answer), 1)


def small_config(model_dir: Path, run_dir: Path, *overrides: str):
    base = [
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
    return load_config(None, [*base, *overrides])


def params_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
