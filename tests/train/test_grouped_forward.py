"""The grouped forward layout (model.forward_layout=grouped) against the padded one, its
reference: the same log-probs, entropies, logit-gradient norms, loss and gradients (relative
1e-5 in float32) on random grouped rows (random prompt lengths with left padding, random
response lengths, random group sizes, pad id = EOS), on the embedded tiny model (GPT-2) and on
a random model of SmolLM2's architecture; with activation checkpointing; under FSDP2 on two
processes whose plans need different numbers of calls; on the real SmolLM2 (slow). And the
plan: buckets within 10% of the real positions, splits that keep that bound, bad masks named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gmts.train.forward_plan import length_buckets, padded_positions, plan_forward
from gmts.train.scoring import TokenScorer

from file_modules import load_module

HERE = Path(__file__).resolve().parent
_rows = load_module(HERE / "_rows.py", "_rows")
_tiny = load_module(HERE / "_tiny.py", "_tiny")

SMOLLM2_ARCHITECTURE = dict(  # SmolLM2-135M-Instruct's config.json, but for the sizes
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    rms_norm_eps=9.999999747378752e-06,
    rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
SMOLLM2_TINY_SIZES = dict(  # 9 heads / 3 KV heads of 64 in the real one: grouped-query 3:1 kept
    vocab_size=97,
    hidden_size=96,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=64,
)


def _embedded_model() -> tuple[torch.nn.Module, int, int]:
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_heads=2, seed=0))
    return model.train(), len(tokenizer), tokenizer.eos_token_id


def _smollm2_architecture_model() -> tuple[torch.nn.Module, int, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_ARCHITECTURE, **SMOLLM2_TINY_SIZES)
    return LlamaForCausalLM(config).train(), config.vocab_size, config.eos_token_id


MODELS = {"embedded": _embedded_model, "smollm2-architecture": _smollm2_architecture_model}


def _forward_backward(model, rows, layout: str) -> dict[str, torch.Tensor]:
    """Statistics (on the real positions), a weighted log-prob loss and its gradients."""
    model.zero_grad(set_to_none=True)
    stats = TokenScorer(layout=layout)(model, rows, logit_grad_norm=True)
    mask = rows.response_mask
    weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape)  # (B, T), signed
    loss = (stats.logprobs * weights * mask).sum()
    loss.backward()
    out = {
        "loss": loss.detach(),
        "logprobs": stats.logprobs.detach()[mask],
        "entropy": stats.entropy[mask],
        "logit_grad_norm": stats.logit_grad_norm[mask],
        "outside": torch.stack([stats.logprobs.detach(), stats.entropy])[:, ~mask],
    }
    for name, param in model.named_parameters():
        out[f"grad {name}"] = param.grad.clone()
    return out


def _assert_relative(got: dict, want: dict, rtol: float = 1e-5) -> None:
    for key in want:
        if key == "outside":
            continue
        a, b = got[key].double(), want[key].double()
        assert a.shape == b.shape, key
        scale = float(b.norm()) or 1.0
        assert float((a - b).norm()) <= rtol * scale, (key, float((a - b).norm()) / scale)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_grouped_equals_padded_with_gradients(name, seed):
    model, vocab, eos = MODELS[name]()
    rows = _rows.random_rows(seed, vocab=vocab, eos=eos)
    padded = _forward_backward(model, rows, "padded")
    grouped = _forward_backward(model, rows, "grouped")
    _assert_relative(grouped, padded)
    assert all(float(v.norm()) > 0 for k, v in padded.items() if k.startswith("grad "))
    assert torch.equal(grouped["outside"], torch.zeros_like(grouped["outside"]))  # 0 past a row


def _rms_norm_in_input_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama's RMSNorm computed in the input's dtype (it upcasts to float32 only)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def rms_norm(self, hidden):  # (B, L, H)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(LlamaRMSNorm, "forward", rms_norm)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grouped_equals_padded_to_float64_rounding(name, monkeypatch):
    """In float64 the two layouts agree to 1e-12: the grouped one is exact, not merely close
    (Llama's RMSNorm computes in float32 whatever the model's dtype, so here it is made to
    compute in float64: with it, float32 rounding would show as 1e-8)."""
    _rms_norm_in_input_dtype(monkeypatch)
    model, vocab, eos = MODELS[name]()
    model = model.double()
    for seed in range(3):
        rows = _rows.random_rows(seed, vocab=vocab, eos=eos)
        _assert_relative(
            _forward_backward(model, rows, "grouped"),
            _forward_backward(model, rows, "padded"),
            rtol=1e-12,
        )


def test_shared_prompts_are_computed_once_and_padding_not_at_all():
    rows = _rows.grouped_rows(
        seed=0,
        vocab=17,
        eos=15,
        prompt_lengths=[12, 7],
        response_lengths=[[20, 19, 19, 4], [3, 1, 0]],
        width=14,
        budget=24,
    )
    plan = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
    first, second = plan.row_prompt[0].item(), plan.row_prompt[4].item()
    assert first != second and plan.row_prompt.tolist() == [first] * 4 + [second] * 3
    assert plan.prompt_lengths[first] == 12 and plan.prompt_lengths[second] == 7
    # 12 and 7 are too far apart to share a call (2 x 12 > 1.1 x 19); the rows feed
    # length - 1 tokens: 19, 18, 18 together (57 <= 1.1 x 55), then 3 and 2 apart
    # (2 x 3 > 1.1 x 5), none for lengths 1 and 0
    assert plan.prompt_buckets == ((first,), (second,))
    assert plan.response_buckets == ((0, 1, 2), (3,), (4,))
    positions = plan.positions
    assert positions.computed == 12 + 7 + 3 * 19 + 3 + 2
    assert positions.real == 12 + 7 + (20 + 19 + 19 + 4) + (3 + 1 + 0)
    assert padded_positions(rows.prompt_ids, rows.prompt_mask, rows.response_mask).computed == (
        7 * (14 + 24)
    )
    scorer = TokenScorer()
    assert scorer.positions(rows) == positions


@pytest.mark.parametrize("seed", range(20))
def test_buckets_cover_every_length_once_within_ten_percent(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(
        1,
        1 + int(torch.randint(1, 200, (1,), generator=g)),
        (int(torch.randint(1, 60, (1,), generator=g)),),
        generator=g,
    ).tolist()
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
        assert 10 * len(b) * lengths[b[0]] <= 11 * sum(lengths[i] for i in b)


def test_bucket_rule_by_hand():
    # 10, 10, 9 fit (30 <= 31.9); adding 5 would not (40 > 37.4); 5 and 1 apart (10 > 6.6)
    assert length_buckets([5, 10, 1, 10, 9]) == [[1, 3, 4], [0], [2]]
    assert length_buckets([4, 4, 4]) == [[0, 1, 2]]
    with pytest.raises(ValueError, match=">= 1"):
        length_buckets([3, 0])


@pytest.mark.parametrize("seed", range(10))
def test_a_split_plan_keeps_its_positions_and_bound(seed):
    rows = _rows.random_rows(seed, vocab=17, eos=15, width=12, budget=30)
    plan = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
    split = plan.split(plan.calls + 3)
    assert split.positions.real == plan.positions.real
    assert split.positions.computed <= plan.positions.computed  # a split only drops padding
    one_each = len(plan.prompt_lengths) + sum(n > 0 for n in plan.fed_lengths)
    assert split.calls == min(plan.calls + 3, one_each)
    assert sorted(i for b in split.response_buckets for i in b) == sorted(
        i for b in plan.response_buckets for i in b
    )
    for buckets, lengths in (
        (split.response_buckets, split.fed_lengths),
        (split.prompt_buckets, split.prompt_lengths),
    ):
        for b in buckets:
            assert 10 * len(b) * lengths[b[0]] <= 11 * sum(lengths[i] for i in b)


def test_masks_that_are_not_left_and_right_padding_are_named():
    rows = _rows.grouped_rows(
        seed=0, vocab=17, eos=15, prompt_lengths=[3], response_lengths=[[2]], width=4, budget=4
    )
    right_padded_prompt = rows.prompt_mask.flip(1)
    with pytest.raises(ValueError, match="prompt_mask must be left padding"):
        plan_forward(rows.prompt_ids, right_padded_prompt, rows.response_mask)
    with pytest.raises(ValueError, match="response_mask must be right padding"):
        plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask.flip(1))
    with pytest.raises(ValueError, match="at least one prompt token"):
        plan_forward(rows.prompt_ids, torch.zeros_like(rows.prompt_mask), rows.response_mask)


def test_an_unknown_layout_lists_the_valid_ones():
    with pytest.raises(ValueError, match="grouped, padded"):
        TokenScorer(layout="packed")


def test_a_sliding_window_model_is_refused_before_its_weights_load():
    from transformers import MistralConfig

    from gmts.train.scoring import check_forward_layout

    config = MistralConfig(sliding_window=16, num_hidden_layers=2)
    with pytest.raises(ValueError, match="model.forward_layout=padded"):
        check_forward_layout("grouped", config)
    check_forward_layout("padded", config)  # any causal LM


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradient_checkpointing_is_kept_and_exact(name):
    """Hugging Face drops a cache under checkpointing; the grouped calls checkpoint the layers
    themselves: each attention runs twice with gradients (forward, replay), the results are the
    padded layout's without checkpointing, and the model's flags are back afterwards."""
    from gmts.models.loading import _enable_activation_checkpointing

    model, vocab, eos = MODELS[name]()
    rows = _rows.random_rows(7, vocab=vocab, eos=eos)
    padded = _forward_backward(model, rows, "padded")
    _enable_activation_checkpointing(model)
    attention = [m for n, m in model.named_modules() if n.endswith(("attn", "self_attn"))]
    runs = []
    for module in attention:
        module.register_forward_hook(lambda *_: runs.append(1))
    grouped = _forward_backward(model, rows, "grouped")
    _assert_relative(grouped, padded)
    plan = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
    assert len(runs) == 2 * len(attention) * plan.calls  # every call replayed in backward
    flags = [
        m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing")
    ]
    assert flags and all(flags)
    assert not any("forward" in vars(m) for m in model.modules())


def test_no_grad_micro_batches_equal_the_padded_layout():
    model, vocab, eos = _embedded_model()
    rows = _rows.random_rows(3, vocab=vocab, eos=eos)
    mask = rows.response_mask
    got = [
        TokenScorer(layout=layout).no_grad(model, rows, micro_batch_size=3, logit_grad_norm=True)
        for layout in ("padded", "grouped")
    ]
    for field in ("logprobs", "entropy", "logit_grad_norm"):
        a, b = (getattr(s, field)[mask] for s in got)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fsdp2_two_processes_with_different_numbers_of_calls(tmp_path, free_port):
    """The ranks agree on the number of calls (a rank splits a bucket, or makes one-token calls
    when it has nothing to split): no hang, and the gradients summed over the ranks and each
    rank's log-probs are the padded layout's (checkpointing on)."""
    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={free_port}",
            str(HERE / "_grouped_fsdp_worker.py"),
            str(model_dir),
            str(tmp_path),
        ],
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for rank in ranks:
        for batch, want in rank["padded"]["logprobs"].items():
            torch.testing.assert_close(
                rank["grouped"]["logprobs"][batch], want, rtol=1e-5, atol=1e-6
            )
    padded, grouped = ranks[0]["padded"]["grads"], ranks[0]["grouped"]["grads"]
    _assert_relative(grouped, padded)
    calls = [rank["grouped"]["calls"] for rank in ranks]
    assert calls[0]["split"]["calls"] == calls[1]["split"]["calls"] == calls[1]["split"]["planned"]
    assert calls[0]["split"]["planned"] < calls[0]["split"]["calls"]  # rank 0 split its bucket
    assert calls[1]["filler"]["planned"] == 1 < calls[1]["filler"]["calls"]  # one-token calls
    assert calls[0]["filler"]["calls"] == calls[1]["filler"]["calls"]


@pytest.mark.slow  # converts the real model into $GMTS_CACHE on first use (about 40 s)
def test_on_the_real_smollm2(real_model, monkeypatch):
    """SmolLM2-135M-Instruct itself: in float32 the grouped log-probs of a few rows are the
    padded ones (relative 1e-5); in float64 (RMSNorm too) the log-probs and gradients agree to
    1e-12. (Its float32 gradients differ by float32 rounding summed in another order: measured
    1.9e-5 relative over all parameters, where the same rows padded wider give 2.4e-6.)"""
    from gmts.models.loading import load_model

    config = json.loads((Path(real_model) / "config.json").read_text())
    assert {k: config[k] for k in SMOLLM2_ARCHITECTURE} == SMOLLM2_ARCHITECTURE
    assert config["num_attention_heads"] // config["num_key_value_heads"] == 3
    model = load_model(real_model)
    rows = _rows.grouped_rows(
        seed=0,
        vocab=config["vocab_size"],
        eos=config["eos_token_id"],
        prompt_lengths=[11, 6],
        response_lengths=[[9, 4, 1], [7, 7]],
        width=12,
        budget=10,
    )
    with torch.no_grad():
        padded, grouped = (
            TokenScorer(layout=layout)(model, rows).logprobs[rows.response_mask]
            for layout in ("padded", "grouped")
        )
    assert float((grouped - padded).norm()) <= 1e-5 * float(padded.norm())
    _rms_norm_in_input_dtype(monkeypatch)
    model = model.double()
    _assert_relative(
        _forward_backward(model, rows, "grouped"), _forward_backward(model, rows, "padded"), 1e-12
    )
