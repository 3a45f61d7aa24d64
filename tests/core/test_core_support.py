"""What an engine cannot run: one declaration per engine (``EngineSupport``), refused by one
function in one form, the shared reasons in the same words for every engine."""

from __future__ import annotations

import pytest

import gmts
from gmts.core.support import GROUPS_SPLIT, EngineSupport, Unsupported, refuse

ENGINE = EngineSupport(
    engine="the toy engine",
    prefix="toy.",
    unsupported=(
        Unsupported("scope", ("group",), GROUPS_SPLIT, ("batch", "sequence")),
        Unsupported("normalize", ("per-group",), GROUPS_SPLIT, ("selected", "all"), always=True),
    ),
    missing={"logit_grad_norm": "its forward gives log-probs and entropies only"},
)


def test_problems_name_the_setting_in_the_engines_spelling_with_reason_and_alternatives():
    selection = gmts.SelectionConfig(scope="group", normalize="per-group", score="logit-grad")
    problems = ENGINE.problems(selection)
    assert problems == [
        f"toy.scope='group' is not available in the toy engine: {GROUPS_SPLIT}; use 'batch' "
        "or 'sequence'",
        f"toy.normalize='per-group' is not available in the toy engine: {GROUPS_SPLIT}; use "
        "'selected' or 'all'",
        "toy.score='logit-grad' reads logit_grad_norm: its forward gives log-probs and "
        "entropies only; scores the toy engine can run: "
        + ", ".join(s for s in gmts.available_scores() if s != "logit-grad"),
    ]
    assert ENGINE.problems(gmts.SelectionConfig()) == []


def test_a_refusal_acts_only_where_the_setting_has_an_effect():
    """scope means nothing without a selection; normalize='per-group' divides the loss even
    without one, so it is refused always."""
    none = gmts.SelectionConfig(score="none", scope="group", normalize="per-group")
    assert [p.split("=")[0] for p in ENGINE.problems(none)] == ["toy.normalize"]


def test_check_raises_every_problem_in_one_form():
    with pytest.raises(ValueError) as err:
        ENGINE.check(gmts.SelectionConfig(scope="group"), more=["its own option x=1: why"])
    lines = str(err.value).splitlines()
    assert lines[0] == "the toy engine cannot honour these settings:"
    assert lines[1] == "- its own option x=1: why"
    assert lines[2].startswith("- toy.scope='group'")
    ENGINE.check(gmts.SelectionConfig())  # nothing to refuse: no error
    refuse("x", [])


def test_declarations_are_checked_and_notes_name_the_refused_values():
    with pytest.raises(ValueError, match="unknown SelectionConfig fields"):
        EngineSupport("e", "e_", (Unsupported("scop", ("group",), "r", ("batch",)),))
    with pytest.raises(ValueError, match="not statistics"):
        EngineSupport("e", "e_", missing={"mask": "r"})
    notes = ENGINE.notes({"unit": "Its unit."})
    assert notes == {
        "unit": "Its unit.",
        "scope": "Not in the toy engine: 'group'.",
        "normalize": "Not in the toy engine: 'per-group'.",
    }
