"""The vLLM engine wrapper (gmts.sampling.vllm_engine) against the real engine, on the embedded
warm start in float32: the Rollout it builds follows the KV-cached sampler's rules, its
log-probs are the trainer's tempered ones, its seeds are per row, and an in-place weight sync
makes it sample from the new weights.

Runs in .venv-vllm (bash scripts/setup.sh vllm); skips where vllm is not installed. One engine
serves the module (starting one takes 5-20 s on a 2-core CPU).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_tiny import SKIP_REASON, vllm_installed  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON)

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def warm():
    """(path, HF model, tokenizer) of the embedded warm start, float32."""
    from gmts.embedded.warmstart import load_warm_start
    from gmts.models.loading import resolve_model_path

    path = resolve_model_path("embedded")
    model, tokenizer, _ = load_warm_start(path)
    return path, model.float().eval(), tokenizer


@pytest.fixture(scope="module")
def engine(warm):
    from gmts.sampling.vllm_engine import VLLMConfig, VLLMEngine

    engine = VLLMEngine(
        warm[0], VLLMConfig(), dtype="float32", seed=0, on_gpu=False, kv_cache_bytes=32 * 2**20
    )
    yield engine
    engine.close()


def _problems(n: int, seed: int = 0):
    from gmts.embedded.tasks import get_task

    return get_task("addition").sample(n, random.Random(seed))


def _trainer_logprobs(model, rollout, temperature: float) -> torch.Tensor:
    from gmts.train.scoring import TokenScorer

    return TokenScorer(temperature=temperature)(model, rollout).logprobs.detach()


def test_rollout_follows_the_samplers_rules(engine, warm):
    _, model, tokenizer = warm
    problems = _problems(6)  # 1-3 digit operands: prompts of different lengths
    budget = 9  # short: some answers are cut off, others end with EOS
    roll = engine.sample_rollouts(
        tokenizer, problems, num_samples=4, max_new_tokens=budget, temperature=1.0, seed=5
    )
    B, T = roll.response_ids.shape
    assert B == 24 and roll.num_groups == 6 and budget >= T
    assert torch.equal(roll.group_ids, torch.arange(6).repeat_interleave(4))
    # prompts: the tokenizer's ids (nothing added), left-padded
    for row in range(B):
        ids = tokenizer(problems[row // 4].prompt, add_special_tokens=False)["input_ids"]
        assert roll.prompt_ids[row][roll.prompt_mask[row]].tolist() == ids
        assert not roll.prompt_mask[row, : roll.prompt_length - len(ids)].any()
    # responses: the mask from the lengths, EOS kept, nothing after the first EOS
    eos = tokenizer.eos_token_id
    lengths = roll.response_lengths
    assert torch.equal(roll.response_mask, torch.arange(T)[None, :] < lengths[:, None])
    for row in range(B):
        n = int(lengths[row])
        valid = roll.response_ids[row, :n].tolist()
        assert eos not in valid[:-1]
        assert bool(roll.finished[row]) == (valid[-1] == eos)
        assert roll.finished[row] or n == budget
        assert (roll.response_ids[row, n:] == roll.pad_token_id).all()
        assert roll.completions[row] == tokenizer.decode(valid, skip_special_tokens=True)
    assert roll.finished.any() and not roll.finished.all()  # both kinds of row occur
    assert roll.engine_logprobs.shape == (B, T)
    assert (roll.engine_logprobs[~roll.response_mask] == 0).all()
    assert (roll.engine_logprobs[roll.response_mask] < 0).all()


def test_greedy_answers_equal_the_kv_cached_samplers(engine, warm):
    from gmts.sampling.rollout import generate_rollouts

    _, model, tokenizer = warm
    problems = _problems(32, seed=1)
    kwargs = dict(num_samples=1, max_new_tokens=12, temperature=0.0)
    ours = generate_rollouts(model, tokenizer, problems, seed=0, **kwargs)
    theirs = engine.sample_rollouts(tokenizer, problems, seed=0, **kwargs)
    assert theirs.completions == ours.completions
    assert torch.equal(theirs.response_ids, ours.response_ids)
    assert torch.equal(theirs.response_lengths, ours.response_lengths)


def test_engine_logprobs_are_the_trainers_tempered_ones(engine, warm):
    _, model, tokenizer = warm
    roll = engine.sample_rollouts(
        tokenizer, _problems(8), num_samples=4, max_new_tokens=12, temperature=TEMPERATURE, seed=1
    )
    mask = roll.response_mask
    gap = (_trainer_logprobs(model, roll, TEMPERATURE) - roll.engine_logprobs).abs()[mask]
    assert gap.max() <= 1e-4, gap.max()
    # vLLM's default (raw) log-probs would be of the untempered softmax: far off
    untempered = (_trainer_logprobs(model, roll, 1.0) - roll.engine_logprobs).abs()[mask]
    assert untempered.max() > 1e-2


def test_each_row_has_its_own_seed(engine, warm):
    _, _, tokenizer = warm
    problems = _problems(4, seed=2)
    kw = dict(num_samples=3, max_new_tokens=12, temperature=1.0)
    alone = engine.sample_rollouts(tokenizer, problems[:1], seed=9, **kw)
    together = engine.sample_rollouts(tokenizer, problems, seed=9, **kw)
    again = engine.sample_rollouts(tokenizer, problems, seed=9, **kw)
    other = engine.sample_rollouts(tokenizer, problems, seed=10, **kw)
    # a row's answer does not depend on the rows sampled with it, nor on earlier calls
    assert together.completions[:3] == alone.completions
    assert again.completions == together.completions
    assert other.completions != together.completions
    assert len(set(together.completions)) > 1  # the rows of a group differ


def test_weights_sync_in_place(engine, warm):
    """Perturbed weights pushed through Strategy.full_parameters make the engine sample from
    them (gap <= 1e-4 again); before the sync it is far off. The originals are put back."""
    import copy

    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import make_strategy

    _, model, tokenizer = warm
    strategy = make_strategy("replicate", DistInfo(), Precision(), torch.device("cpu"))
    changed = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    kw = dict(num_samples=4, max_new_tokens=12, temperature=1.0, seed=3)

    def gap(policy) -> float:
        roll = engine.sample_rollouts(tokenizer, _problems(8, seed=3), **kw)
        diff = (_trainer_logprobs(policy, roll, 1.0) - roll.engine_logprobs).abs()
        return float(diff[roll.response_mask].max())

    assert gap(changed) > 0.1  # not synced yet
    try:
        engine.load_weights(strategy.full_parameters(changed))
        assert gap(changed) <= 1e-4
    finally:
        engine.load_weights(strategy.full_parameters(model))
    assert gap(model) <= 1e-4


def test_global_state_is_left_alone(engine, warm):
    _, _, tokenizer = warm
    torch.manual_seed(123)
    random.seed(4)
    before, python_before = torch.get_rng_state(), random.getstate()
    engine.sample_rollouts(
        tokenizer, _problems(2), num_samples=2, max_new_tokens=4, temperature=1.0, seed=0
    )
    assert torch.equal(torch.get_rng_state(), before) and random.getstate() == python_before
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # not vLLM's no-op replacement
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
