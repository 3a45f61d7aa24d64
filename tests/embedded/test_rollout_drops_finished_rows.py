"""The sampler prefills each distinct prompt once and drops finished rows from its batch (issue
34, items 1 and 3) and samples the tokens of the loop that computed and kept every row: against that loop (kept here verbatim as the reference, with
``torch.multinomial`` itself as its draw) on the embedded tiny model and on a tiny random model
of SmolLM2's architecture, over random prompts, group sizes, temperatures, both draws, prepacked
weights on and off and chunked batches; the positions the model computes are counted against
the rule of ``DROP_ROWS_AT`` replayed from the rows' lengths. ``drop_finished_rows=False`` (the
``rollout.drop_finished_rows`` switch) computes and keeps every row: the same tokens, the
reference's positions."""

from __future__ import annotations

import random

import pytest
import torch

import gmts.sampling.kv_cache as kv_cache
import gmts.sampling.rollout as rollout
from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
from gmts.embedded.tokenizer import build_char_tokenizer
from gmts.sampling.draws import DRAWS
from gmts.sampling.packed_linear import can_prepack
from gmts.sampling.rollout import generate_rollouts, position_ids_from_mask

CASES = 12  # random settings per model and draw


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def models(tok):
    """The embedded tiny model (gpt2) and a random llama shaped like SmolLM2 (grouped-query
    attention, rotary positions with SmolLM2's theta, RMS norm, SiLU MLP, tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    embedded = build_tiny_model(
        tok, TinyModelConfig(num_layers=2, hidden_size=32, num_heads=2, max_positions=64, seed=1)
    )
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=48,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        smollm2_like = LlamaForCausalLM(config)
    return {"embedded": embedded.eval(), "smollm2_like": smollm2_like.eval()}


# ---- the reference: the sampling loop before rows could leave the batch (verbatim but for the
# draws, which are torch.multinomial and the uniform-per-row inverse CDF of the whole batch, and
# drop_rows, the switch it has no use for) ----


def _reference_next_token(logits, temperature, generator, draw):
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scaled = logits.float()
    if temperature != 1.0:
        scaled.div_(temperature)
    probs = torch.softmax(scaled, dim=-1)  # (b, V)
    if draw is DRAWS.get("multinomial"):
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    cdf = probs.to(torch.float64).cumsum_(dim=-1)
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, generator=generator)
    return (
        torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
        .squeeze(1)
        .clamp_(max=probs.shape[1] - 1)
    )


def _reference_loop(
    model,
    prompt_ids,
    prompt_mask,
    *,
    max_new_tokens,
    temperature,
    generator,
    draw,
    stop_ids,
    pad_id,
    drop_rows=True,
):
    rows, prompt_width = prompt_ids.shape
    capacity = prompt_width + max_new_tokens
    full_mask = torch.ones((rows, capacity), dtype=torch.long)
    full_mask[:, :prompt_width] = prompt_mask
    attention_mask = full_mask[:, :prompt_width]
    positions = position_ids_from_mask(attention_mask)
    parameters = rollout._forward_parameters(model)
    cache_name = "cache" if "cache" in parameters else "past_key_values"
    cache = {cache_name: kv_cache.presized_cache(model.config, capacity)}
    extra = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
    out = model(
        input_ids=prompt_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        **cache,
        **extra,
    )
    logits = out.logits[:, -1, :]
    next_position = positions[:, -1:] + 1
    finished = torch.zeros(rows, dtype=torch.bool)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long)
    tokens = []
    for step in range(max_new_tokens):
        token = _reference_next_token(logits, temperature, generator, draw)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        tokens.append(token)
        stopped_now = torch.isin(token, stop_ids) & ~finished
        lengths = torch.where(stopped_now, torch.full_like(lengths, step + 1), lengths)
        finished = finished | stopped_now
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        attention_mask = full_mask[:, : prompt_width + step + 1]
        out = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=next_position,
            use_cache=True,
            **cache,
        )
        logits = out.logits[:, -1, :]
        next_position = next_position + 1
    return torch.stack(tokens, dim=1), lengths


# ---- helpers ---------------------------------------------------------------------------------


class _PositionCounter:
    """Counts the positions (rows x tokens) every forward of ``model`` computes."""

    def __init__(self, model):
        self.positions = 0
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        self.positions += kwargs["input_ids"].numel()

    def close(self):
        self._handle.remove()


def _sample(model, tok, problems, settings, *, reference: bool, monkeypatch):
    """(Rollout, positions computed) of ``generate_rollouts`` with today's loop or the
    reference."""
    with monkeypatch.context() as patch:
        if reference:
            patch.setattr(rollout, "_sample_cache_loop", _reference_loop)
        counter = _PositionCounter(model)
        try:
            roll = generate_rollouts(model, tok, problems, **settings)
        finally:
            counter.close()
    return roll, counter.positions


def _positions_by_the_rule(roll, settings) -> tuple[int, int]:
    """(positions with rows dropped by DROP_ROWS_AT and each distinct prompt prefilled once,
    positions with every row kept), replayed from the rows' prompts, lengths and finished
    flags: each chunk's prompt forward, then one position per row in the batch per decoding
    step."""
    lengths = roll.response_lengths.tolist()
    finished = roll.finished.tolist()
    budget = settings["max_new_tokens"]
    chunk = settings.get("batch_size") or roll.batch_size
    dropped = kept = 0
    for start in range(0, roll.batch_size, chunk):
        rows = range(start, min(start + chunk, roll.batch_size))
        # the prompt forward: each distinct prompt row once (shared), every row (kept)
        distinct = {
            (tuple(roll.prompt_ids[r].tolist()), tuple(roll.prompt_mask[r].tolist())) for r in rows
        }
        dropped += len(distinct) * roll.prompt_length
        kept += len(rows) * roll.prompt_length
        in_batch = len(rows)
        for step in range(budget - 1):  # the forward after sampling token `step`
            generating = sum(1 for r in rows if not (finished[r] and lengths[r] <= step + 1))
            if generating == 0:
                break
            if generating < in_batch and generating <= rollout.DROP_ROWS_AT * in_batch:
                in_batch = generating
            dropped += in_batch
            kept += len(rows)
    return dropped, kept


def _random_case(rng: random.Random, with_prepack: bool) -> tuple[list[str], dict]:
    prompts = [
        "".join(rng.choice("0123456789+*=") for _ in range(rng.randint(1, 9)))
        for _ in range(rng.randint(1, 5))
    ]
    group = rng.randint(1, 5)
    rows = len(prompts) * group
    settings = dict(
        num_samples=group,
        max_new_tokens=rng.randint(1, 24),
        temperature=rng.choice([0.0, 0.7, 1.0]),
        batch_size=rng.choice([None, None, rng.randint(1, rows)]),
        seed=rng.randint(0, 10**6),
        # more stop ids finish rows sooner and at more different steps
        stop_token_ids=[15, *rng.sample(range(10), rng.randint(0, 2))],
        prepack=with_prepack and rng.random() < 0.5,
    )
    return prompts, settings


# ---- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("draw", DRAWS.names())
@pytest.mark.parametrize("model_name", ["embedded", "smollm2_like"])
def test_dropping_finished_rows_samples_the_tokens_of_the_full_batch(
    models, tok, model_name, draw, monkeypatch
):
    """Random settings: the same tokens, lengths, finished flags and completions as the loop
    that keeps every row; the model computes exactly the positions the rule says, and over the
    cases rows were dropped."""
    model = models[model_name]
    rng = random.Random(f"{model_name}-{draw}")
    saved = 0
    for _ in range(CASES):
        problems, settings = _random_case(rng, with_prepack=can_prepack("cpu"))
        settings["draw"] = draw
        fast, computed = _sample(
            model, tok, problems, settings, reference=False, monkeypatch=monkeypatch
        )
        slow, computed_before = _sample(
            model, tok, problems, settings, reference=True, monkeypatch=monkeypatch
        )
        assert torch.equal(fast.response_ids, slow.response_ids), settings
        assert torch.equal(fast.response_lengths, slow.response_lengths), settings
        assert torch.equal(fast.finished, slow.finished), settings
        assert fast.completions == slow.completions
        assert (computed, computed_before) == _positions_by_the_rule(fast, settings), settings
        saved += computed_before - computed
    assert saved > 0, "no case dropped a row: the cases do not test the dropping"


@pytest.mark.parametrize("draw", DRAWS.names())
def test_dropping_at_every_finished_row_changes_no_token(models, tok, draw, monkeypatch):
    """With the threshold at 1 the batch shrinks at every step where a row stops (the most
    copies of the cache, with prepacked weights where the build has them): still the reference's
    tokens, and fewer positions than with the default rule."""
    model = models["smollm2_like"]
    problems = ["1+2=", "34*5=", "999=", "7"]
    settings = dict(
        num_samples=4,
        max_new_tokens=20,
        temperature=1.0,
        seed=11,
        stop_token_ids=[15, 3, 7],
        draw=draw,
        prepack=can_prepack("cpu"),
    )
    slow, computed_before = _sample(
        model, tok, problems, settings, reference=True, monkeypatch=monkeypatch
    )
    default, computed_default = _sample(
        model, tok, problems, settings, reference=False, monkeypatch=monkeypatch
    )
    monkeypatch.setattr(rollout, "DROP_ROWS_AT", 1.0)
    eager, computed_eager = _sample(
        model, tok, problems, settings, reference=False, monkeypatch=monkeypatch
    )
    for roll in (default, eager):
        assert torch.equal(roll.response_ids, slow.response_ids)
        assert torch.equal(roll.response_lengths, slow.response_lengths)
    assert computed_eager < computed_default < computed_before
    assert computed_eager == _positions_by_the_rule(eager, settings)[0]


@pytest.mark.parametrize("model_name", ["embedded", "smollm2_like"])
def test_drop_finished_rows_false_keeps_every_row(models, tok, model_name, monkeypatch):
    """``drop_finished_rows=False`` (``rollout.drop_finished_rows=false``): over random settings
    with one seed each, the tokens, lengths and completions of the default (rows dropped) and of
    the reference loop, and exactly the reference's positions (every row kept)."""
    model = models[model_name]
    rng = random.Random(f"keep-{model_name}")
    saved = 0
    for _ in range(CASES // 2):
        problems, settings = _random_case(rng, with_prepack=can_prepack("cpu"))
        dropping, computed_dropping = _sample(
            model, tok, problems, settings, reference=False, monkeypatch=monkeypatch
        )
        keeping, computed_keeping = _sample(
            model,
            tok,
            problems,
            {**settings, "drop_finished_rows": False},
            reference=False,
            monkeypatch=monkeypatch,
        )
        slow, computed_before = _sample(
            model, tok, problems, settings, reference=True, monkeypatch=monkeypatch
        )
        for roll in (dropping, slow):
            assert torch.equal(keeping.response_ids, roll.response_ids), settings
            assert torch.equal(keeping.response_lengths, roll.response_lengths), settings
            assert keeping.completions == roll.completions
        assert computed_keeping == computed_before == _positions_by_the_rule(keeping, settings)[1]
        saved += computed_keeping - computed_dropping
    assert saved > 0, "no case dropped a row: the cases do not test the switch"


def test_a_cache_that_cannot_drop_rows_keeps_them(models, tok, monkeypatch):
    """Where a layer kind cannot drop rows the loop keeps every row: the reference's tokens and
    its positions."""
    model = models["embedded"]
    settings = dict(
        num_samples=3, max_new_tokens=12, temperature=1.0, seed=2, stop_token_ids=[15, 1]
    )
    slow, computed_before = _sample(
        model, tok, ["12=", "5"], settings, reference=True, monkeypatch=monkeypatch
    )
    monkeypatch.setattr(kv_cache, "can_drop_rows", lambda cache: False)
    kept, computed = _sample(
        model, tok, ["12=", "5"], settings, reference=False, monkeypatch=monkeypatch
    )
    assert torch.equal(kept.response_ids, slow.response_ids)
    assert computed == computed_before == _positions_by_the_rule(slow, settings)[1]


def test_can_drop_rows_reads_every_layer(models):
    from transformers import DynamicCache

    cache = kv_cache.presized_cache(models["smollm2_like"].config, 8)
    assert kv_cache.can_drop_rows(cache)
    assert kv_cache.can_drop_rows(DynamicCache(config=models["smollm2_like"].config))

    class _State:  # a layer kind without batch_select_indices (e.g. a linear-attention state)
        pass

    cache.layers[1] = _State()
    assert not kv_cache.can_drop_rows(cache)
    assert not kv_cache.can_drop_rows(object())


def test_presized_layer_drops_rows_as_dynamic_layer_does():
    """Against transformers' concatenating layer: after a prompt, two steps, a row selection and
    more steps, the same keys and values; the capacity is kept; selecting before anything was
    written is a no-op."""
    from transformers.cache_utils import DynamicLayer

    from gmts.sampling.kv_cache import PresizedLayer

    gen = torch.Generator().manual_seed(0)
    fast, slow = PresizedLayer(capacity=10), DynamicLayer()
    fast.batch_select_indices(torch.tensor([0]))
    batch = 5
    for n, keep in ((4, None), (1, None), (1, [0, 2, 3]), (1, None), (1, [2]), (1, None)):
        if keep is not None:
            fast.batch_select_indices(torch.tensor(keep))
            slow.batch_select_indices(torch.tensor(keep))
            batch = len(keep)
        keys = torch.randn(batch, 2, n, 4, generator=gen)
        values = torch.randn(batch, 2, n, 3, generator=gen)
        got, want = fast.update(keys, values), slow.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert fast.get_seq_length() == slow.get_seq_length() == 9
    fast.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 3))  # the 10th position fits
    with pytest.raises(RuntimeError, match="holds 10 positions"):
        fast.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 3))
