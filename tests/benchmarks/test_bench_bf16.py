"""benchmarks/bench_bf16.py (bf16 vs float32 on this CPU: the log-prob gap, then the speed)
runs end to end in --quick mode on a random tiny llama, and its gap is the one a plain forward
of the model in both dtypes gives. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH_DIR))
    return load_module(BENCH_DIR / "bench_bf16.py", "gmts_bench_bf16")


def test_quick_mode_writes_the_gap_the_speed_and_auto_s_choice(tmp_path):
    from gmts.scale.auto_dtype import choose_dtype

    bench = _bench()
    assert bench.main(["--quick", "--threads", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "bf16.json").read_text())
    assert record["quick"] is True and record["commit"] and record["command"]
    assert record["machine"]["uptime"] and len(record["load_before"]) == 3
    assert record["auto"] == choose_dtype("auto", torch.device("cpu")).record()
    agree = record["agreement"]
    assert agree["answers"] == 4 and 0 < agree["answer_tokens"] <= 4 * 6
    # bf16 rounds differently, by a little: log-probs of a 64-wide model agree to ~1e-2
    assert 0 < agree["logprob_gap_mean"] <= agree["logprob_gap_max"] < 0.1
    assert agree["entropy_gap_max"] < 0.1 and agree["answer_logprob_gap_max"] < 0.5
    speed = record["speed"]
    assert len(speed["ratio_per_round"]) == 2
    assert all(t > 0 for times in speed["times_s"].values() for t in times)
    assert speed["ratio_min"] <= speed["ratio_median"] <= speed["ratio_max"]


def test_the_gap_is_a_plain_forward_s_in_both_dtypes():
    """The benchmark's agreement against a reference written out: the model called directly,
    float32 and under bf16 autocast, log-softmax of the tempered logits, answer tokens only."""
    bench = _bench()
    model, tokenizer, prompts = bench.load(quick=True)

    class Args:
        questions, group, answer_tokens = 3, 2, 6

    rows = bench.sample_rows(model, tokenizer, prompts, Args)
    agree = bench.agreement(model, rows)
    T = rows.response_ids.shape[1]
    logprobs = {}
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                logits = model(
                    input_ids=rows.input_ids,
                    attention_mask=rows.attention_mask,
                    position_ids=rows.position_ids,
                ).logits
            logits = logits[:, -T - 1 : -1].float() / 0.7  # position P-1+t predicts token t
            per_token = logits.log_softmax(-1).gather(-1, rows.response_ids[..., None])[..., 0]
            logprobs[dtype] = per_token.double()
    gap = (logprobs[torch.bfloat16] - logprobs[torch.float32]).abs()[rows.response_mask]
    assert agree["answer_tokens"] == gap.numel()
    assert agree["logprob_gap_max"] == pytest.approx(gap.max().item(), abs=1e-5)
    assert agree["logprob_gap_mean"] == pytest.approx(gap.mean().item(), abs=1e-5)


@pytest.mark.slow  # converts SmolLM2 into the cache on first use
def test_the_real_prompts_are_the_smollm2_config_s(real_model):
    """The full run's prompts (not run by --quick): the config's dataset in its chat template."""
    from gmts.models.loading import load_tokenizer

    bench = _bench()
    prompts = bench.real_prompts(load_tokenizer(real_model))
    assert len(prompts) > 1000
    assert prompts[0].startswith("<|im_start|>") and "+" in prompts[0]
    assert prompts[0].rstrip().endswith("<|im_start|>assistant")
