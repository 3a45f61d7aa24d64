"""What an engine cannot run of a :class:`~gmts.core.config.SelectionConfig`: declared once per
engine, refused in one place, in the same words everywhere.

An engine (TRL's ``GMTSGRPOTrainer``, the verl plugin) declares an :class:`EngineSupport`: the
setting values it cannot honour, each with the reason in the engine's terms and the values to
use instead, and the model statistics it cannot feed a score (a score reading one is refused,
with the scores it can run). :meth:`EngineSupport.check` lists every problem of a selection,
plus the engine's own (options of the engine's config), and :func:`refuse` raises them as one
``ValueError``, before any model loads. The standalone trainer runs every setting and needs no
declaration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gmts.core.config import SelectionConfig
from gmts.core.scores import STATISTICS, available_scores, score_requirements

__all__ = ["GROUPS_SPLIT", "EngineSupport", "Unsupported", "refuse"]

GROUPS_SPLIT = (
    "the engine spreads a question group's answers over processes and micro- or mini-batches, "
    "and this needs every group whole in one batch on one process"
)
"""Why an engine that shuffles rows refuses the per-group settings (TRL and verl say it alike)."""


@dataclass(frozen=True)
class Unsupported:
    """Values of one SelectionConfig field that an engine cannot honour.

    Attributes:
        field: the SelectionConfig field.
        values: the refused values.
        reason: why, in the engine's terms.
        instead: the values to use.
        always: refused with score 'none' too (a setting that acts without a selection:
            ``normalize='per-group'``); otherwise only with a selection.
    """

    field: str
    values: tuple[Any, ...]
    reason: str
    instead: tuple[Any, ...]
    always: bool = False


@dataclass(frozen=True)
class EngineSupport:
    """One engine's declaration of what it cannot run.

    Attributes:
        engine: how messages name the engine (``"GMTSGRPOTrainer"``).
        prefix: how the engine spells a setting: ``prefix + field`` (``"gmts_"``, ``"gmts."``).
        unsupported: the refused values.
        missing: model statistics (``gmts.core.scores.STATISTICS``) the engine cannot feed a
            score, each with why.
    """

    engine: str
    prefix: str
    unsupported: tuple[Unsupported, ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = {f for f in SelectionConfig.__dataclass_fields__}
        unknown = {u.field for u in self.unsupported} - names
        if unknown:
            raise ValueError(f"unknown SelectionConfig fields {sorted(unknown)}")
        if set(self.missing) - STATISTICS:
            raise ValueError(
                f"missing: {sorted(set(self.missing) - STATISTICS)} are not statistics"
            )

    def key(self, name: str) -> str:
        """``name`` (a SelectionConfig field) as the engine spells it."""
        return f"{self.prefix}{name}"

    def notes(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Per SelectionConfig field, what the engine's help adds to the field's own: ``extra``
        (the engine's notes) and the values it refuses (for the generated dialects)."""
        notes = dict(extra or {})
        for item in self.unsupported:
            refused = " or ".join(repr(v) for v in item.values)
            notes[item.field] = (
                f"{notes.get(item.field, '')} Not in {self.engine}: {refused}.".strip()
            )
        return notes

    def runnable_scores(self) -> list[str]:
        """The registered scores whose inputs the engine can feed, sorted."""
        return [s for s in available_scores() if not score_requirements(s) & set(self.missing)]

    def problems(self, selection: SelectionConfig) -> list[str]:
        """Every setting of ``selection`` the engine cannot honour, one line each."""
        problems = []
        for item in self.unsupported:
            value = getattr(selection, item.field)
            if value in item.values and (item.always or selection.enabled):
                instead = " or ".join(repr(v) for v in item.instead)
                problems.append(
                    f"{self.key(item.field)}={value!r} is not available in {self.engine}: "
                    f"{item.reason}; use {instead}"
                )
        lacking = sorted(score_requirements(selection.score) & set(self.missing))
        for name in lacking:
            problems.append(
                f"{self.key('score')}={selection.score!r} reads {name}: {self.missing[name]}; "
                f"scores {self.engine} can run: {', '.join(self.runnable_scores())}"
            )
        return problems

    def check(self, selection: SelectionConfig, more: Sequence[str] = ()) -> None:
        """Raise :func:`refuse` for ``selection``'s problems and the engine's own ``more``."""
        refuse(self.engine, [*more, *self.problems(selection)])


def refuse(engine: str, problems: Sequence[str]) -> None:
    """Raise ``ValueError("<engine> cannot honour these settings:\\n- ...")`` listing every
    problem (nothing when there is none): the one form of every engine's refusal."""
    if problems:
        raise ValueError(f"{engine} cannot honour these settings:\n- " + "\n- ".join(problems))
