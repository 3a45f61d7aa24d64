"""The verl column of the conformance matrix (docs/semantics.md section 8).

The verl plugin's loss on verl's default (V1) trainer layout, built with verl's own functions,
equals the reference written from the paper's equations for every preset x {GRPO, DAPO} it
accepts, or refuses the preset with a clear error. Runs in the verl environment (.venv-verl);
skipped where verl is not installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl.workers.utils.losses", reason="verl is installed in .venv-verl only")

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_matrix", HERE / "_matrix.py")
matrix = importlib.util.module_from_spec(_spec)
sys.modules["_matrix"] = matrix  # dataclasses look their module up while it executes
_spec.loader.exec_module(matrix)


@pytest.mark.parametrize("algorithm", matrix.ALGORITHMS)
@pytest.mark.parametrize("preset", matrix.PRESETS)
def test_verl_matches_the_reference_or_refuses(preset, algorithm):
    cell = matrix.verl(preset, algorithm)
    want = matrix.reference(preset, algorithm)
    status = matrix.compare(cell, want, matrix.TOLERANCE["verl"])
    assert status == matrix.documented_statuses()[(preset, algorithm, "verl")], status
    if cell.refused is not None:
        assert "verl" in cell.refused or "unit" in cell.refused or "scope" in cell.refused
