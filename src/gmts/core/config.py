"""SelectionConfig: which tokens the policy loss trains on, and how the loss is normalised."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from gmts.core._config_utils import check_choice, from_preset
from gmts.core._config_utils import help_meta as _help
from gmts.core.objectives import KL_TOKEN_MODES, NORMALIZE_MODES
from gmts.core.scores import available_scores
from gmts.core.selection import SCOPES

__all__ = ["SelectionConfig", "SELECTION_PRESETS"]


@dataclass(frozen=True)
class SelectionConfig:
    """Token selection and loss normalisation (defaults: the paper's eq. 2 with GMTS at 20%)."""

    score: str = field(
        default="gmts",
        metadata=_help(
            "Token score: gmts (|entropy*omega|, the paper), entropy (ETS), omega, logit-grad, "
            "random, or none (train on every token: plain GRPO/DAPO)."
        ),
    )
    ratio: float = field(
        default=0.2,
        metadata=_help(
            "rho: fraction of valid tokens kept per scope unit, in (0, 1]; k = ceil(rho*N)."
        ),
    )
    largest: bool = field(
        default=True,
        metadata=_help("Keep the highest scores (top-rho); False keeps the lowest ('bottom')."),
    )
    scope: str = field(
        default="batch",
        metadata=_help(
            "Where the top-rho is taken: batch (all tokens of the mini-batch across ranks, eq. 2), "
            "group (per question group, the authors' code) or sequence (per answer)."
        ),
    )
    normalize: str = field(
        default="selected",
        metadata=_help(
            "Loss divisor: selected (1/S_rho, eq. 2) or all (all valid tokens, as the authors' "
            "code and TRL)."
        ),
    )
    kl_tokens: str = field(
        default="selected",
        metadata=_help(
            "Tokens that carry the KL penalty: selected (KL inside l, eq. 2) or all (every valid "
            "token, as every existing implementation)."
        ),
    )
    seed: int = field(
        default=0,
        metadata=_help("Seed of the 'random' score (its generator is seeded with seed + step)."),
    )

    def __post_init__(self) -> None:
        valid_scores = [*available_scores(), "none"]
        if self.score not in valid_scores:
            raise ValueError(f"unknown score {self.score!r}; valid scores: {valid_scores}")
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, numbers.Real)
            or not (math.isfinite(self.ratio) and 0 < self.ratio <= 1)
        ):
            raise ValueError(f"ratio must be a number in (0, 1], got {self.ratio!r}")
        if not isinstance(self.largest, bool):
            raise ValueError(f"largest must be a bool, got {self.largest!r}")
        check_choice("scope", self.scope, SCOPES)
        check_choice("normalize", self.normalize, NORMALIZE_MODES)
        check_choice("kl_tokens", self.kl_tokens, KL_TOKEN_MODES)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    @property
    def enabled(self) -> bool:
        """False for score='none' (no selection: every valid token is trained on)."""
        return self.score != "none"

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SelectionConfig:
        """Named presets (see docs/semantics.md), with field overrides:

        - ``"paper"``: batch scope, normalise by the selected tokens, KL on the selected tokens
          (the paper's eq. 2; the default).
        - ``"reference-code"``: group scope, normalise by all valid tokens, KL on all tokens
          (the authors' standalone GRPO-Zero code).
        - ``"trl"``: batch scope, normalise by all valid tokens, KL on all tokens (TRL's
          top_entropy_quantile, but with an exact count).
        """
        return from_preset(cls, SELECTION_PRESETS, "selection", name, overrides)


SELECTION_PRESETS: dict[str, SelectionConfig] = {
    "paper": SelectionConfig(scope="batch", normalize="selected", kl_tokens="selected"),
    "reference-code": SelectionConfig(scope="group", normalize="all", kl_tokens="all"),
    "trl": SelectionConfig(scope="batch", normalize="all", kl_tokens="all"),
}
