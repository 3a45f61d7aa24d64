"""Token scores: a registry of functions with one signature, ``fn(inputs) -> (B, T)``.

Scores never carry gradients. Built-in names: ``"entropy"`` (ETS), ``"gmts"`` (|E * omega|,
the paper's delta), ``"random"`` (seeded control), ``"omega"`` (|omega|, ablation),
``"logit-grad"`` (|omega| * G, G the exact logit-gradient norm of Proposition 3.1), and the
condition rules ``"stapo"`` (STAPO's S2T mask, arXiv 2602.15620) and ``"rsi"`` (RSI-S's
interval of the relative surprisal index, arXiv 2606.31575).

A score is also how a new selection rule plugs in: its ``requires`` names what it reads of
:class:`ScoreInputs` (the statistics, the log-probs, the advantages), every engine fills exactly
those (:func:`gmts.select_for_update`), and an engine that cannot feed one refuses the score
when it is configured (:mod:`gmts.core.support`). A rule that keeps the tokens meeting a
condition is a 0/1 score registered with ``condition=True``: ``SelectionConfig`` then requires
``ratio=1`` and ``zero_scores="skip"`` (a top selection of every token, the zeros dropped), so
the selection is the condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from gmts._registry import Registry
from gmts.core.selection import score_quantile

__all__ = [
    "STATISTICS",
    "ScoreInputs",
    "ScoreFn",
    "Score",
    "register_score",
    "score_requirements",
    "get_score",
    "available_scores",
    "compute_scores",
    "is_condition",
    "score_help",
]


@dataclass(frozen=True)
class ScoreInputs:
    """What a score may read; every tensor ``(B, T)``. Fields a score does not need may be None.

    Attributes:
        entropy: per-token entropy E_t.
        omega: gradient coefficient from :func:`gmts.gradient_coefficient`.
        logit_grad_norm: G_t from :func:`gmts.token_statistics` (``logit_grad_norm=True``).
        mask: ``(B, T)`` bool response mask (gives the shape to scores that need nothing else).
        logprobs: the current policy's log-probs of the sampled tokens (detached).
        old_logprobs: the rollout policy's.
        ref_logprobs: the reference policy's (None without a KL term).
        advantages: the advantages, broadcast to ``(B, T)``.
        seed: seed of the random score's generator (callers pass config seed + step).
        process_group: the ranks the selection is global over (None: this process): a score
            that needs batch statistics (a mean, a covariance) all-reduces over it.
        selection: the ``SelectionConfig`` being applied: a rule's own parameters are its
            fields (None when a score is computed outside a selection).
    """

    entropy: torch.Tensor | None = None
    omega: torch.Tensor | None = None
    logit_grad_norm: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    seed: int = 0
    process_group: Any = None
    selection: Any = None


ScoreFn = Callable[[ScoreInputs], torch.Tensor]


@dataclass(frozen=True)
class Score:
    """A registered score: its function, the ScoreInputs fields it reads, one line of help,
    and whether it is a 0/1 condition (kept at ratio 1, zeros skipped)."""

    fn: ScoreFn
    requires: frozenset[str]
    help: str = ""
    condition: bool = False


_SCORES: Registry[Score] = Registry("score", reserved=("none",))
_INPUT_FIELDS = frozenset(f.name for f in fields(ScoreInputs)) - {
    "seed",
    "process_group",
    "selection",
}

STATISTICS = frozenset({"entropy", "omega", "logit_grad_norm"})
"""The ScoreInputs fields that come from a forward pass of the model (an engine may lack some;
the others, mask, log-probs and advantages, every engine has at its update)."""


def register_score(
    name: str,
    requires: set[str] | frozenset[str] = frozenset(),
    *,
    help: str = "",
    condition: bool = False,
) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator registering ``fn(inputs: ScoreInputs) -> (B, T)`` under ``name``.

    ``requires`` names the ScoreInputs fields the score reads (so callers compute only those);
    ``help`` is its line in ``SelectionConfig.score``'s help (the built-in scores') and in the
    engines' generated option help; ``condition``: the score is 1 on the tokens to keep and 0
    elsewhere (``SelectionConfig`` then requires ``ratio=1``, ``zero_scores='skip'``). A
    duplicate name raises ValueError.
    """
    unknown = set(requires) - _INPUT_FIELDS
    if unknown:
        raise ValueError(
            f"requires has unknown ScoreInputs fields {sorted(unknown)}; valid: {sorted(_INPUT_FIELDS)}"
        )

    def decorator(fn: ScoreFn) -> ScoreFn:
        _SCORES.add(name, Score(fn, frozenset(requires), help, condition))
        return fn

    return decorator


def score_help() -> str:
    """The registered scores with their help, in registration order (``name (help), ...``)."""
    return ", ".join(
        f"{name} ({_SCORES.get(name).help})" if _SCORES.get(name).help else name for name in _SCORES
    )


