"""Per-token statistics of a batch under a model: the trainer's one model-forward seam.

:class:`TokenScorer` runs the causal LM on prompt + response rows and returns the response
tokens' float32 log-probs, entropies and (when a score needs it) logit-gradient norms
(:func:`gmts.core.logprobs.token_statistics`). Every forward of the trainer goes through it:
the rollout policy's old log-probs, the reference's log-probs, the current policy's selection
scores (no grad) and the loss pass (with grad). Tests replace the model forward by handing the
update functions another object with the same two methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from gmts.core.config import SelectionConfig
from gmts.core.logprobs import TokenStatistics, token_statistics
from gmts.core.scores import score_requirements
from gmts.sampling.sequences import PromptResponse


def micro_slices(num_rows: int, size: int) -> Iterator[slice]:
    """Consecutive row slices of at most ``size`` rows covering ``range(num_rows)``."""
    for start in range(0, num_rows, size):
        yield slice(start, min(start + size, num_rows))


def needs_logit_grad_norm(selection: SelectionConfig) -> bool:
    """Whether the configured score reads the per-token logit-gradient norm."""
    return "logit_grad_norm" in score_requirements(selection.score)


@dataclass(frozen=True)
class TokenScorer:
    """How the trainer turns a model and rows into per-token statistics.

    Attributes:
        temperature: the sampling temperature (log-probs are of the tempered distribution).
        chunk_size: positions per block of the log-prob kernel (None: its default).
        autocast: a context around the model's forward (the strategy's compute dtype); the
            statistics are reduced in float32 outside it.
    """

    temperature: float = 1.0
    chunk_size: int | None = None
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext

    def __call__(
        self, model: torch.nn.Module, rows: PromptResponse, *, logit_grad_norm: bool = False
    ) -> TokenStatistics:
        """``(B, T)`` statistics of ``rows.response_ids`` under ``model``, with gradients
        through the log-probs when grad mode is on.

        Only the logits of the response positions are materialised (``logits_to_keep``);
        position ids follow the attention mask, so left padding does not shift positions.
        """
        T = rows.response_ids.shape[1]
        with self.autocast():
            out = model(
                input_ids=rows.input_ids,  # (B, P + T)
                attention_mask=rows.attention_mask,  # (B, P + T)
                position_ids=rows.position_ids,  # (B, P + T), as at sampling time
                logits_to_keep=T + 1,
                use_cache=False,
            )
        logits = out.logits[:, :-1]  # (B, T, V): position P-1+t predicts response token t
        return token_statistics(
            logits,
            rows.response_ids,
            temperature=self.temperature,
            chunk_size=self.chunk_size,
            logit_grad_norm=logit_grad_norm,
        )

    @torch.no_grad()
    def no_grad(
        self,
        model: torch.nn.Module,
        batch: Any,
        *,
        micro_batch_size: int,
        logit_grad_norm: bool = False,
    ) -> TokenStatistics:
        """:meth:`__call__` without gradients, ``micro_batch_size`` rows at a time (``batch``
        has ``rows(slice)`` and ``num_rows``), concatenated: ``(B, T)``."""
        parts = [
            self(model, batch.rows(s), logit_grad_norm=logit_grad_norm)
            for s in micro_slices(batch.num_rows, micro_batch_size)
        ]
        grad_norms = [p.logit_grad_norm for p in parts]
        return TokenStatistics(
            logprobs=torch.cat([p.logprobs for p in parts]),
            entropy=torch.cat([p.entropy for p in parts]),
            logit_grad_norm=torch.cat(grad_norms) if logit_grad_norm else None,
        )
