"""DAPO's dynamic sampling keeps a group unless its answers are all correct or all wrong,
decided on the raw reward: the soft overlong penalty must not make an all-wrong group with one
long answer look informative (it would train on length alone)."""

from __future__ import annotations

import math

import pytest
import torch

from gmts.core.advantages import dynamic_sampling_keep
from gmts.embedded.tokenizer import build_char_tokenizer
from gmts.sampling.rollout import rollout_from_responses
from gmts.scale.distributed import DistInfo
from gmts.train.collect import collect_batch
from gmts.train.config import RolloutConfig

G = 4


class _Problem:
    def __init__(self, prompt: str, answer: str) -> None:
        self.prompt, self.answer = prompt, answer


class _Source:
    """Two questions per round, always the same."""

    def next(self, n: int) -> list[_Problem]:
        return [_Problem("1+1=", "2"), _Problem("2+2=", "4")][:n]


class _Engine:
    """Question 1: four wrong answers, one of them overlong (runs to the budget); question 2:
    one right answer among four."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def sample(self, problems, *, num_samples, max_new_tokens, temperature, seed):
        eos = self.tokenizer.eos_token_id
        t = self.tokenizer.convert_tokens_to_ids
        wrong, right, long = [t("3"), eos], [t("4"), eos], [t("9")] * max_new_tokens
        responses = [wrong, wrong, long, wrong] + [right, wrong, wrong, wrong]
        return rollout_from_responses(
            self.tokenizer,
            prompts=[p.prompt for p in problems],
            answers=[p.answer for p in problems],
            encoded=[self.tokenizer.encode(p.prompt) for p in problems],
            responses=responses,
            num_samples=num_samples,
            stop_ids=[eos],
            pad_id=self.tokenizer.pad_token_id,
        )


def _exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def _collect(r: RolloutConfig):
    return collect_batch(
        _Engine(build_char_tokenizer()),
        _Source(),
        _exact,
        r,
        seed=0,
        step=0,
        max_new_tokens=8,
        info=DistInfo(),
        device=torch.device("cpu"),
    )


def test_an_all_wrong_group_with_one_overlong_answer_is_dropped():
    r = RolloutConfig(
        questions_per_batch=2,
        group_size=G,
        dynamic_sampling=True,
        max_sampling_rounds=1,  # one round: what the filter drops is topped up and counted
        overlong_buffer=4,
        overlong_penalty=1.0,
    )
    collected = _collect(r)
    metrics = collected.metrics(r)
    # kept: question 2 only; question 1 comes back only as a top-up, after it (the round limit)
    assert metrics["sampling/kept_group_fraction"] == 0.5
    assert metrics["sampling/topped_up_groups"] == 1.0
    rewards, advantages = collected.batch.rewards, collected.batch.advantages
    assert rewards[:G].tolist() == [1.0, 0.0, 0.0, 0.0]
    # question 1's penalised rewards differ (0, 0, -1, 0): a filter on them would have kept it
    penalised = rewards[G:]
    assert penalised.tolist() == [0.0, 0.0, -1.0, 0.0]
    assert bool(dynamic_sampling_keep(penalised, G).all())
    # the kept group trains on correctness; the top-up carries no signal, not even length's
    # (its penalised rewards would give it A = [0.5, 0.5, -1.5, 0.5])
    assert advantages[:G].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert advantages[G:].tolist() == [0.0] * G


def test_advantage_std_reaches_the_batch():
    """rollout.advantage_std is the std the trainer's advantages use: population (np.std, the
    authors' code) divides by G, unbiased by G - 1, so unbiased / population = sqrt((G-1)/G)."""
    kw = dict(questions_per_batch=2, group_size=G, dynamic_sampling=False)
    unbiased = _collect(RolloutConfig(advantage_std="unbiased", **kw)).batch
    population = _collect(RolloutConfig(advantage_std="population", **kw)).batch
    assert torch.equal(unbiased.rewards, population.rewards)
    signal = population.advantages[G:]  # question 2: one right answer among four
    assert bool((signal != 0).all())
    ratio = unbiased.advantages[G:] / signal
    assert ratio.tolist() == pytest.approx([math.sqrt((G - 1) / G)] * G, rel=1e-5)
    assert population.advantages[G:].tolist() == pytest.approx(
        [3**0.5, *[-(3**-0.5)] * 3], rel=1e-5
    )