def available_scores() -> list[str]:
    """Registered score names, sorted."""
    return _SCORES.names()


def get_score(name: str) -> ScoreFn:
    """The score function called ``name``; unknown names raise ValueError listing valid ones."""
    return _SCORES.get(name).fn


def is_condition(name: str) -> bool:
    """Whether score ``name`` is a 0/1 condition (``register_score(condition=True)``)."""
    return name != "none" and _SCORES.get(name).condition


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


@register_score("gmts", requires={"entropy", "omega"}, help="|entropy*omega|, the paper")
def gmts_score(inputs: ScoreInputs) -> torch.Tensor:
    """GMTS: delta_t = |E_t * omega_t| (the paper's eq. 2 score)."""
    return (_t(inputs.entropy) * _t(inputs.omega)).abs()


@register_score("entropy", requires={"entropy"}, help="ETS")
def entropy_score(inputs: ScoreInputs) -> torch.Tensor:
    """ETS: the token's entropy E_t."""
    return _t(inputs.entropy)


@register_score("omega", requires={"omega"}, help="|omega|, ablation")
def omega_score(inputs: ScoreInputs) -> torch.Tensor:
    """Ablation: |omega_t| alone."""
    return _t(inputs.omega).abs()


@register_score(
    "logit-grad",
    requires={"omega", "logit_grad_norm"},
    help="|omega| times the logit-gradient norm, ablation",
)
def logit_grad_score(inputs: ScoreInputs) -> torch.Tensor:
    """|omega_t| * G_t: the exact norm of the token's loss gradient w.r.t. its logits."""
    return (_t(inputs.omega) * _t(inputs.logit_grad_norm)).abs()


@register_score("random", requires={"mask"}, help="uniform, a control")
def random_score(inputs: ScoreInputs) -> torch.Tensor:
    """Control: uniform [0, 1) scores from a CPU torch.Generator seeded with ``inputs.seed``
    (never the global RNG), so a seed gives the same scores on every device."""
    mask = _t(inputs.mask)
    generator = torch.Generator().manual_seed(int(inputs.seed))
    return torch.rand(tuple(mask.shape), generator=generator).to(mask.device)


# --------------------------------------------------------------------------------------------
# condition rules: 1 on the tokens kept, 0 elsewhere (SelectionConfig: ratio 1, zeros skipped)


def _selection(inputs: ScoreInputs, name: str) -> Any:
    if inputs.selection is None:
        raise ValueError(f"score {name!r} reads its parameters from ScoreInputs.selection")
    return inputs.selection


@register_score(
    "stapo",
    requires={"entropy", "logprobs", "advantages", "mask"},
    help="STAPO's S2T: 0 on the spurious tokens (A > 0, p < stapo_prob_threshold, entropy below "
    "the batch's stapo_entropy_quantile), 1 elsewhere; a condition",
    condition=True,
)
def stapo_score(inputs: ScoreInputs) -> torch.Tensor:
    """STAPO (arXiv 2602.15620): a token is spurious when ``A_t > 0``, ``pi(o_t) < tau_p`` and
    ``E_t < tau_h``, ``tau_h`` the ``stapo_entropy_quantile`` quantile of the valid tokens'
    entropies over the selection unit (all ranks); 0 there, 1 elsewhere."""
    selection = _selection(inputs, "stapo")
    mask, entropy = _t(inputs.mask).bool(), _t(inputs.entropy)
    tau_h = score_quantile(
        entropy, mask, selection.stapo_entropy_quantile, process_group=inputs.process_group
    )
    probability = torch.exp(_t(inputs.logprobs))
    spurious = (
        (_t(inputs.advantages) > 0)
        & (probability < selection.stapo_prob_threshold)
        & (entropy < tau_h)
    )  # (B, T); tau_h is nan for an empty batch: nothing is spurious
    return (~spurious).to(entropy.dtype)


@register_score(
    "rsi",
    requires={"entropy", "logprobs"},
    help="RSI-S: 1 where the relative surprisal index -log p / entropy lies in [rsi_low, "
    "rsi_high] (entropy > 0), 0 elsewhere; a condition",
    condition=True,
)
def rsi_score(inputs: ScoreInputs) -> torch.Tensor:
    """RSI-S (arXiv 2606.31575): keep the tokens whose relative surprisal index
    ``RSI_t = -log pi(o_t) / E_t`` lies in ``[rsi_low, rsi_high]``; compared without dividing,
    ``rsi_low E <= -log p <= rsi_high E``, and only where ``E_t > 0`` (a one-hot
    distribution has no RSI: its token is the redundant kind the rule drops)."""
    selection = _selection(inputs, "rsi")
    entropy, surprisal = _t(inputs.entropy), -_t(inputs.logprobs)
    kept = (
        (entropy > 0)
        & (surprisal >= selection.rsi_low * entropy)
        & (surprisal <= selection.rsi_high * entropy)
    )  # (B, T)
    return kept.to(entropy.dtype)
