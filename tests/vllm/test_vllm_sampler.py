"""The vllm sampler of the sampling protocol (gmts.sampling.sampler) against the real engine, on
the embedded warm start in float32: the sampler's stop rule (``stop_token_ids``, read by every
call) ends the answer there.

Runs in .venv-vllm (bash scripts/setup.sh vllm); skips where vllm is not installed.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_tiny import SKIP_REASON, vllm_installed  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON)


@pytest.fixture(scope="module")
def sampler():
    from gmts.embedded.warmstart import load_warm_start
    from gmts.models.loading import resolve_model_path
    from gmts.sampling.sampler import SamplerInputs, make_sampler
    from gmts.sampling.vllm_engine import VLLMConfig

    path = resolve_model_path("embedded")
    _, tokenizer, _ = load_warm_start(path)
    inputs = SamplerInputs(
        tokenizer,
        model_path=path,
        vllm=VLLMConfig(),
        dtype="float32",
        on_gpu=False,
        kv_cache_bytes=32 * 2**20,
    )
    sampler = make_sampler("vllm", inputs)
    yield sampler
    sampler.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_samplers_stop_id_ends_the_answer_there(sampler, temperature, monkeypatch):
    from gmts.embedded.tasks import get_task
    from gmts.sampling.rollout import resolve_stop_ids

    problems = get_task("addition").sample(8, random.Random(0))
    kw = dict(num_samples=1, max_new_tokens=12, temperature=temperature, seed=4)
    assert sampler.stop_token_ids == resolve_stop_ids(sampler.tokenizer, sampler.generation_config)
    free = sampler.sample(problems, **kw)
    row = max(range(8), key=lambda i: int(free.response_lengths[i]))  # the longest answer
    tokens = free.response_ids[row, : int(free.response_lengths[row])].tolist()
    assert len(tokens) >= 3
    stop = tokens[1]
    end = tokens.index(stop) + 1
    monkeypatch.setattr(sampler, "stop_token_ids", [stop])  # one engine per process
    stopped = sampler.sample([problems[row]], **kw)
    assert stopped.response_ids[0, : int(stopped.response_lengths[0])].tolist() == tokens[:end]
    assert bool(stopped.finished[0])
    assert stopped.completions == [sampler.tokenizer.decode(tokens[:end], skip_special_tokens=True)]
