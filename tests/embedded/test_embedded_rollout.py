"""Batched KV-cached rollout against slow obviously-correct references (no cache, no padding)."""

from __future__ import annotations

import pytest
import torch

from gmts.embedded.tasks import Problem
from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
from gmts.embedded.tokenizer import build_char_tokenizer
from gmts.sampling.rollout import Rollout, generate_rollouts, position_ids_from_mask

PROMPTS = ["7=", "12+5=", "123+456=", "99*9=", "1="]  # different lengths -> left padding


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def models(tok):
    small = dict(num_layers=1, hidden_size=32, num_heads=2, max_positions=32)
    return {
        arch: build_tiny_model(tok, TinyModelConfig(architecture=arch, seed=3, **small)).eval()
        for arch in ("gpt2", "llama")
    }


def _reference_greedy(model, tok, prompt: str, max_new_tokens: int, stop=None) -> list[int]:
    """One prompt, no padding, no cache: recompute the whole sequence at every step."""
    stop = stop or [tok.eos_token_id]
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] in stop:
                break
    return out


def _reference_sample(model, tok, prompts, num_samples, max_new_tokens, seed) -> list[list[int]]:
    """Same generator use as the fast path, but every step recomputes the full left-padded batch."""
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, enc))
    rows = [[tok.pad_token_id] * (width - len(e)) + e for e in enc for _ in range(num_samples)]
    mask = [[0] * (width - len(e)) + [1] * len(e) for e in enc for _ in range(num_samples)]
    ids, mask = torch.tensor(rows), torch.tensor(mask)
    gen = torch.Generator().manual_seed(seed)
    done = torch.zeros(len(rows), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in rows]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
            ).logits[:, -1]
            token = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)[:, 0]
            for r in range(len(rows)):
                if not done[r]:
                    out[r].append(int(token[r]))
            done |= token == tok.eos_token_id
            ids = torch.cat([ids, token[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
            if done.all():
                break
    return out


def _generated(roll: Rollout) -> list[list[int]]:
    return [
        roll.response_ids[r, : roll.response_lengths[r]].tolist() for r in range(roll.batch_size)
    ]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_left_padded_greedy_matches_one_by_one(models, tok, arch):
    model = models[arch]
    roll = generate_rollouts(model, tok, PROMPTS, num_samples=2, max_new_tokens=9, temperature=0.0)
    expected = [_reference_greedy(model, tok, p, 9) for p in PROMPTS for _ in range(2)]
    assert _generated(roll) == expected


def test_stop_token_ids(models, tok):
    model = models["llama"]
    stop = [tok.convert_tokens_to_ids(c) for c in "0123"] + [tok.eos_token_id]
    roll = generate_rollouts(
        model,
        tok,
        PROMPTS,
        num_samples=1,
        max_new_tokens=9,
        temperature=0.0,
        stop_token_ids=stop,
    )
    assert _generated(roll) == [_reference_greedy(model, tok, p, 9, stop) for p in PROMPTS]
    for r in range(roll.batch_size):
        last = int(roll.response_ids[r, roll.response_lengths[r] - 1])
        assert bool(roll.finished[r]) == (last in stop)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sampling_matches_uncached_reference(models, tok, arch):
    model = models[arch]
    roll = generate_rollouts(model, tok, PROMPTS, num_samples=3, max_new_tokens=8, seed=11)
    assert _generated(roll) == _reference_sample(model, tok, PROMPTS, 3, 8, seed=11)


def test_shapes_masks_and_groups(models, tok):
    model = models["gpt2"]
    problems = [Problem(p, f"ans{i}") for i, p in enumerate(PROMPTS)]
    roll = generate_rollouts(model, tok, problems, num_samples=8, max_new_tokens=6, seed=0)
    B, T = roll.response_ids.shape
    assert B == 40 and T <= 6 and roll.num_groups == 5 and roll.num_samples == 8
    assert roll.group_ids.tolist() == [q for q in range(5) for _ in range(8)]
    assert roll.prompts[8] == PROMPTS[1] and roll.answers[9] == "ans1"
    eos = tok.eos_token_id
    assert eos == roll.pad_token_id  # the hard case: the mask must come from lengths
    lengths = roll.response_lengths
    assert torch.equal(roll.response_mask, torch.arange(T)[None, :] < lengths[:, None])
    assert roll.response_mask.dtype == torch.bool and roll.prompt_mask.dtype == torch.bool
    assert roll.finished.any() and (~roll.finished).any()  # the seed gives both kinds of row
    for r in range(B):
        row = roll.response_ids[r, : lengths[r]].tolist()
        if roll.finished[r]:
            assert row[-1] == eos and eos not in row[:-1]  # the EOS is inside the mask
        else:
            assert lengths[r] == 6 and eos not in row
        assert roll.completions[r] == tok.decode(row, skip_special_tokens=True)
    # prompts: left-padded, mask from lengths
    P = roll.prompt_length
    assert roll.prompt_length == max(len(p) for p in PROMPTS)
    prompt_lengths = roll.prompt_mask.sum(dim=1)
    assert prompt_lengths[0] == len(PROMPTS[0]) and not roll.prompt_mask[0, 0]
    assert roll.input_ids.shape == (B, P + T) and roll.attention_mask.shape == (B, P + T)
    assert roll.attention_mask.dtype == torch.long
    # position of the first response token = prompt length
    assert torch.equal(roll.position_ids[:, P], prompt_lengths)
    moved = roll.to("cpu")
    assert (
        torch.equal(moved.response_ids, roll.response_ids) and moved.completions == roll.completions
    )


def test_problem_kinds(models, tok):
    model = models["gpt2"]
    kinds = ["12+5=", {"prompt": "12+5=", "answer": "71>17"}, Problem("12+5=", "71>17")]
    roll = generate_rollouts(model, tok, kinds, num_samples=1, max_new_tokens=4, temperature=0)
    assert roll.prompts == ["12+5="] * 3 and roll.answers == ["", "71>17", "71>17"]
    assert roll.completions[0] == roll.completions[1] == roll.completions[2]


def test_determinism_and_seed(models, tok):
    model = models["gpt2"]
    a = generate_rollouts(model, tok, PROMPTS, num_samples=4, max_new_tokens=6, seed=5)
    b = generate_rollouts(model, tok, PROMPTS, num_samples=4, max_new_tokens=6, seed=5)
    c = generate_rollouts(model, tok, PROMPTS, num_samples=4, max_new_tokens=6, seed=6)
    assert torch.equal(a.response_ids, b.response_ids) and a.completions == b.completions
    assert a.completions != c.completions
    torch.manual_seed(0)
    d = generate_rollouts(model, tok, PROMPTS, num_samples=4, max_new_tokens=6)
    torch.manual_seed(0)
    e = generate_rollouts(model, tok, PROMPTS, num_samples=4, max_new_tokens=6)
    assert d.completions == e.completions  # seed=None follows torch's global RNG


def test_chunking_and_training_mode(models, tok):
    model = models["gpt2"]
    full = generate_rollouts(model, tok, PROMPTS, num_samples=3, max_new_tokens=7, temperature=0)
    model.train()
    try:
        chunked = generate_rollouts(
            model, tok, PROMPTS, num_samples=3, max_new_tokens=7, temperature=0, batch_size=4
        )
        assert model.training  # restored after sampling
    finally:
        model.eval()
    assert _generated(chunked) == _generated(full)
    assert torch.equal(chunked.response_mask, full.response_mask)


def test_select_and_concat(models, tok):
    model = models["gpt2"]
    a = generate_rollouts(model, tok, PROMPTS[:2], num_samples=2, max_new_tokens=3, seed=1)
    b = generate_rollouts(model, tok, PROMPTS[2:], num_samples=2, max_new_tokens=6, seed=2)
    both = Rollout.concat([a, b])
    assert both.batch_size == 10 and both.num_groups == 5
    assert both.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert both.prompt_length == max(a.prompt_length, b.prompt_length)
    for r in range(10):
        source, i = (a, r) if r < 4 else (b, r - 4)
        n = int(source.response_lengths[i])
        assert both.response_ids[r, :n].tolist() == source.response_ids[i, :n].tolist()
        assert both.response_mask[r].sum() == n
        k = int(source.prompt_mask[i].sum())
        assert both.prompt_ids[r, -k:].tolist() == source.prompt_ids[i, -k:].tolist()
        assert both.prompt_mask[r].sum() == k
    keep = torch.tensor([False, True, False, True, False]).repeat_interleave(2)
    picked = both.select(keep)
    assert picked.group_ids.tolist() == [0, 0, 1, 1]
    assert picked.completions == [both.completions[i] for i in (2, 3, 6, 7)]
    assert picked.prompt_mask.sum(dim=1).tolist() == both.prompt_mask[keep].sum(dim=1).tolist()


def test_bad_arguments(models, tok):
    model = models["gpt2"]
    with pytest.raises(ValueError, match="num_samples"):
        generate_rollouts(model, tok, PROMPTS, num_samples=0, max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_rollouts(model, tok, PROMPTS, num_samples=1, max_new_tokens=0)
    with pytest.raises(ValueError, match="problems"):
        generate_rollouts(model, tok, [], num_samples=1, max_new_tokens=3)
    with pytest.raises(ValueError, match="problems must be"):
        generate_rollouts(model, tok, [3], num_samples=1, max_new_tokens=3)
    with pytest.raises(ValueError, match="temperature"):
        generate_rollouts(model, tok, PROMPTS, num_samples=1, max_new_tokens=3, temperature=-1)


def test_samples_follow_the_plain_softmax(tok):
    """First-token frequencies match softmax(logits / T), whatever the model's generation_config
    says (a model shipping top_k=1 and a repetition penalty must not change RL sampling)."""
    model = build_tiny_model(
        tok, TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, seed=1)
    ).eval()
    with torch.no_grad():  # sharpen the random model a little so the check has power
        model.lm_head.weight.mul_(8.0)
    model.generation_config.top_k = 1
    model.generation_config.repetition_penalty = 100.0
    prompt, temperature, n = "12+5=", 1.5, 4000
    with torch.no_grad():
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
        probs = torch.softmax(model(input_ids=ids).logits[0, -1] / temperature, dim=-1)
    roll = generate_rollouts(
        model,
        tok,
        [prompt],
        num_samples=n,
        max_new_tokens=1,
        temperature=temperature,
        seed=0,
    )
    freq = torch.bincount(roll.response_ids[:, 0], minlength=probs.numel()).float() / n
    assert probs.max() < 0.9  # not degenerate
    # 4 standard errors per token
    tolerance = 4 * (probs * (1 - probs) / n).sqrt() + 1e-3
    assert ((freq - probs).abs() <= tolerance).all(), (freq, probs)
    assert model.generation_config.top_k == 1  # restored


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sampling_emits_no_deprecation_warning(models, tok, arch):
    """No FutureWarning/DeprecationWarning from transformers while sampling (the cache is passed
    under the name the installed version's forward declares)."""
    import inspect
    import warnings

    model = models[arch]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        roll = generate_rollouts(model, tok, PROMPTS, num_samples=2, max_new_tokens=4, seed=0)
    assert roll.response_lengths.min() >= 1
    if "cache" in inspect.signature(model.forward).parameters:
        # control: on such versions the old argument name does warn, so the check above has power
        from transformers import DynamicCache

        ids = torch.tensor([tok("1=", add_special_tokens=False)["input_ids"]])
        with warnings.catch_warnings(), pytest.raises(FutureWarning, match="past_key_values"):
            warnings.simplefilter("error", FutureWarning)
            model(input_ids=ids, past_key_values=DynamicCache(config=model.config))


def test_presized_layer_returns_what_dynamic_layer_does():
    """The pre-sized KV layer against transformers' concatenating one: the same keys and values
    (and lengths) after a prompt and single-token steps; writing past its capacity raises."""
    from transformers.cache_utils import DynamicLayer

    from gmts.sampling.kv_cache import PresizedLayer

    gen = torch.Generator().manual_seed(0)
    fast, slow = PresizedLayer(capacity=9), DynamicLayer()
    for n in (5, 1, 1, 1, 1):
        keys = torch.randn(3, 2, n, 4, generator=gen)
        values = torch.randn(3, 2, n, 6, generator=gen)  # a value head_dim of its own
        got, want = fast.update(keys, values), slow.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert fast.get_seq_length() == slow.get_seq_length()
    with pytest.raises(RuntimeError, match="holds 9 positions"):
        fast.update(torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 6))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_presized_cache_samples_what_the_dynamic_cache_did(
    models, tok, arch, temperature, monkeypatch
):
    """The sampler with its pre-sized KV cache samples exactly the tokens it sampled with
    transformers' DynamicCache (the implementation it replaced)."""
    from transformers import DynamicCache

    import gmts.sampling.kv_cache as kv_cache

    model = models[arch]
    kwargs = dict(num_samples=3, max_new_tokens=12, temperature=temperature, seed=7)
    fast = generate_rollouts(model, tok, PROMPTS, **kwargs)
    monkeypatch.setattr(kv_cache, "presized_cache", lambda config, _: DynamicCache(config=config))
    slow = generate_rollouts(model, tok, PROMPTS, **kwargs)
    assert torch.equal(fast.response_ids, slow.response_ids)
    assert torch.equal(fast.response_lengths, slow.response_lengths)
