"""Per-token statistics of a batch under a model: the trainer's one model-forward seam.

:class:`TokenScorer` runs the causal LM on prompt + response rows and returns the response
tokens' float32 log-probs, entropies and (when a score needs it) logit-gradient norms
(:func:`gmts.core.logprobs.token_statistics`). Every forward of the trainer goes through it:
the rollout policy's old log-probs, the reference's log-probs, the current policy's selection
scores (no grad) and the loss pass (with grad). Tests replace the model forward by handing the
update functions another object with the same methods.

How the rows are laid out for the model is a :data:`FORWARD_LAYOUTS` entry
(``model.forward_layout``): ``grouped`` (each distinct prompt once, responses in length
buckets: :mod:`gmts.train.grouped_forward`) or ``padded`` (every row whole, padded to the
longest). Both give the same statistics up to float rounding; :meth:`TokenScorer.positions`
counts what each computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from gmts._registry import Registry
from gmts.core.config import SelectionConfig
from gmts.core.logprobs import TokenStatistics, token_statistics
from gmts.core.scores import score_requirements
from gmts.sampling.sequences import PromptResponse
from gmts.train.forward_plan import Positions, padded_positions, plan_forward
from gmts.train.grouped_forward import grouped_statistics


def micro_slices(num_rows: int, size: int) -> Iterator[slice]:
    """Consecutive row slices of at most ``size`` rows covering ``range(num_rows)``."""
    for start in range(0, num_rows, size):
        yield slice(start, min(start + size, num_rows))


def needs_logit_grad_norm(selection: SelectionConfig) -> bool:
    """Whether the configured score reads the per-token logit-gradient norm."""
    return "logit_grad_norm" in score_requirements(selection.score)


@dataclass(frozen=True)
class ForwardLayout:
    """One way of laying rows out for the model.

    Attributes:
        name: the ``model.forward_layout`` value.
        statistics: ``(scorer, model, rows, logit_grad_norm) -> (B, T)`` statistics.
        positions: ``rows -> Positions``: what ``statistics`` computes for them.
        check: ``model config -> None``, raises ValueError when the layout cannot run a model
            of that config (before its weights are read).
    """

    name: str
    statistics: Callable[[TokenScorer, Any, PromptResponse, bool], TokenStatistics]
    positions: Callable[[PromptResponse], Positions]
    check: Callable[[Any], None]


FORWARD_LAYOUTS: Registry[ForwardLayout] = Registry("forward layout")


@dataclass(frozen=True)
class TokenScorer:
    """How the trainer turns a model and rows into per-token statistics.

    Attributes:
        temperature: the sampling temperature (log-probs are of the tempered distribution).
        chunk_size: positions per block of the log-prob kernel (None: its default).
        autocast: a context around the model's forward (the strategy's compute dtype); the
            statistics are reduced in float32 outside it.
        layout: a :data:`FORWARD_LAYOUTS` name (``model.forward_layout``).
        forward_group: the process group whose ranks must make the same number of model calls
            (FSDP: each forward is a collective), or None.
    """

    temperature: float = 1.0
    chunk_size: int | None = None
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext
    layout: str = "grouped"
    forward_group: Any = None

    def __post_init__(self) -> None:
        FORWARD_LAYOUTS.get(self.layout)  # an unknown name lists the valid ones

    def __call__(
        self, model: torch.nn.Module, rows: PromptResponse, *, logit_grad_norm: bool = False
    ) -> TokenStatistics:
        """``(B, T)`` statistics of ``rows.response_ids`` under ``model``, with gradients
        through the log-probs when grad mode is on; 0 past each row's response in the grouped
        layout, the model's values on the padding in the padded one.

        Only the logits of response positions are materialised; position ids follow the
        attention mask, so left padding does not shift positions.
        """
        return FORWARD_LAYOUTS.get(self.layout).statistics(self, model, rows, logit_grad_norm)

    def positions(self, rows: PromptResponse) -> Positions:
        """The positions :meth:`__call__` computes for ``rows``, and the real ones."""
        return FORWARD_LAYOUTS.get(self.layout).positions(rows)

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


def check_forward_layout(layout: str, model_config: Any) -> None:
    """Raise ValueError when ``model.forward_layout=layout`` cannot run a model of
    ``model_config`` (the grouped layout: only full-attention layers)."""
    FORWARD_LAYOUTS.get(layout).check(model_config)


def _padded(
    scorer: TokenScorer, model: Any, rows: PromptResponse, logit_grad_norm: bool
) -> TokenStatistics:
    """Every row's prompt and response in one call, ``(B, P + T)``."""
    from gmts.scale.uncached_casts import uncached_weight_casts
    from gmts.train.prefix_cache import checkpointed_modules

    T = rows.response_ids.shape[1]
    casts = uncached_weight_casts(model, skip=checkpointed_modules(model))  # none kept
    with scorer.autocast(), casts:
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
        temperature=scorer.temperature,
        chunk_size=scorer.chunk_size,
        logit_grad_norm=logit_grad_norm,
    )


def _grouped(
    scorer: TokenScorer, model: Any, rows: PromptResponse, logit_grad_norm: bool
) -> TokenStatistics:
    """The grouped layout (:func:`gmts.train.grouped_forward.grouped_statistics`)."""
    return grouped_statistics(
        model,
        rows,
        temperature=scorer.temperature,
        chunk_size=scorer.chunk_size,
        logit_grad_norm=logit_grad_norm,
        autocast=scorer.autocast,
        forward_group=scorer.forward_group,
    )


def _check_grouped(model_config: Any) -> None:
    from gmts.train.prefix_cache import check_full_attention

    check_full_attention(model_config)


FORWARD_LAYOUTS.register(
    ForwardLayout(
        "grouped",
        _grouped,
        lambda rows: plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask).positions,
        _check_grouped,
    )
)
FORWARD_LAYOUTS.register(
    ForwardLayout(
        "padded",
        _padded,
        lambda rows: padded_positions(rows.prompt_ids, rows.prompt_mask, rows.response_mask),
        lambda model_config: None,  # any causal LM
    )
)
