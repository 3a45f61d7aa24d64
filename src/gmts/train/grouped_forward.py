"""The grouped layout of the trainer's forward: each distinct prompt runs once, its keys and
values are shared by the rows that answer it, and the responses run in buckets of similar
length (:mod:`gmts.train.forward_plan`), so the positions computed are the real ones within
10%.

For rows of ``(B, P)`` left-padded prompts and ``(B, T)`` right-padded responses:

1. **prompt calls**: each bucket of distinct prompts, left-padded to its longest, runs with a
   recording cache (:mod:`gmts.train.prefix_cache`); the last position's logits predict
   response token 0 of every row of the prompt. Each layer's keys and values go into a store
   ``(u, heads, W, head_dim)`` (left-padded with zeros to the longest prompt ``W``; masked);
2. **response calls**: each bucket of rows feeds its response tokens ``0..L-2`` (L: the
   bucket's longest response) after its rows' prompt keys and values (``index_select`` from the
   store into a prefix cache: autograd sums each shared prompt's gradient over its rows
   exactly), with the attention mask ``[prompt mask, response mask]`` and the positions the
   sampler used (``prompt length + t``); the logits predict tokens ``1..L-1``;
3. the statistics (:func:`gmts.core.logprobs.token_statistics`, per call, so no more logits
   exist at once than in the padded layout) are put back in the ``(B, T)`` layout; positions
   past a row's response are 0.

Log-probs and gradients equal the padded layout's up to float rounding (tests/train/
test_grouped_forward.py). Under FSDP every forward all-gathers the weights, so every rank must
make the same number of calls: the ranks agree on the most (one all-reduce), a rank with fewer
splits its buckets (:meth:`ForwardPlan.split`: no more positions) and, when it
cannot, makes one-token calls whose outputs enter the graph with a zero gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gmts.core.distributed import all_reduce_max
from gmts.core.logprobs import TokenStatistics, token_statistics
from gmts.sampling.sequences import PromptResponse, position_ids_from_mask
from gmts.train.forward_plan import ForwardPlan, plan_forward

__all__ = ["grouped_statistics"]


@dataclass(frozen=True)
class _Prompts:
    """The distinct prompts after their calls.

    Attributes:
        states: per layer, keys and values ``(u, heads, W, head_dim)``, left-padded.
        mask: ``(u, W)`` long, 1 on real prompt tokens.
        last_logits: ``(u, V)``, predicting response token 0.
    """

    states: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    last_logits: torch.Tensor


@dataclass(frozen=True)
class _Piece:
    """Statistics of some response positions: ``flat`` ``(n,)`` indices into the ``(B * T)``
    layout and the ``(n,)`` values at them."""

    flat: torch.Tensor
    stats: TokenStatistics


class _ZeroGradLink(torch.autograd.Function):
    """``output`` unchanged, with ``other`` in its graph receiving a zero gradient: a call made
    only to keep FSDP's collectives in step is back-propagated, contributing nothing."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        ctx.other_shape, ctx.other_dtype = other.shape, other.dtype
        return output.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.new_zeros(ctx.other_shape, dtype=ctx.other_dtype)


def grouped_statistics(
    model: Any,
    rows: PromptResponse,
    *,
    temperature: float,
    chunk_size: int | None,
    logit_grad_norm: bool,
    autocast: Callable[[], AbstractContextManager[Any]],
    forward_group: Any = None,
) -> TokenStatistics:
    """``(B, T)`` statistics of ``rows.response_ids`` under ``model`` in the grouped layout
    (module docstring); gradients through the log-probs when grad mode is on.

    Args:
        autocast: the context around each model call (the statistics are reduced outside).
        forward_group: the process group whose ranks must make the same number of model calls
            (FSDP), or None.
    """
    from gmts.train.prefix_cache import (
        cache_argument,
        checkpointed_modules,
        checkpointing_keeps_cache,
    )

    plan = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
    fillers = 0
    if forward_group is not None:
        wanted = torch.tensor([plan.calls], device=rows.response_ids.device)
        calls = int(all_reduce_max(wanted, forward_group).item())
        plan = plan.split(calls)
        fillers = calls - plan.calls
    B, T = rows.response_ids.shape
    stats = dict(temperature=temperature, chunk_size=chunk_size, logit_grad_norm=logit_grad_norm)
    # read before checkpointing_keeps_cache turns Hugging Face's flags off for the calls
    replayed = tuple(checkpointed_modules(model))
    call = _Caller(model, cache_argument(model), autocast, replayed)
    with checkpointing_keeps_cache(model):
        prompts = _prompt_calls(call, rows, plan)
        pieces = [_first_tokens(prompts, rows, plan, **stats)]
        for bucket in plan.response_buckets:
            pieces.append(_response_call(call, prompts, rows, plan, bucket, **stats))
        filler_logits = [call.filler(rows) for _ in range(fillers)]
    out = _assemble(pieces, B * T, logit_grad_norm)
    logprobs = out.logprobs
    for logits in filler_logits:
        logprobs = _ZeroGradLink.apply(logprobs, logits)
    return TokenStatistics(
        logprobs=logprobs.view(B, T),
        entropy=out.entropy.view(B, T),
        logit_grad_norm=None if out.logit_grad_norm is None else out.logit_grad_norm.view(B, T),
    )


