"""One training step of GRPO / DAPO with token selection (none, ETS, GMTS, ...), in order:

    1. rollout (collect.py): G samples per question, rewards (a raising reward fn gives 0 and
       is counted) [+ DAPO overlong punishment], DAPO dynamic sampling, group advantages
    2. reference log-probs if KL (:func:`score_rollout`, no grad)
    3. the rollout policy's log-probs and entropies (no grad, micro-batched; one update on
       one micro-batch: that update's own forward, whose loss reuses it) and the rollout
       correction's weights, once (:func:`score_rollout`)
    4. for each epoch, for each mini-batch (:func:`update_policy`, update.train_minibatch):
       scores of the current policy, ONE global selection, one global divisor,
       micro-batched backward, one optimizer step

:meth:`gmts.train.trainer.Trainer.train_step` calls them in this order.

Departures from the paper and why (see docs/training.md for the full list):
- mini-batches are taken in order (no shuffling) so that groups stay whole and runs are
  reproducible; the paper does not specify an order.
- when dynamic sampling hits ``max_sampling_rounds``, the batch is topped up with dropped
  groups, given advantage 0, instead of failing (verl's DAPO recipe raises), so every rank
  keeps the same shapes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from gmts.core.config import SelectionConfig
from gmts.core.logprobs import TokenStatistics
from gmts.train.batch import ScoredBatch, TrainBatch
from gmts.train.config import TrainConfig
from gmts.train.correction import RolloutCorrection
from gmts.train.run_parts import Optimization
from gmts.train.scoring import TokenScorer, needs_logit_grad_norm
from gmts.train.update import UpdateResult, train_minibatch


def score_rollout(
    model: torch.nn.Module,
    reference: Any,
    rollout: TrainBatch,
    *,
    scorer: TokenScorer,
    selection: SelectionConfig,
    correction: RolloutCorrection,
    micro_batch_size: int,
    single_pass: bool,
) -> tuple[ScoredBatch, TokenStatistics | None]:
    """Steps 2-3: the batch scored by the reference (None without KL) and the rollout policy,
    with the rollout correction's weights computed once; and, when ``single_pass`` (one
    update on one micro-batch), that update's own forward (with gradients), which its loss
    reuses (None otherwise: the old statistics come from a no-grad pass)."""
    ref = None
    if reference is not None:  # the frozen starting policy, no grad
        ref = scorer.no_grad(reference, rollout, micro_batch_size=micro_batch_size).logprobs
    grad_norms = needs_logit_grad_norm(selection)
    forward = None
    if single_pass:
        forward = old = scorer(model, rollout, logit_grad_norm=grad_norms)
    else:
        old = scorer.no_grad(
            model, rollout, micro_batch_size=micro_batch_size, logit_grad_norm=grad_norms
        )
    return rollout.scored(old, ref, correction), forward


def update_policy(
    model: torch.nn.Module,
    batch: ScoredBatch,
    *,
    cfg: TrainConfig,
    parts: Optimization,
    strategy: Any,
    step: int,
    forward: TokenStatistics | None,
) -> list[UpdateResult]:
    """Step 4: for each epoch, for each mini-batch (consecutive rows, groups whole): the
    current policy's scores, ONE global selection, one global divisor, micro-batched
    backward, one optimizer step and one step of the LR schedule."""
    opt_step = step * parts.minibatches * cfg.optim.epochs  # seeds the random score
    rows = parts.rows_per_minibatch
    updates: list[UpdateResult] = []
    for epoch in range(cfg.optim.epochs):
        for i in range(parts.minibatches):
            result = train_minibatch(
                model,
                parts.optimizer,
                batch.rows(slice(i * rows, (i + 1) * rows)),
                scorer=parts.scorer,
                selection=cfg.selection,
                loss=parts.loss,
                micro_batch_size=cfg.optim.micro_batch_size,
                grad_clip=cfg.optim.grad_clip,
                strategy=strategy,
                step=opt_step,
                policy_changed=(epoch, i) != (0, 0),
                overlap=cfg.logging.overlap_metrics,
                forward=forward,
            )
            updates.append(result)
            with warnings.catch_warnings():  # a skipped (non-finite) step still advances
                warnings.simplefilter("ignore", UserWarning)
                parts.scheduler.step()
            opt_step += 1
    return updates
