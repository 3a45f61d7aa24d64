"""GMTS settings for verl and how they reach verl's Ray workers (one environment variable).

verl builds its workers in Ray processes from its own Hydra config, which has no place for
our fields. The launcher (``python -m gmts.integrations.verl``) therefore takes ``gmts.*``
overrides, stores them as JSON in ``GMTS_VERL_SELECTION`` and forwards that variable to every
Ray worker through ``ray_kwargs.ray_init.runtime_env.env_vars``. In each worker the plugin reads
it back with :meth:`GMTSVerlSettings.from_env`. No variable: the plugin changes nothing.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gmts.configuration import coerce, field_types, parse_value
from gmts.core.config import SelectionConfig
from gmts.core.scores import score_requirements

__all__ = ["ENV_VAR", "SCORE_INPUTS", "GMTSVerlSettings"]

ENV_VAR = "GMTS_VERL_SELECTION"
SCORE_INPUTS = ("current", "rollout")

# Scores verl can feed: it has log-probs and entropies, never per-token logit-gradient norms.
_VERL_SCORE_FIELDS = frozenset({"entropy", "omega"})


@dataclass(frozen=True)
class GMTSVerlSettings:
    """Token selection inside verl.

    Attributes:
        selection: the core ``SelectionConfig`` (score, ratio, largest, scope, normalize,
            kl_tokens, seed).
        score_inputs: where the score's per-token quantities come from.
            ``"current"`` (default, exact): one extra no-grad forward pass over each mini-batch
            with the parameters that mini-batch is about to update, so omega uses the true
            ratio r, clip indicator I(r, A) and KL term, and the entropy is the current one.
            ``"rollout"``: no extra pass; omega from the batch's ``old_log_probs`` (r = 1,
            I = 1: omega = A + beta * (pi_ref / pi_old - 1)). Exact for the first mini-batch of
            each step, stale for later ones. Only for scores without entropy ('omega',
            'random'), because verl 0.9 drops the rollout-time entropies before the update.
    """

    selection: SelectionConfig = field(default_factory=SelectionConfig)
    score_inputs: str = "current"

    def __post_init__(self) -> None:
        if not isinstance(self.selection, SelectionConfig):
            raise ValueError(
                f"selection must be a SelectionConfig, got {type(self.selection).__name__}"
            )
        if self.score_inputs not in SCORE_INPUTS:
            raise ValueError(
                f"score_inputs must be one of {list(SCORE_INPUTS)}, got {self.score_inputs!r}"
            )
        if not self.selection.enabled:
            return
        if self.selection.unit != "mini-batch":
            raise ValueError(
                f"unit={self.selection.unit!r}: the verl plugin selects on each whole mini-batch "
                "before verl splits it (its micro-batches differ in size across ranks); use "
                "unit=mini-batch"
            )
        needs = score_requirements(self.selection.score)
        if not needs <= _VERL_SCORE_FIELDS:
            raise ValueError(
                f"score {self.selection.score!r} needs {sorted(needs - _VERL_SCORE_FIELDS)}, which "
                "verl does not compute; use gmts, entropy, omega or random"
            )
        if self.score_inputs == "rollout" and "entropy" in needs:
            raise ValueError(
                f"score {self.selection.score!r} needs entropies, which verl 0.9 drops after the "
                "old-log-prob pass; use score_inputs='current' (one extra no-grad pass)"
            )
        if self.selection.normalize == "per-group":
            raise ValueError(
                "normalize='per-group' (the reference-code preset) divides each question group "
                "by its own token count, so every group must be whole in one mini-batch on one "
                "rank; verl spreads a group's answers over data-parallel ranks and mini-batches: "
                "use normalize='selected' or 'all'"
            )
        if self.selection.scope == "group":
            raise ValueError(
                "scope='group' is not available in verl: a question group's answers are spread "
                "over data-parallel ranks and mini-batches; use 'batch' or 'sequence'"
            )

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
        """Inverse of :meth:`to_dict`; unknown keys raise ValueError naming them."""
        selection_names = {f.name for f in fields(SelectionConfig)}
        unknown = set(values) - selection_names - {"score_inputs"}
        if unknown:
            raise ValueError(
                f"unknown gmts settings {sorted(unknown)}; valid: "
                f"{sorted(selection_names | {'score_inputs'})}"
            )
        selection = SelectionConfig(**{k: v for k, v in values.items() if k in selection_names})
        return cls(selection=selection, score_inputs=values.get("score_inputs", "current"))

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> GMTSVerlSettings:
        """Build from command-line strings (``ratio="0.2"``, ``largest="false"``), each parsed
        as YAML and checked against its field's type (:mod:`gmts.configuration`).

        ``preset`` (paper, trl, reference-code) starts from ``SelectionConfig.preset``; the
        other keys override it.
        """
        hints = field_types(SelectionConfig)
        values = dict(values)
        preset = values.pop("preset", None)
        parsed: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in hints:
                continue  # from_dict names unknown keys
            parsed[key] = coerce(parse_value(str(raw)), hints[key], f"gmts.{key}")
        if preset is not None:  # presets may depend on the score
            score = parsed.get("score", SelectionConfig().score)
            parsed = asdict(SelectionConfig.preset(str(preset), score=score)) | parsed
        unknown = {k: v for k, v in values.items() if k not in hints}
        return cls.from_dict(parsed | unknown)

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
