"""Rollout collection: sampling, rewards, DAPO dynamic sampling, advantages -> TrainBatch."""

from __future__ import annotations

import math
from typing import Any

import torch

from gmts.core.advantages import dynamic_sampling_keep, group_advantages
from gmts.rewards.sandbox import SandboxUnavailableError
from gmts.train.batch import TrainBatch
from gmts.train.config import RolloutConfig
from gmts.train.distributed import DistInfo, all_reduce_sum
from gmts.train.sources import QuestionSource, RewardFn


def score_rewards(
    reward_fn: RewardFn, completions: list[str], answers: list[str]
) -> tuple[torch.Tensor, int]:
    """``(B,)`` float32 rewards and the number of samples whose reward function raised or
    returned a non-finite value (those get 0: one bad verifier call never stops a run). A
    ``SandboxUnavailableError`` (code rewards without their sandbox) is raised, not counted."""
    values, errors = [], 0
    for completion, answer in zip(completions, answers):
        try:
            value = float(reward_fn(completion, answer))
            if not math.isfinite(value):
                raise ValueError("non-finite reward")
        except SandboxUnavailableError:  # no sandbox: every code reward would be a silent 0
            raise
        except Exception:  # any failure of a user reward: 0 for this sample, counted
            value, errors = 0.0, errors + 1
        values.append(value)
    return torch.tensor(values, dtype=torch.float32), errors


def overlong_penalty(
    lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float
) -> torch.Tensor:
    """DAPO soft overlong punishment for ``(B,)`` response lengths: 0 up to
    ``L_max - L_cache``, then linear down to ``-penalty`` at ``L_max`` (L_cache = ``buffer``)."""
    if buffer == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    start = max_new_tokens - buffer
    frac = ((lengths.float().cpu() - start) / buffer).clamp(0.0, 1.0)
    return -penalty * frac


def sampling_seed(seed: int, step: int, round_: int, rank: int) -> int:
    """The sampling seed of one rollout round: a function of the step, so resumed runs repeat."""
    return (seed * 1_000_003 + step * 7_919 + round_ * 104_729 + rank * 15_485_863) % (2**31 - 1)


def collect_batch(
    model: Any,
    tokenizer: Any,
    source: QuestionSource,
    reward_fn: RewardFn,
    r: RolloutConfig,
    *,
    seed: int,
    step: int,
    max_new_tokens: int,
    info: DistInfo,
    device: torch.device,
) -> tuple[TrainBatch, dict[str, float]]:
    """This rank's rollout batch for ``step`` and its metrics (global over ranks).

    Every rank draws the same ``questions_per_batch`` questions from ``source`` each round and
    generates for its contiguous slice. With dynamic sampling, groups whose rewards are all
    equal are dropped and further rounds run (collectively: every rank runs the same number of
    rounds, so the sources stay identical) until every rank is full or
    ``max_sampling_rounds`` is reached; then dropped groups top the batch up.
    """
    from gmts.train.rollout import Rollout, generate_rollouts

    G = r.group_size
    n_local = r.questions_per_batch // info.world_size
    kept: list[tuple[Any, torch.Tensor, torch.Tensor]] = []  # (rollout, reward, raw reward)
    dropped: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
    have = generated = errors = 0
    rounds = 0
    while True:
        problems = source.next(r.questions_per_batch)  # identical on every rank
        mine = problems[info.rank * n_local : (info.rank + 1) * n_local]
        if have < n_local:
            roll = generate_rollouts(
                model,
                tokenizer,
                mine,
                num_samples=G,
                max_new_tokens=max_new_tokens,
                temperature=r.temperature,
                batch_size=r.generation_batch_size,
                seed=sampling_seed(seed, step, rounds, info.rank),
            )
            raw, errs = score_rewards(reward_fn, roll.completions, roll.answers)
            errors += errs
            reward = raw + overlong_penalty(
                roll.response_lengths, max_new_tokens, r.overlong_buffer, r.overlong_penalty
            )
            keep = (
                dynamic_sampling_keep(reward, G)
                if r.dynamic_sampling
                else torch.ones(len(mine), dtype=torch.bool)
            )
            take = keep.clone()
            take[keep.cumsum(0) > n_local - have] = False  # only as many as still needed
            rows_take, rows_drop = take.repeat_interleave(G), (~keep).repeat_interleave(G)
            if take.any():
                kept.append((roll.select(rows_take), reward[rows_take], raw[rows_take]))
            if rows_drop.any():
                dropped.append((roll.select(rows_drop), reward[rows_drop], raw[rows_drop]))
            have += int(take.sum())
            generated += len(mine)
        rounds += 1
        missing = all_reduce_sum(torch.tensor([float(n_local - have)]), info).item()
        if not r.dynamic_sampling or missing == 0 or rounds >= r.max_sampling_rounds:
            break
    topped_up = n_local - have
    for roll, reward, raw in dropped:  # at the round limit: fill with zero-advantage groups
        if have >= n_local:
            break
        n = min(roll.num_groups, n_local - have)
        rows = torch.arange(n * G)
        kept.append((roll.select(rows), reward[rows], raw[rows]))
        have += n
    roll = Rollout.concat([k[0] for k in kept]).to("cpu")
    reward = torch.cat([k[1] for k in kept])
    raw = torch.cat([k[2] for k in kept])
    advantages = group_advantages(reward, G, std_normalize=r.std_normalize)
    batch = TrainBatch.from_rollout(roll, reward, advantages, group_offset=info.rank * n_local)
    lengths = roll.response_lengths.float()
    sums = torch.tensor(
        [
            float(len(reward)),
            float(reward.sum()),
            float(raw.sum()),
            float((raw > 0).sum()),
            float(lengths.sum()),
            float((~roll.finished).sum()),
            float(errors),
            float(generated),
            float(topped_up),
            float(roll.response_mask.sum()),
        ],
        dtype=torch.float64,
    )
    t = all_reduce_sum(sums, info).tolist()
    n = max(t[0], 1.0)
    metrics = {
        "reward/mean": t[1] / n,
        "reward/raw_mean": t[2] / n,
        "reward/accuracy": t[3] / n,
        "reward/errors": t[6],
        "response/length_mean": t[4] / n,
        "response/truncated_fraction": t[5] / n,
        "response/tokens": t[9],
        "sampling/rounds": float(rounds),
    }
    if r.dynamic_sampling:
        metrics["sampling/kept_group_fraction"] = (
            (t[0] / G - t[8]) / max(t[7], 1.0) if t[7] else 0.0
        )
        metrics["sampling/topped_up_groups"] = t[8]
    return batch.to(device), metrics
