"""The verl column of the conformance matrix (docs/semantics.md section 8).

The verl plugin's loss on verl's default (V1) trainer layout, built with verl's own functions,
equals the reference written from the paper's equations for every preset x {GRPO, DAPO} it
accepts, or refuses the preset with a clear error; and for every objective row verl offers
(tests/conformance/_objectives.py, its verl spelling ``row.verl``: loss_mode, clip ratios,
kl_loss_type), the paper preset under that objective equals the row's reference
(tests/conformance/_objectives_verl.py). Runs in the verl environment (.venv-verl); skipped
where verl is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from file_modules import load_module

pytest.importorskip("verl.workers.utils.losses", reason="verl is installed in .venv-verl only")

HERE = Path(__file__).resolve().parent
matrix = load_module(HERE / "_matrix.py", "_matrix", register=True)
objectives = load_module(HERE / "_objectives.py", "_objectives", register=True, reuse=True)
VERL_ROWS = [row.name for row in objectives.ROWS if row.verl is not None]


@pytest.mark.parametrize("algorithm", matrix.ALGORITHMS)
@pytest.mark.parametrize("preset", matrix.PRESETS)
def test_verl_matches_the_reference_or_refuses(preset, algorithm):
    cell = matrix.verl(preset, algorithm)
    want = matrix.reference(preset, algorithm)
    status = matrix.compare(cell, want, matrix.TOLERANCE["verl"])
    assert status == matrix.documented_statuses()[(preset, algorithm, "verl")], status
    if cell.refused is not None:
        assert "verl" in cell.refused or "unit" in cell.refused or "scope" in cell.refused


@pytest.mark.parametrize("name", VERL_ROWS)
def test_verl_objective_row_matches_the_reference_or_refuses(name):
    row = objectives.ROW_BY_NAME[name]
    status = objectives.status(row, "verl")
    assert status == objectives.documented_statuses()[(name, "verl")], status


def test_the_rows_verl_does_not_offer_are_documented_so():
    for row in objectives.ROWS:
        if row.verl is None:
            assert objectives.documented_statuses()[(row.name, "verl")] == objectives.NOT_OFFERED