@dataclass(frozen=True)
class _Caller:
    """One model call under the strategy's autocast, the cache under the model's own name."""

    model: Any
    cache_name: str
    autocast: Callable[[], AbstractContextManager[Any]]
    replayed: tuple[torch.nn.Module, ...] = ()  # checkpointed modules: autocast's casts there

    def __call__(self, cache: Any, **inputs: Any) -> torch.Tensor:
        with self.autocast(), self._casts():
            out = self.model(**inputs, use_cache=True, **{self.cache_name: cache})
        return out.logits

    def _casts(self) -> AbstractContextManager[Any]:
        """Each call its own autocast region, and no region's weight casts kept until the
        backward (:mod:`gmts.scale.uncached_casts`: else n calls hold n casts of the model).
        Checkpointed layers keep theirs as they are: their replay must save what their
        forward saved, and they keep no cast anyway."""
        from gmts.scale.uncached_casts import uncached_weight_casts

        return uncached_weight_casts(self.model, skip=self.replayed)

    def filler(self, rows: PromptResponse) -> torch.Tensor:
        """A one-token call (the first row's last prompt token at position 0): ``(1, 1, V)``."""
        with self.autocast(), self._casts():
            out = self.model(
                input_ids=rows.prompt_ids[:1, -1:],
                attention_mask=torch.ones_like(rows.prompt_ids[:1, -1:]),
                position_ids=torch.zeros_like(rows.prompt_ids[:1, -1:]),
                use_cache=False,
                logits_to_keep=1,
            )
        return out.logits


def _prompt_calls(call: _Caller, rows: PromptResponse, plan: ForwardPlan) -> _Prompts:
    """Step 1: the distinct prompts' calls, bucket by bucket, and their store."""
    from gmts.train.prefix_cache import recorded_states, recording_cache

    P = rows.prompt_ids.shape[1]
    width = max(plan.prompt_lengths)  # W: the longest distinct prompt
    order: list[int] = []
    per_bucket: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    last: list[torch.Tensor] = []
    for bucket in plan.prompt_buckets:
        w = plan.prompt_lengths[bucket[0]]  # this bucket's longest prompt
        source = plan.prompt_rows[list(bucket)]  # (n,) a row of each prompt
        mask = rows.prompt_mask[source, P - w :].long()  # (n, w)
        cache = recording_cache(call.model)
        logits = call(
            cache,
            input_ids=rows.prompt_ids[source, P - w :],  # (n, w)
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),  # (n, w): as the sampler's
            logits_to_keep=1,
        )
        last.append(logits[:, -1])  # (n, V)
        per_bucket.append(
            [
                (F.pad(k, (0, 0, width - w, 0)), F.pad(v, (0, 0, width - w, 0)))  # (n, h, W, d)
                for k, v in recorded_states(cache)
            ]
        )
        order.extend(bucket)
    # store rows in distinct-prompt order: position of prompt g in the concatenated buckets
    where = torch.empty(len(order), dtype=torch.long, device=rows.prompt_ids.device)
    where[torch.tensor(order, device=where.device)] = torch.arange(len(order), device=where.device)
    states = [
        (
            torch.cat([b[i][0] for b in per_bucket]).index_select(0, where),  # (u, h, W, d)
            torch.cat([b[i][1] for b in per_bucket]).index_select(0, where),
        )
        for i in range(len(per_bucket[0]))
    ]
    return _Prompts(
        states=states,
        mask=rows.prompt_mask[plan.prompt_rows, P - width :].long(),  # (u, W)
        last_logits=torch.cat(last).index_select(0, where),  # (u, V)
    )


