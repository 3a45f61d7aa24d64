"""One optimizer step on one mini-batch: score, select once, micro-batched backward, step.

The order matters for exactness:

1. the scores come from the CURRENT policy (the rollout-time statistics are passed in while the
   policy has not changed since the rollout; otherwise one no-grad pass computes them);
2. ONE selection over the whole mini-batch (global across ranks with a process group);
3. the loss denominator is computed once for the whole mini-batch (global across ranks), so
   the micro-batch losses add up to the mini-batch loss and accumulation is exact;
4. gradients are summed over ranks, checked for finiteness, clipped, and applied once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from gmts.core.config import SelectionConfig
from gmts.core.logprobs import TokenStatistics, token_statistics
from gmts.core.loss import LossConfig, TokenSums, policy_loss
from gmts.core.objectives import ObjectiveConfig, gradient_coefficient
from gmts.core.scores import ScoreInputs, compute_scores, score_requirements
from gmts.core.selection import select_tokens
from gmts.core.step import select_for_update
from gmts.train.batch import TrainBatch
from gmts.train.distributed import DistInfo, all_reduce_sum
from gmts.train.precision import Precision
from gmts.train.sequences import position_ids_from_mask
from gmts.train.strategy import Replicate, Strategy


@dataclass(frozen=True)
class UpdateSettings:
    """What :func:`update_minibatch` needs besides the model and the data."""

    objective: ObjectiveConfig
    selection: SelectionConfig
    micro_batch_size: int
    temperature: float = 1.0
    chunk_size: int | None = None
    grad_clip: float | None = 1.0
    overlap_metrics: bool = True


def needs_logit_grad_norm(selection: SelectionConfig) -> bool:
    """Whether the configured score reads the per-token logit-gradient norm."""
    return "logit_grad_norm" in score_requirements(selection.score)


def micro_slices(num_rows: int, size: int) -> Iterator[slice]:
    """Consecutive row slices of at most ``size`` rows covering ``range(num_rows)``."""
    for start in range(0, num_rows, size):
        yield slice(start, min(start + size, num_rows))


def policy_statistics(
    model: torch.nn.Module,
    batch: TrainBatch,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    logit_grad_norm: bool = False,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> TokenStatistics:
    """Per-token log-probs / entropies of ``batch.response_ids`` under ``model``: ``(B, T)``.

    Only the logits of the response positions are materialised (``logits_to_keep``).
    Position ids follow the attention mask, so left padding does not shift positions. The
    model's forward runs inside ``autocast()`` (the strategy's compute dtype); the log-probs
    and entropies are reduced in float32 outside it.
    """
    input_ids = batch.input_ids  # (B, P + T)
    attention_mask = batch.attention_mask  # (B, P + T)
    position_ids = position_ids_from_mask(attention_mask)  # (B, P + T), as at sampling time
    T = batch.response_ids.shape[1]
    with autocast():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=T + 1,
            use_cache=False,
        )
    logits = out.logits[:, :-1]  # (B, T, V): position P-1+t predicts response token t
    return token_statistics(
        logits,
        batch.response_ids,
        temperature=temperature,
        chunk_size=chunk_size,
        logit_grad_norm=logit_grad_norm,
    )


@torch.no_grad()
def batched_statistics(
    model: torch.nn.Module,
    batch: TrainBatch,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    logit_grad_norm: bool = False,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> TokenStatistics:
    """:func:`policy_statistics` without gradients, micro-batched, concatenated: ``(B, T)``."""
    parts = [
        policy_statistics(
            model,
            batch.rows(s),
            temperature=temperature,
            chunk_size=chunk_size,
            logit_grad_norm=logit_grad_norm,
            autocast=autocast,
        )
        for s in micro_slices(batch.num_rows, micro_batch_size)
    ]
    lgn = torch.cat([p.logit_grad_norm for p in parts]) if logit_grad_norm else None
    return TokenStatistics(
        logprobs=torch.cat([p.logprobs for p in parts]),
        entropy=torch.cat([p.entropy for p in parts]),
        logit_grad_norm=lgn,
    )


def _select(
    settings: UpdateSettings,
    batch: TrainBatch,
    current: TokenStatistics | None,
    info: DistInfo,
    step: int,
) -> torch.Tensor | None:
    """The ``(B, T)`` selection of the mini-batch (global over ranks); None for 'none'.

    With ``selection.unit == "micro-batch"`` each micro-batch (the i-th of every rank together)
    is selected on its own, as TRL does; otherwise the whole mini-batch at once (the paper).
    """
    sel = settings.selection
    if not sel.enabled:
        return None
    assert current is not None
    size = settings.micro_batch_size if sel.unit == "micro-batch" else batch.num_rows
    parts = []
    for s in micro_slices(batch.num_rows, size):
        result = select_for_update(
            sel,
            settings.objective,
            logprobs=current.logprobs[s],
            old_logprobs=batch.old_logprobs[s],
            advantages=batch.advantages[s],
            response_mask=batch.response_mask[s],
            entropy=current.entropy[s],
            ref_logprobs=None if batch.ref_logprobs is None else batch.ref_logprobs[s],
            logit_grad_norm=(
                None if current.logit_grad_norm is None else current.logit_grad_norm[s]
            ),
            group_ids=batch.group_ids[s],
            process_group=info.group,
            step=step,
        )
        parts.append(result.selected)
    return torch.cat(parts)


def selection_metrics(
    settings: UpdateSettings,
    batch: TrainBatch,
    current: TokenStatistics,
    selected: torch.Tensor | None,
    info: DistInfo,
) -> dict[str, float]:
    """Global statistics of the selection: fraction, entropies, positive-advantage share, and
    the Jaccard overlap of the GMTS and ETS selections at the configured ratio."""
    mask = batch.response_mask
    chosen = mask if selected is None else (selected & mask)
    entropy = current.entropy.double()
    positive = (batch.advantages > 0)[:, None] & chosen
    sums = [
        mask.sum(),
        chosen.sum(),
        (entropy * mask).sum(),
        (entropy * chosen).sum(),
        positive.sum(),
    ]
    overlap = settings.overlap_metrics
    if overlap:
        omega = gradient_coefficient(
            current.logprobs,
            batch.old_logprobs,
            batch.advantages,
            ref_logprobs=batch.ref_logprobs,
            **settings.objective.omega_kwargs(),
        )
        inputs = ScoreInputs(entropy=current.entropy, omega=omega, mask=mask)
        masks = []
        for name in ("gmts", "entropy"):
            masks.append(
                select_tokens(
                    compute_scores(name, inputs),
                    mask,
                    settings.selection.ratio,
                    largest=settings.selection.largest,
                    scope=settings.selection.scope,
                    group_ids=batch.group_ids,
                    process_group=info.group,
                    count=settings.selection.count,
                )
            )
        sums += [(masks[0] & masks[1]).sum(), (masks[0] | masks[1]).sum()]
    totals = all_reduce_sum(torch.stack([s.double() for s in sums]), info).tolist()
    n_all, n_sel = max(totals[0], 1.0), max(totals[1], 1.0)
    out = {
        "select/fraction": totals[1] / n_all,
        "select/entropy_all": totals[2] / n_all,
        "select/entropy_selected": totals[3] / n_sel,
        "select/positive_adv_fraction": totals[4] / n_sel,
    }
    if overlap:
        out["select/gmts_ets_jaccard"] = totals[5] / max(totals[6], 1.0)
    return out


def update_minibatch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    settings: UpdateSettings,
    *,
    info: DistInfo,
    step: int,
    current: TokenStatistics | None = None,
    strategy: Strategy | None = None,
) -> tuple[dict[str, float], torch.Tensor | None]:
    """One optimizer step on ``batch`` (this rank's share of one mini-batch).

    Args:
        batch: rows with ``old_logprobs`` (and ``ref_logprobs`` when KL is on) filled in; or
            with ``old_logprobs`` None when the policy IS the rollout policy and the batch is
            one micro-batch (one update per rollout, the paper's default): then one forward
            pass with gradients gives the old log-probs, the scores and the loss, and
            ``batch.old_logprobs`` / ``batch.old_entropy`` are filled in from it.
        current: the current policy's no-grad statistics of ``batch`` if already known (the
            first mini-batch after a rollout); None computes them when the score needs them.
        step: the optimizer-step index (seeds the random score).
        strategy: how the model is laid out over the ranks (autocast, gradient reduction,
            clipping); None: ``replicate`` in float32.

    Returns:
        ``(metrics, selected)``: metrics (global over ranks where noted;
        ``update/skipped_nonfinite`` is 1.0 when the loss or the gradient was not finite: the
        step was skipped and the weights are untouched) and this rank's ``(B, T)`` bool
        selection mask (None for score 'none').
    """
    sel = settings.selection
    objective = settings.objective
    group = info.group
    mask = batch.response_mask
    if strategy is None:
        strategy = Replicate(info, Precision(), mask.device)
    autocast = strategy.autocast
    fused = None  # statistics with gradients, reused by the loss (single-pass mode)
    if batch.old_logprobs is None:
        if batch.num_rows > settings.micro_batch_size:
            raise ValueError("old_logprobs may be None only for a single micro-batch")
        fused = policy_statistics(
            model,
            batch,
            temperature=settings.temperature,
            chunk_size=settings.chunk_size,
            logit_grad_norm=needs_logit_grad_norm(sel),
            autocast=autocast,
        )
        batch.old_logprobs = fused.logprobs.detach()
        batch.old_entropy = fused.entropy
        current = TokenStatistics(batch.old_logprobs, fused.entropy, fused.logit_grad_norm)
    if current is None and sel.enabled:
        current = batched_statistics(
            model,
            batch,
            micro_batch_size=settings.micro_batch_size,
            temperature=settings.temperature,
            chunk_size=settings.chunk_size,
            logit_grad_norm=needs_logit_grad_norm(sel),
            autocast=autocast,
        )
    selected = _select(settings, batch, current, info, step)
    metrics: dict[str, float] = {}
    if current is not None:
        metrics.update(selection_metrics(settings, batch, current, selected, info))

    loss_config = LossConfig.of(objective, sel)
    denominators = loss_config.denominators(TokenSums.count(mask, selected).all_reduce(group))

    # the optimizer's own list: under FSDP, model.parameters() can be the gathered (unsharded)
    # tensors between a forward and its backward; the sharded ones hold the gradients
    params = [p for param_group in optimizer.param_groups for p in param_group["params"]]
    optimizer.zero_grad(set_to_none=True)
    finite = True
    loss_total = 0.0
    weighted: dict[str, float] = {}
    weight_total = 0.0
    for s in micro_slices(batch.num_rows, settings.micro_batch_size):
        micro = batch.rows(s)
        stats = fused or policy_statistics(
            model,
            micro,
            temperature=settings.temperature,
            chunk_size=settings.chunk_size,
            autocast=autocast,
        )
        loss, sums = policy_loss(
            stats.logprobs,
            micro.old_logprobs,
            micro.advantages,
            micro.response_mask,
            loss_config,
            selected=None if selected is None else selected[s],
            ref_logprobs=micro.ref_logprobs,
            denominators=denominators,
        )
        loss_metrics = sums.metrics()
        # backward even when not finite: every rank must reach the same collectives (FSDP's
        # reduce-scatters run inside backward); the step is then skipped on every rank
        finite = finite and bool(torch.isfinite(loss))
        loss.backward()
        loss_total += float(loss.detach())
        w = float(micro.response_mask.sum())
        weight_total += w
        for k in ("clip_fraction", "kl_mean"):
            v = loss_metrics.get(k)
            if v is not None and math.isfinite(v):
                weighted[k] = weighted.get(k, 0.0) + w * v

    strategy.reduce_gradients(params)
    grad_norm = strategy.clip_grad_norm(params, settings.grad_clip)
    flags = all_reduce_sum(
        torch.tensor([0.0 if finite else 1.0, loss_total], dtype=torch.float64), info
    )
    finite = finite and flags[0].item() == 0 and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    metrics["update/loss"] = flags[1].item() if finite else float("nan")
    metrics["update/grad_norm"] = float(grad_norm)
    metrics["update/skipped_nonfinite"] = 0.0 if finite else 1.0
    for k, v in weighted.items():
        metrics[f"update/{k}"] = v / max(weight_total, 1.0)
    return metrics, selected
