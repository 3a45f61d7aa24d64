"""Rollout collection: sampling, rewards, DAPO dynamic sampling, advantages -> TrainBatch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from gmts.core.advantages import dynamic_sampling_keep, group_advantages
from gmts.core.distributed import all_reduce_sum
from gmts.sampling.sampler import Sampler
from gmts.scale.distributed import DistInfo
from gmts.train.batch import TrainBatch
from gmts.train.config import RolloutConfig
from gmts.train.sources import QuestionSource, RewardFn, score_rewards


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
    """The sampling seed of one rollout round: a function of the step, so resumed runs repeat
    (the vllm engine seeds each row's request from it and the row)."""
    return (seed * 1_000_003 + step * 7_919 + round_ * 104_729 + rank * 15_485_863) % (2**31 - 1)


@dataclass(frozen=True)
class RolloutStats:
    """Sums over one step's rollout (this rank's, or every rank's after :meth:`reduced`).

    Attributes:
        answers: rows in the batch. reward_sum / raw_reward_sum: final rewards (overlong
        penalty included) / before it. rewarded: answers with raw reward > 0.
        length_sum: response lengths (EOS included). truncated: answers without EOS.
        reward_errors: answers whose reward function raised or was not finite (they got 0).
        generated_groups: groups sampled over all rounds. varied_groups: those of them whose
        raw rewards were not all equal (the only groups with a learning signal).
        topped_up_groups: dropped groups put back at the round limit. response_tokens: valid
        response tokens in the batch.
    """

    answers: float
    reward_sum: float
    raw_reward_sum: float
    rewarded: float
    length_sum: float
    truncated: float
    reward_errors: float
    generated_groups: float
    varied_groups: float
    topped_up_groups: float
    response_tokens: float

    def reduced(self, info: DistInfo) -> RolloutStats:
        """The sums over every rank (one all-reduce of the fields in order)."""
        values = torch.tensor(dataclasses.astuple(self), dtype=torch.float64)
        return RolloutStats(*all_reduce_sum(values, info.group).tolist())


@dataclass(frozen=True)
class AnswerSample:
    """One sampled answer, as text: what a warning shows of a step's rollout."""

    prompt: str
    completion: str
    answer: str


@dataclass(frozen=True)
class CollectedBatch:
    """One step's rollout: this rank's batch, the global sums, the rounds it took, and this
    rank's first sampled answer."""

    batch: TrainBatch
    stats: RolloutStats
    rounds: int
    sample: AnswerSample | None = None

    def metrics(self, r: RolloutConfig) -> dict[str, float]:
        """The ``reward/*``, ``response/*`` and ``sampling/*`` rows of ``metrics.jsonl``."""
        s, n = self.stats, max(self.stats.answers, 1.0)
        out = {
            "reward/mean": s.reward_sum / n,
            "reward/raw_mean": s.raw_reward_sum / n,
            "reward/accuracy": s.rewarded / n,
            "reward/errors": s.reward_errors,
            "response/length_mean": s.length_sum / n,
            "response/truncated_fraction": s.truncated / n,
            "response/tokens": s.response_tokens,
            "sampling/rounds": float(self.rounds),
        }
        if r.dynamic_sampling:
            kept = s.answers / r.group_size - s.topped_up_groups
            generated = s.generated_groups
            out["sampling/kept_group_fraction"] = kept / generated if generated else 0.0
            out["sampling/topped_up_groups"] = s.topped_up_groups
        return out


@dataclass
class _Rounds:
    """What the sampling rounds of one step gathered on this rank (mutated round by round).

    ``kept`` and ``dropped`` hold ``(rollout, reward, raw reward)`` triples: the groups taken
    into the batch, and the groups DAPO's filter dropped (kept for a top-up at the round limit).
    ``have`` counts the groups taken, ``generated`` the groups sampled, ``varied`` those whose
    raw rewards were not all equal, ``errors`` the reward calls that failed.
    """

    kept: list[tuple[Any, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    dropped: list[tuple[Any, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    have: int = 0
    generated: int = 0
    varied: int = 0
    errors: int = 0
    rounds: int = 0
    sample: AnswerSample | None = None


def collect_batch(
    engine: Sampler,
    source: QuestionSource,
    reward_fn: RewardFn,
    r: RolloutConfig,
    *,
    seed: int,
    step: int,
    max_new_tokens: int,
    info: DistInfo,
    device: torch.device,
) -> CollectedBatch:
    """This rank's rollout batch for ``step`` (on ``device``) and its global sums, sampled by
    ``engine`` (the trainer's :class:`gmts.train.rollout_engine.RolloutEngine`, or any
    sampler); call it inside ``engine.session()``.

    Every rank draws the same ``questions_per_batch`` questions from ``source`` each round and
    generates for its contiguous slice. With dynamic sampling, groups whose rewards are all
    equal are dropped and further rounds run (collectively: every rank runs the same number of
    rounds, so the sources stay identical) until every rank is full or
    ``max_sampling_rounds`` is reached; then dropped groups top the batch up, with advantage 0
    (they carry no correctness signal: verl's DAPO recipe raises an error at its limit instead).
    """
    n_local = r.questions_per_batch // info.world_size
    acc = _Rounds()
    while True:
        problems = source.next(r.questions_per_batch)  # identical on every rank
        if acc.have < n_local:
            mine = problems[info.rank * n_local : (info.rank + 1) * n_local]
            roll = engine.sample(
                mine,
                num_samples=r.group_size,
                max_new_tokens=max_new_tokens,
                temperature=r.temperature,
                seed=sampling_seed(seed, step, acc.rounds, info.rank),
            )
            _take_groups(acc, roll, reward_fn, r, n_local=n_local, max_new_tokens=max_new_tokens)
        acc.rounds += 1
        missing = all_reduce_sum(torch.tensor([float(n_local - acc.have)]), info.group).item()
        if not r.dynamic_sampling or missing == 0 or acc.rounds >= r.max_sampling_rounds:
            break
    topped_up = n_local - acc.have
    filtered_rows = acc.have * r.group_size  # the rows the filter kept; top-ups come after them
    _top_up(acc, n_local, r.group_size)
    batch, stats = _assemble(acc, r, filtered_rows, topped_up, group_offset=info.rank * n_local)
    return CollectedBatch(batch.to(device), stats.reduced(info), acc.rounds, acc.sample)


def _take_groups(
    acc: _Rounds,
    roll: Any,
    reward_fn: RewardFn,
    r: RolloutConfig,
    *,
    n_local: int,
    max_new_tokens: int,
) -> None:
    """Score one round's rollout and take its groups into ``acc``: DAPO's filter keeps a group
    unless its answers are all correct or all wrong, and only as many as the batch still needs
    are taken; the filtered-out groups are set aside for a top-up."""
    G = r.group_size
    raw, errors = score_rewards(reward_fn, roll.completions, roll.answers)
    acc.errors += errors
    varied = dynamic_sampling_keep(raw, G)  # (groups,): answers not all correct or all wrong
    acc.varied += int(varied.sum())
    if acc.sample is None and roll.completions:
        prompt = roll.prompts[0] if roll.prompts else ""
        acc.sample = AnswerSample(prompt, roll.completions[0], str(roll.answers[0]))
    reward = raw + overlong_penalty(
        roll.response_lengths, max_new_tokens, r.overlong_buffer, r.overlong_penalty
    )
    # decided on the raw reward, before the overlong penalty (verl's recipe:
    # filter_groups.metric=acc), so an all-wrong group with one long answer is not kept to train
    # on length alone
    keep = varied if r.dynamic_sampling else torch.ones_like(varied)
    take = keep.clone()
    take[keep.cumsum(0) > n_local - acc.have] = False  # only as many as still needed
    rows_take, rows_drop = take.repeat_interleave(G), (~keep).repeat_interleave(G)
    if take.any():
        acc.kept.append((roll.select(rows_take), reward[rows_take], raw[rows_take]))
    if rows_drop.any():
        acc.dropped.append((roll.select(rows_drop), reward[rows_drop], raw[rows_drop]))
    acc.have += int(take.sum())
    acc.generated += len(varied)


def _top_up(acc: _Rounds, n_local: int, G: int) -> None:
    """At the round limit: fill the batch with dropped groups, in the order they were drawn."""
    for roll, reward, raw in acc.dropped:
        if acc.have >= n_local:
            break
        n = min(roll.num_groups, n_local - acc.have)
        rows = torch.arange(n * G)
        acc.kept.append((roll.select(rows), reward[rows], raw[rows]))
        acc.have += n


def _assemble(
    acc: _Rounds, r: RolloutConfig, filtered_rows: int, topped_up: int, *, group_offset: int
) -> tuple[TrainBatch, RolloutStats]:
    """The batch of the kept groups (the filter's first, then ``topped_up`` top-up groups from
    row ``filtered_rows``), with group advantages, and this rank's sums."""
    from gmts.sampling.rollout import Rollout

    roll = Rollout.concat([k[0] for k in acc.kept]).to("cpu")
    reward = torch.cat([k[1] for k in acc.kept])
    raw = torch.cat([k[2] for k in acc.kept])
    advantages = group_advantages(
        reward, r.group_size, std_normalize=r.std_normalize, std=r.advantage_std
    )
    # A top-up group was dropped because its answers are all correct or all wrong: it carries
    # no correctness signal, so it gets advantage 0 even where the overlong penalty made its
    # rewards differ (its penalised advantages would train on length alone)
    advantages[filtered_rows:] = 0.0
    batch = TrainBatch.from_rollout(roll, reward, advantages, group_offset=group_offset)
    stats = RolloutStats(
        answers=float(len(reward)),
        reward_sum=float(reward.sum()),
        raw_reward_sum=float(raw.sum()),
        rewarded=float((raw > 0).sum()),
        length_sum=float(roll.response_lengths.sum()),
        truncated=float((~roll.finished).sum()),
        reward_errors=float(acc.errors),
        generated_groups=float(acc.generated),
        varied_groups=float(acc.varied),
        topped_up_groups=float(topped_up),
        response_tokens=float(roll.response_mask.sum()),
    )
    return batch, stats
