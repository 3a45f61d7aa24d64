"""Prompt + response rows as the model sees them: one definition for every batch record.

A row is a left-padded prompt followed by a right-padded response. ``Rollout`` (what sampling
returns) and ``TrainBatch`` (what the update consumes) both hold the four tensors below and get
the model inputs from :class:`PromptResponse`, so the two can never disagree on positions.
"""

from __future__ import annotations

import torch

__all__ = ["PromptResponse", "distinct_prompts", "position_ids_from_mask"]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions ``cumsum(mask) - 1`` clamped at 0 (left padding gets position 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def distinct_prompts(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row_prompt (B,), prompt_rows (u,))``: each row's distinct prompt, and the first row
    holding each distinct prompt (the sampler prefills those rows; the trainer's grouped
    forward runs them once per group). Two rows share a prompt when their real tokens are the same
    (the masked columns are ignored)."""
    key = prompt_ids.masked_fill(~prompt_mask.bool(), -1)  # (B, P)
    _, row_prompt = torch.unique(key, dim=0, return_inverse=True)  # (B,)
    num_rows = row_prompt.shape[0]
    num_prompts = int(row_prompt.max()) + 1 if num_rows else 0
    prompt_rows = torch.full(
        (num_prompts,), num_rows, dtype=torch.long, device=row_prompt.device
    ).scatter_reduce(0, row_prompt, torch.arange(num_rows, device=row_prompt.device), "amin")
    return row_prompt, prompt_rows


class PromptResponse:
    """Model inputs of rows made of ``prompt_ids`` / ``prompt_mask`` ``(B, P)`` and
    ``response_ids`` / ``response_mask`` ``(B, T)`` (attributes of the subclass)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) long: prompt then response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + T) long: 1 on real prompt and response tokens (EOS included)."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1).long()

    @property
    def position_ids(self) -> torch.Tensor:
        """(B, P + T) long: the positions the sampler used, ``cumsum(attention_mask) - 1``.

        Pass these to the model when recomputing log-probs of left-padded rows, otherwise a model
        with learned or rotary positions sees different positions than at sampling time.
        """
        return position_ids_from_mask(self.attention_mask)
