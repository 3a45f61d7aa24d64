"""Helpers shared by the vLLM tests (not a test module).

vLLM's CPU attention has kernels for head sizes of 32 and up, not for the 16 of the trainer
tests' tiny model (tests/train/_tiny.py), so these tests use a tiny GPT-2 of width 64 with 2
heads. The configs are the trainer tests' small ones (``_tiny.small_config``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

TRAIN_TESTS = Path(__file__).resolve().parents[1] / "train"
_spec = importlib.util.spec_from_file_location("_tiny", TRAIN_TESTS / "_tiny.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


def save_vllm_tiny_model(path: Path, seed: int = 0) -> Path:
    """A random 2-layer GPT-2 (width 64, 2 heads of 32) with the embedded tokenizer."""
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=64, num_heads=2, seed=seed))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


SKIP_REASON = "vllm is not installed here (bash scripts/setup.sh vllm builds .venv-vllm)"
