"""What a causal LM costs in memory per token, measured from its config alone (no weights).

:class:`ModelShape` counts the parameters exactly: the model is built on the ``meta`` device
from its config (no memory, no weights). :func:`activation_cost` measures, rather than guesses,
the bytes one token costs: a narrow copy of the architecture (head counts, hidden and MLP
widths divided by one factor, head size kept, 1 and 2 layers, a small vocabulary) runs one real
forward on the CPU in the run's precision; every tensor autograd saves is counted once
(parameters and their casts excluded), and so is the KV cache a no-grad forward leaves. Every
such tensor of a decoder layer is linear in those widths, so the counts scale back up exactly.
A third forward attends over a cached prefix (as the grouped layout's response calls do over
their prompt, :mod:`gmts.train.grouped_forward`) at two prefix lengths: the difference is what
attention keeps for backward per prefix position (its key and value inputs, as it receives
them).
Attention is assumed to use a fused kernel (no length x length matrix), as SDPA does on CUDA.
The memory plan (:mod:`gmts.scale.memory_plan`) is built from these numbers.

LoRA (:mod:`gmts.models.lora`): the adapters are put on the meta copy with peft itself, so their
count is exact for the configured rank and target modules; the probe runs with adapters too
(frozen base, so autograd saves what it saves then). The rank-``r`` tensors an adapter saves
(``A x``) do not scale with the width, so the probe runs at ranks 1 and 2 and scales only the
rest back: ``k * (s_1 - d) + r * d`` with ``d = s_2 - s_1``.
"""

from __future__ import annotations

import functools
import json
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from gmts.models.lora import LoraConfig
from gmts.sampling.kv_sizing import KVShape

# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs to know about a causal LM, from its config.

    Attributes:
        params: the model's parameters (tied weights counted once), LoRA adapters not included.
        layer_params: parameters of one decoder layer (its adapters included).
        root_params: parameters outside the decoder layers (embeddings, final norm, head; their
            adapters included).
        layers, hidden, heads, kv_heads, head_dim, vocab: the config's sizes.
        max_positions: ``max_position_embeddings`` (None when the config has none).
        adapter_params: LoRA adapter parameters (0 without LoRA).
        lora: whether only the adapters train (the base is then frozen).
    """

    params: int
    layer_params: int
    root_params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int | None
    adapter_params: int = 0
    lora: bool = False

    @property
    def trainable_params(self) -> int:
        """Parameters that train (float32 masters with gradients and AdamW state)."""
        return self.adapter_params if self.lora else self.params

    @property
    def frozen_params(self) -> int:
        """Parameters that never train (held in the compute dtype): a LoRA run's base."""
        return self.params if self.lora else 0

    @property
    def kv(self) -> KVShape:
        """The sizes its KV cache depends on."""
        return KVShape(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim)

    @classmethod
    def from_config(cls, config: Any, lora: LoraConfig | None = None) -> ModelShape:
        """Count the parameters of ``config``'s causal LM built on the meta device, with
        ``lora``'s adapters on it (peft's own placement) when given."""
        from gmts.models.lora import add_adapters
        from gmts.scale.layers import decoder_layers

        model = _meta_model(config)
        params = sum(p.numel() for p in model.parameters())
        adapters = 0
        if lora is not None:
            model = add_adapters(model, lora)
            adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        layers = decoder_layers(model)
        layer_params = sum(p.numel() for p in layers[0].parameters())
        kv = KVShape.from_config(config)
        positions = getattr(config, "max_position_embeddings", None)
        return cls(
            params=params,
            layer_params=layer_params,
            root_params=params + adapters - layer_params * len(layers),
            layers=len(layers),
            hidden=config.hidden_size,
            heads=config.num_attention_heads,
            kv_heads=kv.kv_heads,
            head_dim=kv.head_dim,
            vocab=config.vocab_size,
            max_positions=positions if isinstance(positions, int) else None,
            adapter_params=adapters,
            lora=lora is not None,
        )


