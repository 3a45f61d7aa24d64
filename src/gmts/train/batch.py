"""The typed record of one rollout batch in flight through the trainer.

Rows are grouped: the ``G`` answers of one question are consecutive rows and share a
``group_id``. Prompts are left-padded, responses right-padded; ``response_mask`` comes from the
generated lengths (EOS included), never from token values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from gmts.core.logprobs import TokenStatistics
from gmts.train.sequences import PromptResponse


@dataclass
class TrainBatch(PromptResponse):
    """One (per-rank) rollout batch with everything the update needs.

    Attributes:
        prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool.
        response_ids: ``(B, T)`` long, right-padded. response_mask: ``(B, T)`` bool.
        rewards: ``(B,)`` float32 final rewards (overlong penalty included).
        advantages: ``(B,)`` float32 group advantages.
        group_ids: ``(B,)`` long, consecutive rows of a group share one id.
        old_logprobs, old_entropy: ``(B, T)`` float32 under the rollout policy (no grad).
        old_logit_grad_norm: ``(B, T)`` or None (only when a score needs it).
        ref_logprobs: ``(B, T)`` under the frozen reference, or None (no KL).

    ``input_ids``, ``attention_mask`` and ``position_ids`` come from
    :class:`gmts.train.sequences.PromptResponse`, as for the rollout it was built from.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    old_entropy: torch.Tensor | None = None
    old_logit_grad_norm: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

    @classmethod
    def from_rollout(
        cls, roll: Any, rewards: torch.Tensor, advantages: torch.Tensor, group_offset: int = 0
    ) -> TrainBatch:
        """The batch of a :class:`gmts.train.rollout.Rollout` with ``(B,)`` rewards and
        advantages; ``group_offset`` shifts the group ids (this rank's first global group)."""
        return cls(
            prompt_ids=roll.prompt_ids,
            prompt_mask=roll.prompt_mask,
            response_ids=roll.response_ids,
            response_mask=roll.response_mask,
            rewards=rewards,
            advantages=advantages.float(),
            group_ids=roll.group_ids + group_offset,
        )

    def old_statistics(self) -> TokenStatistics:
        """The rollout policy's ``(B, T)`` statistics stored in this batch."""
        if self.old_logprobs is None or self.old_entropy is None:
            raise ValueError("old_statistics: old_logprobs/old_entropy are not filled in")
        return TokenStatistics(self.old_logprobs, self.old_entropy, self.old_logit_grad_norm)

    def set_old_statistics(self, stats: TokenStatistics) -> None:
        """Store the rollout policy's statistics (``(B, T)`` each) in this batch."""
        self.old_logprobs, self.old_entropy = stats.logprobs, stats.entropy
        self.old_logit_grad_norm = stats.logit_grad_norm

    @property
    def num_rows(self) -> int:
        return self.response_ids.shape[0]

    def rows(self, index: slice | torch.Tensor) -> TrainBatch:
        """The sub-batch of rows ``index`` (tensors are views where possible)."""
        kw = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kw[f.name] = value[index] if isinstance(value, torch.Tensor) else value
        return TrainBatch(**kw)

    def to(self, device: torch.device | str) -> TrainBatch:
        """A copy with every tensor on ``device``."""
        kw = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kw[f.name] = value.to(device) if isinstance(value, torch.Tensor) else value
        return TrainBatch(**kw)
