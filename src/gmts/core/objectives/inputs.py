"""The per-token inputs every objective reads, and the per-token terms every objective returns.

:class:`ObjectiveInputs` is built once per batch by :meth:`ObjectiveInputs.of`, which validates
shapes, broadcasts ``(B,)`` advantages to ``(B, T)`` and cleans the padding (``logprobs =
old_logprobs = ref_logprobs = 0`` and weight 1 where ``mask`` is False), so garbage at padded
positions (inf, nan, huge ratios) never reaches an objective, its gradient or its omega.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

__all__ = ["ObjectiveInputs", "TokenObjective", "Surrogate", "as_mask"]


def as_mask(mask: object, reference: torch.Tensor, name: str) -> torch.Tensor:
    """``mask`` as a bool ``(B, T)`` tensor of the shape of ``reference`` (0/1 floats accepted);
    ValueError naming ``name`` otherwise."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(f"{name} must be a torch.Tensor of shape (B, T)")
    if tuple(mask.shape) != tuple(reference.shape):
        raise ValueError(
            f"{name} must have shape {tuple(reference.shape)} (like logprobs), "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        fractional = mask.dtype.is_floating_point or mask.is_complex()
        if fractional and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(f"{name} must be boolean or 0/1 valued")
        mask = mask != 0
    return mask


def _per_token(value: object, logprobs: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` as ``(B, T)``: ``(B,)`` and ``(B, 1)`` are broadcast along T."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (B,), (B, 1) or (B, T)")
    b, t = logprobs.shape
    if value.dim() == 1 and value.shape[0] == b:
        return value[:, None].expand(b, t)
    if value.dim() == 2 and value.shape[0] == b and value.shape[1] in (1, t):
        return value.expand(b, t)
    raise ValueError(
        f"{name} must have shape (B,), (B, 1) or (B, T) with (B, T) = {(b, t)}, "
        f"got {tuple(value.shape)}"
    )


@dataclass(frozen=True)
class ObjectiveInputs:
    """What an objective reads; every tensor ``(B, T)`` in the dtype of ``logprobs``.

    Attributes:
        logprobs: log pi_theta of the sampled tokens (carries the gradient in a loss).
        old_logprobs: log pi_old (the policy that the ratio r = pi_theta / pi_old compares to).
        advantages: A per token (``(B,)`` inputs are broadcast).
        mask: bool, the valid response tokens M.
        ref_logprobs: log pi_ref, or None (no KL term).
        importance_weights: detached rollout-correction weights w >= 0 that the engine
            multiplies into the policy term (verl's ``rollout_is_weights``, TRL's vLLM
            ``importance_sampling_ratio`` and off-policy mask), or None. Each objective
            applies them as its engine does (most multiply the token's policy term).
        picked: bool, the tokens an objective with a batch-level pick (clip-cov, kl-cov:
            :attr:`gmts.core.objectives.registry.Objective.picks`) treats apart, picked once
            over the engine's whole update unit (:func:`gmts.selection_step`), or None: the
            objective picks them over these rows, with ``pick_seed``.
        pick_seed: the seed of that pick's draw when ``picked`` is None.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    importance_weights: torch.Tensor | None = None
    picked: torch.Tensor | None = None
    pick_seed: int = 0

    @classmethod
    def of(
        cls,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        ref_logprobs: torch.Tensor | None = None,
        importance_weights: torch.Tensor | None = None,
        picked: torch.Tensor | None = None,
        pick_seed: int = 0,
    ) -> ObjectiveInputs:
        """Validated, broadcast and padding-cleaned inputs (``mask`` None: every position).

        Raises ValueError naming the bad argument (shape, dtype, negative or non-finite
        importance weights at valid positions).
        """
        if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
            raise ValueError("logprobs must be a torch.Tensor of shape (B, T)")
        if not logprobs.dtype.is_floating_point:
            raise ValueError(f"logprobs must be floating point, got {logprobs.dtype}")
        mask = (
            torch.ones(logprobs.shape, dtype=torch.bool, device=logprobs.device)
            if mask is None
            else as_mask(mask, logprobs, "mask")
        )
        for name, t in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
            if t is None and name == "ref_logprobs":
                continue
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(logprobs.shape):
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must have the shape of logprobs {tuple(logprobs.shape)}, got {got}"
                )
        dtype = logprobs.dtype
        zero = torch.zeros((), dtype=dtype, device=logprobs.device)

        def clean(t: torch.Tensor) -> torch.Tensor:
            return torch.where(mask, t.to(dtype), zero)

        adv = clean(_per_token(advantages, logprobs, "advantages"))
        weights = None
        if importance_weights is not None:
            w = _per_token(importance_weights, logprobs, "importance_weights").detach()
            valid = w[mask]
            if not bool(torch.isfinite(valid).all()) or bool((valid < 0).any()):
                raise ValueError("importance_weights must be finite and >= 0 at valid tokens")
            weights = torch.where(mask, w.to(dtype), torch.ones((), dtype=dtype))
        if picked is not None:
            picked = as_mask(picked, logprobs, "picked") & mask
        if isinstance(pick_seed, bool) or not isinstance(pick_seed, int):
            raise ValueError(f"pick_seed must be an int, got {pick_seed!r}")
        return cls(
            logprobs=clean(logprobs),
            old_logprobs=clean(old_logprobs).detach(),
            advantages=adv.detach(),
            mask=mask,
            ref_logprobs=None if ref_logprobs is None else clean(ref_logprobs).detach(),
            importance_weights=weights,
            picked=picked,
            pick_seed=pick_seed,
        )

    def detached(self) -> ObjectiveInputs:
        """The same inputs with ``logprobs`` detached (for omega)."""
        return replace(self, logprobs=self.logprobs.detach())

    def with_logprobs(self, logprobs: torch.Tensor) -> ObjectiveInputs:
        """The same inputs with other ``(B, T)`` current log-probs (e.g. a leaf for autograd)."""
        return replace(self, logprobs=logprobs)

    @property
    def lengths(self) -> torch.Tensor:
        """``(B,)`` valid tokens per row |o_i| (float, in the dtype of logprobs)."""
        return self.mask.sum(-1).to(self.logprobs.dtype)

    def row_mean(self, values: torch.Tensor) -> torch.Tensor:
        """``(B,)`` mean of ``(B, T)`` values over each row's valid tokens (0 for empty rows)."""
        total = torch.where(self.mask, values, torch.zeros_like(values)).sum(-1)
        return total / self.lengths.clamp_min(1)


@dataclass(frozen=True)
class Surrogate:
    """An objective's per-token policy term and where its trust region acted; ``(B, T)`` each.

    Attributes:
        value: the policy term ``s`` to maximise (importance weights applied), with gradient.
        clipped_low, clipped_high, dual_clipped: bool, where the objective's clip (or its
            trust-region mask) acted on the low side / the high side / the dual clip.
    """

    value: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    dual_clipped: torch.Tensor

    @classmethod
    def unclipped(cls, value: torch.Tensor) -> Surrogate:
        """A policy term whose objective has no clip."""
        none = torch.zeros(value.shape, dtype=torch.bool, device=value.device)
        return cls(value, none, none, none)


@dataclass(frozen=True)
class TokenObjective:
    """Per-token parts of the token objective ``l = surrogate - kl_coef * kl``; ``(B, T)`` each.

    Attributes:
        surrogate: the objective's policy term ``s`` (carries the gradient of ``logprobs``).
        kl: the KL estimate ``D`` (after clamp and ratio correction; zeros without
            ``ref_logprobs``; carries its gradient).
        clipped_low, clipped_high, dual_clipped: bool, where the objective's trust region
            acted (see :class:`Surrogate`).
    """

    surrogate: torch.Tensor
    kl: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    dual_clipped: torch.Tensor

    @property
    def clipped(self) -> torch.Tensor:
        """``(B, T)`` bool: where any clip or trust-region mask acted."""
        return self.clipped_low | self.clipped_high | self.dual_clipped