def _meta_model(config: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


# --------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class ActivationCost:
    """Bytes that one token costs in training forward passes (measured; see module doc).

    Attributes:
        per_layer: saved for backward inside one decoder layer.
        outside: saved outside the decoder layers (embeddings, final norm; not the logits).
        stream: one residual-stream vector (what gradient checkpointing keeps per layer).
        kv_per_layer: one layer's KV cache entry, keys and values in the dtype the model
            caches them (under bf16 autocast over float32 parameters they come out float32:
            twice the cache of bf16 parameters).
        prefix_per_layer: saved for backward inside one decoder layer per position of a cached
            prefix that a call's queries attend over: the keys and values SDPA saves as its
            inputs. With a mask (always, after a prefix) transformers repeats them to every
            query head (``repeat_kv``) and autocast casts them to the compute dtype, so this is
            ``heads / kv_heads`` times a bf16 run's cache entry, whatever the cache's dtype.
    """

    per_layer: float
    outside: float
    stream: float
    kv_per_layer: float
    prefix_per_layer: float = 0.0


def _narrow_config(
    config: Any, layers: int, factor: int | None = None, min_kv_heads: int = 1
) -> tuple[Any, int]:
    """A copy of ``config`` with ``layers`` layers, widths divided by a common factor ``k``
    (head size kept; the largest that divides both head counts and leaves a width of at least
    64 and at least ``min_kv_heads`` key-value heads, or ``factor``) and a small vocabulary;
    returns ``(config, k)``."""
    heads = config.num_attention_heads
    kv_shape = KVShape.from_config(config)
    kv, head_dim = kv_shape.kv_heads, kv_shape.head_dim
    common = math.gcd(heads, kv)  # k must divide both head counts
    k = max(
        d
        for d in range(1, common + 1)
        if common % d == 0
        and (d == 1 or (config.hidden_size // d >= 64 and kv // d >= min_kv_heads))
    )
    raw = config.to_dict()
    raw.pop("architectures", None)
    changes: dict[str, Any] = {
        "num_hidden_layers": layers,
        "hidden_size": config.hidden_size // k,
        "num_attention_heads": heads // k,
        "vocab_size": 256,
        "tie_word_embeddings": getattr(config, "tie_word_embeddings", False),
    }
    if hasattr(config, "num_key_value_heads"):
        changes["num_key_value_heads"] = kv // k
    if getattr(config, "head_dim", None) is not None or config.hidden_size // heads != head_dim:
        changes["head_dim"] = head_dim
    inner = getattr(config, "intermediate_size", None)
    if inner:
        changes["intermediate_size"] = inner // k
    if getattr(config, "n_inner", None):
        changes["n_inner"] = config.n_inner // k
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if raw.get(key) is not None:
            changes[key] = 0  # inside the small vocabulary
    if isinstance(getattr(config, "layer_types", None), list):
        changes["layer_types"] = list(config.layer_types[:layers])
    attribute_map = getattr(type(config), "attribute_map", {})
    for key, value in changes.items():  # GPT-2 spells hidden_size n_embd, ...
        raw[attribute_map.get(key, key)] = value
    narrow = type(config).from_dict(raw)
    return narrow, k


_VIEWS_AND_CASTS = frozenset(
    {
        "ToCopyBackward0",
        "TBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ExpandBackward0",
        "AliasBackward0",
    }
)


def _from_parameter(fn: Any) -> bool:
    """Whether a saved tensor is a parameter seen through casts and views (autocast's bf16
    weight copies: the strategy's compute copy, not an activation)."""
    while fn is not None:
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return True
        if name not in _VIEWS_AND_CASTS or not fn.next_functions:
            return False
        fn = fn.next_functions[0][0]
    return False


def _saved_bytes(
    model: torch.nn.Module, tokens: int, autocast: torch.dtype | None
) -> tuple[int, int]:
    """(bytes autograd saves in one forward of ``tokens`` tokens, bytes of one decoder-layer
    output vector per token)."""
    from gmts.scale.layers import decoder_layers

    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_storages and not _from_parameter(t.grad_fn):
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    stream: dict[str, int] = {}
    layer = decoder_layers(model)[0]

    def on_output(_module: Any, _inputs: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        stream["bytes"] = out.shape[-1] * out.element_size()

    handle = layer.register_forward_hook(on_output)
    ids = torch.arange(tokens).remainder(200)[None, :] + 10  # (1, tokens), ids in vocab
    ctx = torch.autocast("cpu", dtype=autocast) if autocast is not None else nullcontext()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
            model(input_ids=ids, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    return sum(storages.values()), stream["bytes"]


_MODES = {  # mode -> (base parameter dtype, adapter dtype, autocast dtype or None)
    "float32": (torch.float32, torch.float32, None),
    "autocast": (torch.float32, torch.float32, torch.bfloat16),
    "bf16-params": (torch.bfloat16, torch.bfloat16, None),
    "bf16-base": (torch.bfloat16, torch.float32, torch.bfloat16),
}


def _prefix_bytes(model: torch.nn.Module, tokens: int, autocast: torch.dtype | None) -> float:
    """Bytes autograd saves per position of a cached prefix: a forward of ``tokens`` tokens
    after prefixes of ``tokens`` and ``2 * tokens`` positions (a DynamicCache filled without
    gradients; attention mask of ones, so a mask is passed as in a grouped response call),
    the difference of the saved bytes divided by ``tokens``."""
    import inspect

    from transformers import DynamicCache

    # transformers >= 5.24 names it `cache` (`past_key_values` logs a deprecation)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def region() -> Any:
        return torch.autocast("cpu", dtype=autocast) if autocast is not None else nullcontext()

    saved = []
    for width in (tokens, 2 * tokens):
        cache = DynamicCache(config=model.config)
        prefix = torch.arange(width).remainder(200)[None, :] + 10  # (1, W)
        with torch.no_grad(), region():
            model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{name: cache})
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor, storages: dict[int, int] = storages) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in param_storages and not _from_parameter(t.grad_fn):
                storages[ptr] = t.untyped_storage().nbytes()
            return t

        ids = torch.arange(tokens).remainder(200)[None, :] + 10  # (1, L)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), region():
            model(
                input_ids=ids,
                attention_mask=torch.ones(1, width + tokens, dtype=torch.long),
                position_ids=width + torch.arange(tokens)[None, :],
                use_cache=True,
                logits_to_keep=1,
                **{name: cache},
            )
        saved.append(sum(storages.values()))
    return (saved[1] - saved[0]) / tokens


def _prefix_per_layer(config: Any, mode: str) -> float:
    """Bytes one decoder layer saves per position of a cached prefix (:func:`_prefix_bytes`
    of 1- and 2-layer narrow copies, the difference scaled back).

    16 new tokens after prefixes of 16 and 32 (within any learned position table): what
    grows with the prefix is the keys and values attention saves, and the probe's
    ``(16, W + 16)`` mask rows (16 bytes per prefix position in float32, next to e.g.
    4,608 of SmolLM2's keys and values)."""
    from transformers import AutoModelForCausalLM

    positions = getattr(config, "max_position_embeddings", None) or 48
    tokens = max(1, min(16, positions // 3))

    base_dtype, _, autocast = _MODES[mode]
    per_model = []
    for layers in (1, 2):
        # at least 2 key-value heads where the model has them: with one, ``repeat_kv`` is a
        # stride-0 view where the real model's is a copy to every query head (not linear in k)
        narrow, k = _narrow_config(config, layers, min_kv_heads=2)
        model = AutoModelForCausalLM.from_config(narrow, dtype=base_dtype)
        model.train()
        per_model.append(_prefix_bytes(model, tokens, autocast) * k)
    return per_model[1] - per_model[0]


def _probe(narrow: Any, mode: str, lora: LoraConfig | None, tokens: int) -> tuple[int, int, int]:
    """(saved bytes, stream bytes per token, KV-cache bytes) of one forward of ``narrow``."""
    from transformers import AutoModelForCausalLM

    from gmts.models.lora import add_adapters

    base_dtype, adapter_dtype, autocast = _MODES[mode]
    model = AutoModelForCausalLM.from_config(narrow, dtype=base_dtype)
    if lora is not None:
        model = add_adapters(model, lora, dtype=adapter_dtype)
    model.train()
    saved, stream = _saved_bytes(model, tokens, autocast)
    return saved, stream, _cache_bytes(model, tokens, autocast)


@functools.lru_cache(maxsize=64)
def _activation_cost(
    config_json: str,
    config_class: str,
    mode: str,
    factor: int | None = None,
    lora_fields: tuple[Any, ...] | None = None,
) -> ActivationCost:
    import dataclasses

    import transformers

    config = getattr(transformers, config_class).from_dict(json.loads(config_json))
    lora = None if lora_fields is None else LoraConfig(*lora_fields)
    tokens = 64
    totals, stream = [], 0
    for layers in (1, 2):
        narrow, k = _narrow_config(config, layers, factor)
        if lora is None:
            saved, stream_bytes, cache = _probe(narrow, mode, None, tokens)
            totals.append(saved * k / tokens)
        else:  # the rank-r tensors do not scale with the width: probe ranks 1 and 2
            s1, stream_bytes, cache = _probe(
                narrow, mode, dataclasses.replace(lora, rank=1), tokens
            )
            s2, _, _ = _probe(narrow, mode, dataclasses.replace(lora, rank=2), tokens)
            per_rank = s2 - s1
            totals.append(((s1 - per_rank) * k + lora.rank * per_rank) / tokens)
        stream = stream_bytes * k
        kv = cache * k / tokens / layers
    per_layer = totals[1] - totals[0]
    return ActivationCost(
        per_layer=per_layer,
        outside=totals[0] - per_layer,
        stream=stream,
        kv_per_layer=kv,
        prefix_per_layer=_prefix_per_layer(config, mode),
    )


def _cache_bytes(model: torch.nn.Module, tokens: int, autocast: torch.dtype | None) -> int:
    """Bytes of the KV cache after a no-grad forward of ``tokens`` tokens."""
    ids = torch.arange(tokens).remainder(200)[None, :] + 10  # (1, tokens)
    ctx = torch.autocast("cpu", dtype=autocast) if autocast is not None else nullcontext()
    with torch.no_grad(), ctx:
        out = model(input_ids=ids, logits_to_keep=1, use_cache=True)
        # transformers >= 5.24 names it `cache` (reading `past_key_values` logs a deprecation)
        cache = out["cache"] if "cache" in out else out["past_key_values"]
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return sum(t.numel() * t.element_size() for t in tensors)


def activation_cost(config: Any, mode: str, lora: LoraConfig | None = None) -> ActivationCost:
    """Measured activation bytes per token of ``config``'s architecture.

    Args:
        mode: ``"float32"`` (all float32), ``"autocast"`` (float32 parameters under bf16
            autocast: the replicate strategy's mixed precision), ``"bf16-params"`` (bf16
            parameters: FSDP's mixed precision, adapters gathered in bf16 too) or
            ``"bf16-base"`` (a bf16 frozen base and float32 adapters under bf16 autocast:
            replicate's mixed precision with LoRA).
        lora: the adapters trained (None: full fine-tuning).
    """
    import dataclasses

    fields = (
        None if lora is None else tuple(getattr(lora, f.name) for f in dataclasses.fields(lora))
    )
    with torch.random.fork_rng(devices=[]):  # the probe's initialisation draws random numbers
        return _activation_cost(config.to_json_string(), type(config).__name__, mode, None, fields)
