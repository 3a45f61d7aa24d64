"""One step's row of ``metrics.jsonl``, from the step's records: the rollout's sums, the
rollout policy's entropy, the engine's log-prob gap and correction weights, the updates' sums,
the schedule and the step's times. Every figure is over all ranks."""

from __future__ import annotations

import torch

from gmts.core.distributed import all_reduce_sum
from gmts.scale.distributed import DistInfo
from gmts.train.batch import ScoredBatch
from gmts.train.collect import CollectedBatch
from gmts.train.config import RolloutConfig
from gmts.train.correction import RolloutCorrection
from gmts.train.rollout_engine import logprob_gap_metrics
from gmts.train.sources import DatasetSource, QuestionSource
from gmts.train.update import UpdateResult, update_metrics


def step_row(
    collected: CollectedBatch,
    batch: ScoredBatch,
    updates: list[UpdateResult],
    *,
    rollout: RolloutConfig,
    correction: RolloutCorrection,
    engine_metrics: dict[str, float],
    info: DistInfo,
    skipped_before: int,
    lr: float,
    source: QuestionSource,
    times: tuple[float, float],
) -> dict[str, float]:
    """The step's metrics; ``skipped_before``: the run's non-finite updates before this step,
    ``lr``: the learning rate after it, ``times``: the rollout's and the whole step's seconds."""
    metrics = collected.metrics(rollout)
    mask = batch.response_mask
    entropy = all_reduce_sum(
        torch.stack([(batch.old_entropy.double() * mask).sum(), mask.sum().double()]),
        info.group,
    )
    metrics["policy/entropy"] = (entropy[0] / entropy[1].clamp_min(1)).item()
    metrics.update(logprob_gap_metrics(batch, info))  # {} unless the engine records them
    metrics.update(correction_metrics(batch, correction, info))
    metrics.update(engine_metrics)
    metrics.update(update_metrics(updates))
    metrics["update/skipped_total"] = skipped_before + metrics["update/skipped_nonfinite"]
    metrics["optim/lr"] = lr
    if isinstance(source, DatasetSource):
        metrics["data/skipped_too_long"] = float(source.skipped_too_long)
    t_rollout, step_time = times
    metrics["time/rollout_s"] = t_rollout
    metrics["time/update_s"] = step_time - t_rollout
    metrics["time/step_s"] = step_time
    metrics["time/tokens_per_s"] = metrics["response/tokens"] / max(step_time, 1e-9)
    return metrics


def correction_metrics(
    batch: ScoredBatch, correction: RolloutCorrection, info: DistInfo
) -> dict[str, float]:
    """``rollout/is_weight_mean`` and ``rollout/is_weight_capped_fraction`` over every rank's
    valid tokens (the rollout policy's weights; {} without a correction)."""
    if batch.importance_weights is None:
        return {}
    sums = correction.metrics(batch.importance_weights, batch.response_mask)
    total = all_reduce_sum(
        torch.tensor([sums["sum"], sums["capped"], sums["tokens"]], dtype=torch.float64),
        info.group,
    ).tolist()
    tokens = max(total[2], 1.0)
    return {
        "rollout/is_weight_mean": total[0] / tokens,
        "rollout/is_weight_capped_fraction": total[1] / tokens,
    }
