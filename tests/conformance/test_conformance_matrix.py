"""Every named semantics computes the same loss on every engine that accepts it.

The matrix (docs/semantics.md section 8): for each selection preset x {GRPO, DAPO}, the loss
and the gradient w.r.t. the log-probs of one fixed batch, computed by the core composition,
the standalone trainer's update and the TRL integration, equal a reference written from the
paper's equations (tests/conformance/_matrix.py), or the engine refuses the combination with a
clear error; the page shows exactly what this test finds. The verl column runs where verl is
installed (test_conformance_verl.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from file_modules import load_module

HERE = Path(__file__).resolve().parent
matrix = load_module(HERE / "_matrix.py", "_matrix", register=True)

documented_statuses = matrix.documented_statuses


CELLS = [
    (p, a, e) for p in matrix.PRESETS for a in matrix.ALGORITHMS for e in ("core", "trainer", "trl")
]


@pytest.fixture(scope="module")
def references() -> dict[tuple[str, str], object]:
    return {(p, a): matrix.reference(p, a) for p in matrix.PRESETS for a in matrix.ALGORITHMS}


@pytest.mark.parametrize("preset,algorithm,engine", CELLS)
def test_engine_matches_the_reference_or_refuses(preset, algorithm, engine, references):
    if engine == "trl":
        pytest.importorskip("trl")
    cell = matrix.ENGINE_FUNCTIONS[engine](preset, algorithm)
    status = matrix.compare(cell, references[(preset, algorithm)], matrix.TOLERANCE[engine])
    assert status == documented_statuses()[(preset, algorithm, engine)], status
    if cell.refused is not None:
        assert len(cell.refused) > 20  # a sentence that names the setting, not a bare code


def test_the_documented_matrix_has_no_divergence():
    statuses = documented_statuses()
    assert len(statuses) == len(matrix.PRESETS) * len(matrix.ALGORITHMS) * len(matrix.ENGINES)
    assert set(statuses.values()) <= {"equal", "refused"}, statuses


def test_the_fixed_batch_discriminates():
    """The batch exercises what the matrix is about: a tie straddling the cut, eq. 2 differing
    from a mean of per-row selected means under GRPO, clipped tokens, and none of verl's extra
    guards (dual clip 3, k3 clamp 10) active, so verl's objective equals the paper's here."""
    batch = matrix.fixed_batch()
    paper = matrix.selection("paper")
    selected = matrix.reference_selection(batch, paper, "dapo")
    (a, b) = matrix.TIE
    assert bool(selected[b]) and not bool(selected[a])  # equal scores: the first one taken
    sel = selected & batch.mask
    per_row = [int(n) for n in sel.sum(-1) if n > 0]
    assert max(per_row) > min(per_row)  # rows with different selected counts
    r = torch.exp(batch.logprobs - batch.old_logprobs)[batch.mask]
    assert bool((r > 1.28).any() or (r < 0.8).any())  # the clip is active somewhere
    assert float(r.max()) < 3.0
    x = (batch.ref_logprobs - batch.logprobs)[batch.mask]
    assert float((torch.exp(x) - x - 1).max()) < 10.0
    # the old GRPO + "selected" rule (mean over rows of per-row selected means) differs
    leaf = batch.logprobs.clone()
    eq2 = matrix.reference_loss(batch, leaf, paper, "grpo")
    s = _surrogate(batch, leaf)
    x = batch.ref_logprobs - leaf
    token = -(s) + matrix.BETA * (torch.exp(x) - x - 1)
    rows = [float((token[i] * sel[i]).sum() / sel[i].sum()) for i in range(6) if sel[i].any()]
    assert not math.isclose(float(eq2), sum(rows) / len(rows), rel_tol=1e-3)


def _surrogate(batch, logprobs):
    r = torch.exp(logprobs - batch.old_logprobs)
    adv = batch.advantages[:, None].expand_as(r)
    return torch.min(r * adv, torch.clamp(r, 0.8, 1.28) * adv)
