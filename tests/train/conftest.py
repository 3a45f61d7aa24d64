"""Fixtures the trainer tests share."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_tiny", Path(__file__).with_name("_tiny.py"))
_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tiny)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model folder in the embedded model's shape where it matters (GPT-2 with
    64 learned positions), one per test module (tests/train/_tiny.py)."""
    return _tiny.save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
