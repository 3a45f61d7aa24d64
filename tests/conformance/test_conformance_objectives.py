"""GMTS under every objective the engines offer computes the same loss on every engine.

The objective rows of the conformance matrix (docs/semantics.md section 8): the paper preset
(GMTS, 30%, eq. 2) under each objective, one fixed batch; the core composition, the
standalone trainer's update and the TRL integration equal a reference written the way the
engine that offers the objective writes it (tests/conformance/_objectives.py), refuse with a
reason, or do not offer the objective ("—"); the page shows exactly what this test finds.
The verl column runs where verl is installed (test_conformance_verl.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from file_modules import load_module

HERE = Path(__file__).resolve().parent
objectives = load_module(HERE / "_objectives.py", "_objectives", register=True, reuse=True)

CELLS = [(row.name, e) for row in objectives.ROWS for e in ("core", "trainer", "trl")]


@pytest.fixture(scope="module")
def references():
    return {row.name: objectives.reference(row) for row in objectives.ROWS}


@pytest.mark.parametrize("name,engine", CELLS)
def test_objective_row_matches_the_reference_or_refuses(name, engine, references):
    if engine == "trl":
        pytest.importorskip("trl")
    row = objectives.ROW_BY_NAME[name]
    status = objectives.status(row, engine, references[name])
    assert status == objectives.documented_statuses()[(name, engine)], status


def test_the_documented_objective_rows_are_complete_and_never_diverge():
    for module in ("_objectives_trl", "_objectives_verl"):  # both engine columns are written
        assert objectives.engine_column(module), f"tests/conformance/{module}.py has no column"
    statuses = objectives.documented_statuses()
    assert len(statuses) == len(objectives.ROWS) * len(objectives.ENGINES)
    assert set(statuses.values()) <= {"equal", "refused", objectives.NOT_OFFERED}, statuses
    for row in objectives.ROWS:  # every core and trainer cell is exact
        assert statuses[(row.name, "core")] == statuses[(row.name, "trainer")] == "equal"


def test_every_registered_objective_has_a_row():
    import gmts

    names = {objectives.objective(row).name for row in objectives.ROWS}
    assert names == set(gmts.available_objectives())
    levels = {objectives.objective(row).ratio_level for row in objectives.ROWS}
    assert levels == {"token", "sequence", "sequence-token"}


def test_the_batch_makes_every_row_discriminate():
    """Each row's selection differs from plain ETS's or its clip acts: the rows test omega."""
    import torch

    import gmts

    batch = objectives.objective_batch()
    ets = objectives.matrix.reference_selection(
        batch, gmts.SelectionConfig(score="entropy", ratio=0.3), "dapo"
    )
    for row in objectives.ROWS:
        selected = objectives.reference_selection(row, batch)
        assert int(selected.sum()) > 0
        assert not torch.equal(selected, ets), row.name
        obj = objectives.objective(row)
        ref = batch.ref_logprobs if obj.kl_coef else None
        _, sums = gmts.policy_loss(
            batch.logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.mask,
            gmts.LossConfig(obj),
            ref_logprobs=ref,
        )
        metrics = sums.metrics()
        if obj.name in ("ppo", "cispo", "gmpo", "dppo-tv", "dppo-kl"):  # their clips act here
            assert metrics["clip_fraction"] > 0, row.name
        if obj.dual_clip is not None:
            assert metrics["dual_clip_fraction"] > 0, row.name
