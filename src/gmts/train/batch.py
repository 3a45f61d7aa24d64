"""The typed records of one rollout batch in flight through the trainer.

``TrainBatch`` is what the rollout produced (token ids, masks, rewards, advantages);
``ScoredBatch`` adds what the update compares against: the rollout policy's per-token
statistics and, with a KL term, the reference log-probs. Neither is ever modified in place: a
sub-batch, a copy on another device or a scored batch is a new record.

Rows are grouped: the ``G`` answers of one question are consecutive rows and share a
``group_id``. Prompts are left-padded, responses right-padded; ``response_mask`` comes from the
generated lengths (EOS included), never from token values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from gmts.core.logprobs import TokenStatistics
from gmts.sampling.sequences import PromptResponse
from gmts.train.correction import RolloutCorrection

_Batch = TypeVar("_Batch", bound="TrainBatch")


@dataclass(frozen=True)
class TrainBatch(PromptResponse):
    """One (per-rank) rollout batch.

    Attributes:
        prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool.
        response_ids: ``(B, T)`` long, right-padded. response_mask: ``(B, T)`` bool.
        rewards: ``(B,)`` float32 final rewards (overlong penalty included).
        advantages: ``(B,)`` float32 group advantages.
        group_ids: ``(B,)`` long, consecutive rows of a group share one id.
        engine_logprobs: ``(B, T)`` float32 log-probs of the sampled tokens as the rollout
            engine computed them (vllm: in the tempered distribution the trainer scores; 0 on
            padding), or None when the engine records none (hf). The loss's pi_old is the
            trainer's own forward (``ScoredBatch.old_logprobs``); these are what a rollout
            correction (pi_old / pi_engine) would be computed from.

    ``input_ids``, ``attention_mask`` and ``position_ids`` come from
    :class:`gmts.sampling.sequences.PromptResponse`, as for the rollout it was built from.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    engine_logprobs: torch.Tensor | None = None

    @classmethod
    def from_rollout(
        cls, roll: Any, rewards: torch.Tensor, advantages: torch.Tensor, group_offset: int = 0
    ) -> TrainBatch:
        """The batch of a :class:`gmts.sampling.rollout.Rollout` with ``(B,)`` rewards and
        advantages; ``group_offset`` shifts the group ids (this rank's first global group)."""
        return cls(
            prompt_ids=roll.prompt_ids,
            prompt_mask=roll.prompt_mask,
            response_ids=roll.response_ids,
            response_mask=roll.response_mask,
            rewards=rewards,
            advantages=advantages.float(),
            group_ids=roll.group_ids + group_offset,
            engine_logprobs=roll.engine_logprobs,
        )

    @property
    def num_rows(self) -> int:
        return self.response_ids.shape[0]

    def rows(self: _Batch, index: slice | torch.Tensor) -> _Batch:
        """The sub-batch of rows ``index`` (tensors are views where possible)."""
        return self._map(lambda t: t[index])

    def to(self: _Batch, device: torch.device | str) -> _Batch:
        """A copy with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def scored(
        self,
        old: TokenStatistics,
        ref_logprobs: torch.Tensor | None,
        correction: RolloutCorrection | None = None,
    ) -> ScoredBatch:
        """This batch with the rollout policy's ``(B, T)`` statistics (detached), the reference
        log-probs (None without a KL term) and, with a rollout ``correction`` on, its weights
        pi_old / pi_engine, computed here once for every mini-batch and epoch of the step."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainBatch)}
        old_logprobs = old.logprobs.detach()
        weights = None
        if correction is not None:
            weights = correction.weights(old_logprobs, self.engine_logprobs, self.response_mask)
        return ScoredBatch(
            **fields,
            old_logprobs=old_logprobs,
            old_entropy=old.entropy.detach(),
            old_logit_grad_norm=(
                None if old.logit_grad_norm is None else old.logit_grad_norm.detach()
            ),
            ref_logprobs=ref_logprobs,
            importance_weights=weights,
        )

    def _map(self: _Batch, fn: Any) -> _Batch:
        kw = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kw[f.name] = fn(value) if isinstance(value, torch.Tensor) else value
        return type(self)(**kw)


@dataclass(frozen=True)
class ScoredBatch(TrainBatch):
    """A :class:`TrainBatch` with what the update compares the current policy against.

    Attributes:
        old_logprobs, old_entropy: ``(B, T)`` float32 under the rollout policy (no grad).
        old_logit_grad_norm: ``(B, T)``, or None when no score reads it.
        ref_logprobs: ``(B, T)`` under the frozen reference, or None (no KL term).
        importance_weights: ``(B, T)`` the rollout correction's detached weights
            (:class:`gmts.train.correction.RolloutCorrection`), or None when it is off: the
            selection folds them into omega and the loss into its policy term.
    """

    old_logprobs: torch.Tensor = field(kw_only=True)
    old_entropy: torch.Tensor = field(kw_only=True)
    old_logit_grad_norm: torch.Tensor | None = field(default=None, kw_only=True)
    ref_logprobs: torch.Tensor | None = field(default=None, kw_only=True)
    importance_weights: torch.Tensor | None = field(default=None, kw_only=True)

    @property
    def old(self) -> TokenStatistics:
        """The rollout policy's statistics as one record."""
        return TokenStatistics(self.old_logprobs, self.old_entropy, self.old_logit_grad_norm)
