"""Fixtures the trainer tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model folder in the embedded model's shape where it matters (GPT-2 with
    64 learned positions), one per test module (tests/train/_tiny.py)."""
    return _tiny.save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
