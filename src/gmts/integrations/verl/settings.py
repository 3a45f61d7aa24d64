"""GMTS settings for verl and how they reach verl's Ray workers (one environment variable).

verl builds its workers in Ray processes from its own Hydra config, which has no place for
our fields. The launcher (``python -m gmts.integrations.verl``) therefore takes ``gmts.*``
overrides, stores them as JSON in ``GMTS_VERL_SELECTION`` and forwards that variable to every
Ray worker through ``ray_kwargs.ray_init.runtime_env.env_vars``. In each worker the plugin reads
it back with :meth:`GMTSVerlSettings.from_env`. No variable: the plugin changes nothing.

The ``gmts.*`` keys are generated from the dataclasses (:func:`verl_keys`: every
``SelectionConfig`` field, ``gmts.preset`` and ``gmts.score_inputs``, with their help text);
what the plugin cannot run is declared once (:data:`VERL_SUPPORT`) and refused by the core's
:meth:`~gmts.core.support.EngineSupport.check`, in the words every engine uses.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gmts.configuration import DialectField, build, dialect_fields, parse_value
from gmts.core.config import SELECTION_PRESETS, SelectionConfig
from gmts.core.scores import score_requirements
from gmts.core.support import GROUPS_SPLIT, EngineSupport, Unsupported

__all__ = [
    "ENGINE",
    "ENV_VAR",
    "PREFIX",
    "SCORE_INPUTS",
    "VERL_SUPPORT",
    "GMTSVerlSettings",
    "verl_keys",
]

ENV_VAR = "GMTS_VERL_SELECTION"
SCORE_INPUTS = ("current", "rollout")
ENGINE = "the verl plugin"
PREFIX = "gmts."

_UNSUPPORTED = (
    Unsupported(
        "unit",
        ("micro-batch",),
        "it selects on each whole mini-batch before verl splits it (verl's micro-batches "
        "differ in size across ranks)",
        ("mini-batch",),
    ),
    Unsupported("scope", ("group",), GROUPS_SPLIT, ("batch", "sequence")),
    Unsupported("normalize", ("per-group",), GROUPS_SPLIT, ("selected", "all"), always=True),
)
_NO_LOGIT_GRAD = "verl's forward gives log-probs and entropies, never logit-gradient norms"
VERL_SUPPORT = {
    "current": EngineSupport(ENGINE, PREFIX, _UNSUPPORTED, {"logit_grad_norm": _NO_LOGIT_GRAD}),
    "rollout": EngineSupport(
        ENGINE,
        PREFIX,
        _UNSUPPORTED,
        {
            "logit_grad_norm": _NO_LOGIT_GRAD,
            "entropy": "verl 0.9 drops the rollout-time entropies after the old-log-prob "
            "pass; use gmts.score_inputs=current (one extra no-grad pass)",
        },
    ),
}
"""What the verl plugin cannot run of a SelectionConfig, by ``score_inputs`` (one declaration)."""

_SCORE_INPUTS_HELP = (
    "Where the score's per-token quantities come from. current (default, exact): one extra "
    "no-grad forward pass over each mini-batch with the parameters that mini-batch is about to "
    "update, so omega uses the true ratio r, clip indicator I(r, A) and KL term, and the "
    "entropy is the current one. rollout: no extra pass; the current log-probs are the batch's "
    "old_log_probs (r = 1, I = 1: omega = A + beta * (pi_ref / pi_old - 1)), exact for the "
    "first mini-batch of each step, stale for later ones; only for scores without entropy "
    "(omega, random), because verl 0.9 drops the rollout-time entropies before the update."
)


@dataclass(frozen=True)
class GMTSVerlSettings:
    """Token selection inside verl.

    Attributes:
        selection: the core ``SelectionConfig`` (every ``gmts.<field>`` key).
        score_inputs: where the score's per-token quantities come from (its help below).
    """

    selection: SelectionConfig = field(
        default_factory=SelectionConfig,
        metadata={"help": "The core SelectionConfig: every gmts.<field> key."},
    )
    score_inputs: str = field(default="current", metadata={"help": _SCORE_INPUTS_HELP})

    def __post_init__(self) -> None:
        if not isinstance(self.selection, SelectionConfig):
            raise ValueError(
                f"selection must be a SelectionConfig, got {type(self.selection).__name__}"
            )
        if self.score_inputs not in SCORE_INPUTS:
            raise ValueError(
                f"score_inputs must be one of {list(SCORE_INPUTS)}, got {self.score_inputs!r}"
            )
        VERL_SUPPORT[self.score_inputs].check(self.selection)

    @property
    def needs_omega(self) -> bool:
        """Whether the selection's score reads omega (gmts, omega)."""
        return self.selection.enabled and "omega" in score_requirements(self.selection.score)

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """Flat dict: the selection fields plus ``score_inputs``."""
        return {**asdict(self.selection), "score_inputs": self.score_inputs}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> GMTSVerlSettings:
        """Inverse of :meth:`to_dict` (``preset`` also works); unknown keys raise ValueError
        naming them. Values are checked against the fields' types (:mod:`gmts.configuration`);
        ``preset`` (paper, trl, reference-code) starts from ``SelectionConfig.preset``, the
        other keys override it."""
        values = dict(values)
        keys = {item.key[len(PREFIX) :] for item in verl_keys()}
        unknown = set(values) - keys
        if unknown:
            raise ValueError(f"unknown gmts settings {sorted(unknown)}; valid: {sorted(keys)}")
        score_inputs = values.pop("score_inputs", "current")
        selection = build(SelectionConfig, values, PREFIX.rstrip("."))
        return cls(selection=selection, score_inputs=score_inputs)

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> GMTSVerlSettings:
        """Build from command-line strings (``ratio="0.2"``, ``largest="false"``), each parsed
        as YAML (:func:`gmts.configuration.parse_value`), then as :meth:`from_dict`."""
        return cls.from_dict({key: parse_value(str(raw)) for key, raw in values.items()})

    def to_env_value(self, *, encoded: bool = False) -> str:
        """Compact JSON for ``GMTS_VERL_SELECTION``.

        ``encoded=True`` gives URL-safe base64 of that JSON without padding (only letters,
        digits, ``-`` and ``_``), which passes through a Hydra command-line override unquoted.
        """
        text = json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)
        if not encoded:
            return text
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GMTSVerlSettings | None:
        """Settings from ``GMTS_VERL_SELECTION`` (JSON or its base64 form), None when unset."""
        environ = os.environ if environ is None else environ
        raw = environ.get(ENV_VAR, "").strip()
        if not raw:
            return None
        try:
            if not raw.startswith("{"):  # the base64 form of to_env_value(encoded=True)
                raw = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
            values = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{ENV_VAR} is neither JSON nor base64 JSON: {raw!r}") from err
        if not isinstance(values, dict):
            raise ValueError(f"{ENV_VAR} must hold a JSON object, got {raw!r}")
        return cls.from_dict(values)


def verl_keys() -> list[DialectField]:
    """The launcher's ``gmts.*`` keys: every SelectionConfig field (with its help and the
    plugin's refusals), ``gmts.preset`` and ``gmts.score_inputs``."""
    notes = VERL_SUPPORT["current"].notes()
    preset = DialectField(
        key=f"{PREFIX}preset",
        field="preset",
        type=str | None,
        default=None,
        help=f"A selection preset ({', '.join(SELECTION_PRESETS)}: SelectionConfig.preset); "
        "the other gmts.* keys override it.",
    )
    own = [item for item in dialect_fields(GMTSVerlSettings, PREFIX) if item.field != "selection"]
    return [*dialect_fields(SelectionConfig, PREFIX, notes), preset, *own]
