"""Token scores: a registry of functions with one signature, ``fn(inputs) -> (B, T)``.

Scores never carry gradients. Built-in names: ``"entropy"`` (ETS), ``"gmts"`` (|E * omega|,
the paper's delta), ``"random"`` (seeded control), ``"omega"`` (|omega|, ablation) and
``"logit-grad"`` (|omega| * G, G the exact logit-gradient norm of Proposition 3.1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from gmts._registry import Registry

__all__ = [
    "ScoreInputs",
    "ScoreFn",
    "Score",
    "register_score",
    "score_requirements",
    "get_score",
    "available_scores",
    "compute_scores",
]


@dataclass(frozen=True)
class ScoreInputs:
    """What a score may read; every tensor ``(B, T)``. Fields a score does not need may be None.

    Attributes:
        entropy: per-token entropy E_t.
        omega: gradient coefficient from :func:`gmts.gradient_coefficient`.
        logit_grad_norm: G_t from :func:`gmts.token_statistics` (``logit_grad_norm=True``).
        mask: ``(B, T)`` bool response mask (gives the shape to scores that need nothing else).
        seed: seed of the random score's generator (callers pass config seed + step).
    """

    entropy: torch.Tensor | None = None
    omega: torch.Tensor | None = None
    logit_grad_norm: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    seed: int = 0


ScoreFn = Callable[[ScoreInputs], torch.Tensor]


@dataclass(frozen=True)
class Score:
    """A registered score: its function and the ScoreInputs fields it reads."""

    fn: ScoreFn
    requires: frozenset[str]


_SCORES: Registry[Score] = Registry("score", reserved=("none",))
_INPUT_FIELDS = frozenset(f.name for f in fields(ScoreInputs)) - {"seed"}


def register_score(
    name: str, requires: set[str] | frozenset[str] = frozenset()
) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator registering ``fn(inputs: ScoreInputs) -> (B, T)`` under ``name``.

    ``requires`` names the ScoreInputs fields the score reads (so callers compute only those).
    A duplicate name raises ValueError.
    """
    unknown = set(requires) - _INPUT_FIELDS
    if unknown:
        raise ValueError(
            f"requires has unknown ScoreInputs fields {sorted(unknown)}; valid: {sorted(_INPUT_FIELDS)}"
        )

    def decorator(fn: ScoreFn) -> ScoreFn:
        _SCORES.add(name, Score(fn, frozenset(requires)))
        return fn

    return decorator


def available_scores() -> list[str]:
    """Registered score names, sorted."""
    return _SCORES.names()


def get_score(name: str) -> ScoreFn:
    """The score function called ``name``; unknown names raise ValueError listing valid ones."""
    return _SCORES.get(name).fn


def score_requirements(name: str) -> frozenset[str]:
    """The ScoreInputs fields score ``name`` reads (e.g. ``{"entropy", "omega"}`` for gmts), so
    callers compute only those; ``"none"`` (no selection) reads nothing."""
    return frozenset() if name == "none" else _SCORES.get(name).requires


def compute_scores(name: str, inputs: ScoreInputs) -> torch.Tensor:
    """Run score ``name`` on ``inputs``: ``(B, T)``, detached, no gradient.

    Raises ValueError if a required input is missing or the inputs disagree in shape.
    """
    score = _SCORES.get(name)
    missing = sorted(f for f in score.requires if getattr(inputs, f) is None)
    if missing:
        raise ValueError(f"score {name!r} needs ScoreInputs fields {missing}, which are None")
    shapes = {
        f: tuple(getattr(inputs, f).shape)
        for f in sorted(_INPUT_FIELDS)
        if getattr(inputs, f) is not None
    }
    if len(set(shapes.values())) > 1:
        raise ValueError(f"ScoreInputs tensors must share one (B, T) shape, got {shapes}")
    with torch.no_grad():
        out = score.fn(inputs)
    return out.detach()


def _t(x: torch.Tensor | None) -> torch.Tensor:
    """Detached, at least float32 (float64 stays float64)."""
    assert x is not None  # guaranteed by compute_scores' requirement check
    x = x.detach()
    return x if x.dtype == torch.float64 else x.float()


@register_score("entropy", requires={"entropy"})
def entropy_score(inputs: ScoreInputs) -> torch.Tensor:
    """ETS: the token's entropy E_t."""
    return _t(inputs.entropy)


@register_score("gmts", requires={"entropy", "omega"})
def gmts_score(inputs: ScoreInputs) -> torch.Tensor:
    """GMTS: delta_t = |E_t * omega_t| (the paper's eq. 2 score)."""
    return (_t(inputs.entropy) * _t(inputs.omega)).abs()


@register_score("omega", requires={"omega"})
def omega_score(inputs: ScoreInputs) -> torch.Tensor:
    """Ablation: |omega_t| alone."""
    return _t(inputs.omega).abs()


@register_score("logit-grad", requires={"omega", "logit_grad_norm"})
def logit_grad_score(inputs: ScoreInputs) -> torch.Tensor:
    """|omega_t| * G_t: the exact norm of the token's loss gradient w.r.t. its logits."""
    return (_t(inputs.omega) * _t(inputs.logit_grad_norm)).abs()


@register_score("random", requires={"mask"})
def random_score(inputs: ScoreInputs) -> torch.Tensor:
    """Control: uniform [0, 1) scores from a CPU torch.Generator seeded with ``inputs.seed``
    (never the global RNG), so a seed gives the same scores on every device."""
    mask = _t(inputs.mask)
    generator = torch.Generator().manual_seed(int(inputs.seed))
    return torch.rand(tuple(mask.shape), generator=generator).to(mask.device)