def _first_tokens(
    prompts: _Prompts, rows: PromptResponse, plan: ForwardPlan, **stats: Any
) -> _Piece:
    """Response token 0 of every row that has one, from its prompt's last logits."""
    T = rows.response_ids.shape[1]
    device = rows.response_ids.device
    answering = torch.tensor(
        [i for i, n in enumerate(plan.response_lengths) if n > 0], dtype=torch.long, device=device
    )  # (n,)
    logits = prompts.last_logits.index_select(0, plan.row_prompt[answering])  # (n, V)
    labels = rows.response_ids[answering, :1]  # (n, 1)
    return _Piece(answering * T, _flat(token_statistics(logits[:, None], labels, **stats)))


def _response_call(
    call: _Caller,
    prompts: _Prompts,
    rows: PromptResponse,
    plan: ForwardPlan,
    bucket: tuple[int, ...],
    **stats: Any,
) -> _Piece:
    """Step 2 for one bucket of rows, whose longest response has ``L + 1`` tokens: tokens
    ``0..L-1`` fed after their prompts' keys and values; statistics of tokens ``1..L`` at the
    rows' real positions."""
    from gmts.train.prefix_cache import prefix_cache

    device = rows.response_ids.device
    T = rows.response_ids.shape[1]
    members = torch.tensor(bucket, dtype=torch.long, device=device)  # (n,)
    groups = plan.row_prompt[members]  # (n,)
    fed = plan.fed_lengths
    L = fed[bucket[0]]  # the longest row's tokens fed: its length - 1
    W = max(plan.prompt_lengths[g] for g in groups.tolist())  # the bucket's longest prompt
    store = prompts.mask.shape[1]
    prefix = [
        (k[:, :, store - W :].index_select(0, groups), v[:, :, store - W :].index_select(0, groups))
        for k, v in prompts.states
    ]  # per layer (n, h, W, d)
    prompt_mask = prompts.mask[groups, store - W :]  # (n, W)
    response_mask = rows.response_mask[members, :L].long()  # (n, L)
    lengths = torch.tensor([plan.prompt_lengths[g] for g in groups.tolist()], device=device)
    logits = call(
        prefix_cache(prefix),
        input_ids=rows.response_ids[members, :L],  # (n, L)
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),  # (n, W + L)
        position_ids=lengths[:, None] + torch.arange(L, device=device),  # (n, L)
    )  # (n, L, V): position t predicts response token t + 1
    out = token_statistics(logits, rows.response_ids[members, 1 : L + 1], **stats)  # (n, L)
    steps = torch.arange(L, device=device)
    real = steps < torch.tensor([fed[i] for i in bucket], device=device)[:, None]  # (n, L)
    flat = members[:, None] * T + 1 + steps  # (n, L)
    return _Piece(flat[real], _select(out, real))


def _flat(stats: TokenStatistics) -> TokenStatistics:
    return _select(stats, torch.ones_like(stats.logprobs, dtype=torch.bool))


def _select(stats: TokenStatistics, keep: torch.Tensor) -> TokenStatistics:
    """The ``(n,)`` statistics where ``keep``."""
    norm = stats.logit_grad_norm
    return TokenStatistics(
        stats.logprobs[keep], stats.entropy[keep], None if norm is None else norm[keep]
    )


def _assemble(pieces: list[_Piece], size: int, logit_grad_norm: bool) -> TokenStatistics:
    """Step 3: the pieces at their flat positions of ``(size,)`` zeros (each position is
    written at most once)."""
    flat = torch.cat([p.flat for p in pieces])  # (n,)

    def put(values: list[torch.Tensor]) -> torch.Tensor:
        joined = torch.cat(values)
        return joined.new_zeros(size).index_put((flat,), joined)

    return TokenStatistics(
        logprobs=put([p.stats.logprobs for p in pieces]),
        entropy=put([p.stats.entropy for p in pieces]),
        logit_grad_norm=(
            put([p.stats.logit_grad_norm for p in pieces]) if logit_grad_norm else None
        ),
    )
