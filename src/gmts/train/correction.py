"""Rollout correction: truncated importance sampling between the trainer and its rollout engine.

An inference engine samples with its own kernels (and, in bf16, its own rounding), so its
probabilities pi_engine differ from the trainer's pi_old for the same weights. With
``rollout.correction`` on, every token's policy term is weighted by

    token      w_t = min(pi_old(o_t) / pi_engine(o_t), C)
    sequence   w_i = min(prod_t pi_old(o_t) / pi_engine(o_t), C)   for every token of row i

(truncated importance sampling, as verl's rollout correction ``rollout_is=token|sequence`` with
``rollout_is_threshold`` C, and TRL's vLLM ``token_truncate`` / ``sequence_truncate`` with
``vllm_importance_sampling_clip_max`` C). The weights are detached, multiply the policy term
of the loss (never the KL), and are folded into omega by the core
(``importance_weights=``), so the GMTS score stays the coefficient of each token's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CORRECTION_LEVELS", "RolloutCorrection"]

CORRECTION_LEVELS = ("none", "token", "sequence")


@dataclass(frozen=True)
class RolloutCorrection:
    """Truncated importance weights pi_old / pi_engine (see the module docstring).

    Attributes:
        level: ``"none"``, ``"token"`` or ``"sequence"``.
        cap: C, the truncation (> 0).
    """

    level: str = "none"
    cap: float = 2.0

    def __post_init__(self) -> None:
        if self.level not in CORRECTION_LEVELS:
            raise ValueError(f"level must be one of {list(CORRECTION_LEVELS)}, got {self.level!r}")
        if not (isinstance(self.cap, (int, float)) and self.cap > 0):
            raise ValueError(f"cap must be a number > 0, got {self.cap!r}")

    @property
    def enabled(self) -> bool:
        return self.level != "none"

    def weights(
        self,
        old_logprobs: torch.Tensor,
        engine_logprobs: torch.Tensor | None,
        mask: torch.Tensor,
    ) -> torch.Tensor | None:
        """``(B, T)`` detached weights (1 at padding), or None when off.

        Args:
            old_logprobs: ``(B, T)`` the trainer's log pi_old. engine_logprobs: ``(B, T)`` the
                engine's log-probs of the same tokens (None: no engine ran, no weights).
            mask: ``(B, T)`` bool valid tokens.
        """
        if not self.enabled:
            return None
        if engine_logprobs is None:
            raise ValueError(
                "rollout.correction needs the engine's log-probs (rollout.engine=vllm)"
            )
        with torch.no_grad():
            old = old_logprobs.detach().double()
            diff = torch.where(mask, old - engine_logprobs.to(old.device).double(), 0.0)  # (B, T)
            if self.level == "sequence":
                diff = diff.sum(-1, keepdim=True).expand_as(diff)
            weights = torch.exp(diff).clamp(max=self.cap)
            return torch.where(mask, weights, 1.0).to(old_logprobs.dtype)

    def metrics(self, weights: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
        """This batch's ``rollout/is_weight_*`` sums (reduce over ranks before dividing):
        ``{"sum", "capped", "tokens"}``; empty when off."""
        if weights is None:
            return {}
        w = weights[mask]
        # compared in the weights' own dtype: a cap of 1.02 is 1.0199999809 as a float32
        # weight, which is below 1.02 as a Python float (every weight would count uncapped)
        at_cap = w >= torch.tensor(self.cap, dtype=w.dtype)
        return {
            "sum": float(w.double().sum()),
            "capped": float(at_cap.sum()),
            "tokens": float(w.numel()),
        }
