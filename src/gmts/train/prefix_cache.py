"""How one model call hands a shared prompt's keys and values to the next: two cache layers,
the name the model takes them under, and activation checkpointing that keeps them.

A Hugging Face causal LM writes each layer's keys and values into the cache object it is given
(``cache.update(keys, values, layer_idx)``) and attends over what ``update`` returns. The
grouped forward (:mod:`gmts.train.grouped_forward`) gives it:

- :func:`recording_cache` for the prompt call: each layer keeps the keys and values it is first
  given and returns them unchanged (no past);
- :func:`prefix_cache` for a response call: each layer returns the prompt's keys and values
  (given, with their autograd history) in front of the new ones, and never grows.

Neither layer changes when ``update`` is called again with the same inputs, which is what a
backward replay of a checkpointed layer does; so the grouped forward can keep activation
checkpointing on (:func:`checkpointing_keeps_cache`), which Hugging Face turns off for any
cache. Imported on use (it imports ``transformers``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from gmts.models.lora import AdaptersOff

__all__ = [
    "cache_argument",
    "check_full_attention",
    "checkpointing_keeps_cache",
    "inner_model",
    "prefix_cache",
    "recorded_states",
    "recording_cache",
]


class _RecordingLayer(DynamicLayer):
    """Keeps the first ``(b, heads, n, head_dim)`` keys and values it is given; attention sees
    exactly them (an empty past)."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recorded is None:  # a checkpointed layer's replay leaves the record as it is
            self.recorded = (key_states, value_states)
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """Returns the given prefix keys and values ``(b, heads, W, head_dim)`` before the new ones;
    holds nothing else, so every call with the same inputs returns the same tensors."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values  # the mask sizes read get_seq_length(): W

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys = torch.cat([self.keys, key_states], dim=-2)  # (b, heads, W + n, head_dim)
        values = torch.cat([self.values, value_states], dim=-2)
        return keys, values


def inner_model(model: Any) -> torch.nn.Module:
    """The Hugging Face model under a LoRA reference (:class:`AdaptersOff`) or a peft model."""
    if isinstance(model, AdaptersOff):
        model = model.model
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_argument(model: Any) -> str:
    """The name ``model.forward`` takes a cache under: ``cache`` in current transformers,
    ``past_key_values`` up to about 5.2x."""
    try:
        parameters = inspect.signature(inner_model(model).forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    return "cache" if "cache" in parameters else "past_key_values"


def check_full_attention(config: Any) -> DynamicCache:
    """An empty cache of a model of ``config``, checked to hold only plain full-attention
    layers (cheap: no weights needed).

    Raises:
        ValueError: other attention layers (sliding window, linear, ...), whose caches the
            grouped layout does not rebuild; the message names the setting that avoids them.
    """
    cache = DynamicCache(config=config)
    kinds = sorted({type(x).__name__ for x in cache.layers if type(x) is not DynamicLayer})
    if kinds:
        raise ValueError(
            f"model.forward_layout=grouped needs full-attention layers only; this model's cache "
            f"has {', '.join(kinds)}: use model.forward_layout=padded"
        )
    return cache


def recording_cache(model: Any) -> DynamicCache:
    """A cache whose layers record the keys and values of one call (:func:`recorded_states`);
    :func:`check_full_attention` of the model's config."""
    cache = check_full_attention(inner_model(model).config)
    cache.layers = [_RecordingLayer() for _ in cache.layers]
    return cache


def recorded_states(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the ``(b, heads, n, head_dim)`` keys and values a :func:`recording_cache`
    recorded.

    Raises:
        RuntimeError: a layer recorded nothing (the model's forward did not use the cache).
    """
    states = [getattr(layer, "recorded", None) for layer in cache.layers]
    if not states or any(s is None for s in states):
        raise RuntimeError(
            "the model did not write its keys and values into the cache it was given; "
            "use model.forward_layout=padded"
        )
    return states  # type: ignore[return-value]


def prefix_cache(states: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache whose layer ``i`` puts ``states[i]``'s ``(b, heads, W, head_dim)`` keys and
    values before the call's own (positions ``0..W-1`` of the attention mask)."""
    cache = DynamicCache()
    cache.layers = [_PrefixLayer(keys, values) for keys, values in states]
    return cache


def _unflagged(layer: torch.nn.Module, forward: Any) -> Any:
    """``forward`` run with the layer's Hugging Face checkpointing flag off: also when the
    backward replays it, after :func:`checkpointing_keeps_cache` has put the flag back."""

    def call(*args: Any, **kwargs: Any) -> Any:
        flag = layer.gradient_checkpointing
        layer.gradient_checkpointing = False
        try:
            return forward(*args, **kwargs)
        finally:
            layer.gradient_checkpointing = flag

    return call


def checkpointed_modules(model: Any) -> list[torch.nn.Module]:
    """The modules of ``model`` with Hugging Face's activation checkpointing on (training):
    what runs inside them is replayed in the backward."""
    return [
        m
        for m in inner_model(model).modules()
        if m.training and getattr(m, "gradient_checkpointing", False)
    ]


@contextlib.contextmanager
def checkpointing_keeps_cache(model: Any) -> Iterator[None]:
    """Inside, a model with activation checkpointing on keeps it AND passes the cache to its
    layers.

    Hugging Face drops the cache wherever checkpointing is on in training (a replay would write
    a growing cache twice); the layers here are replay-safe. So, for the duration, Hugging
    Face's own checkpointing flags are off (it then passes the cache) and, with gradients on,
    each decoder layer that had it on checkpoints its ``forward`` itself, non-reentrant, as
    transformers does (module hooks, e.g. FSDP2's, stay outside the replay).

    Raises:
        ValueError: checkpointing is on in modules none of which is a decoder layer
            (``GradientCheckpointingLayer``): this model's checkpointing cannot be kept.
    """
    flagged = checkpointed_modules(model)
    if not flagged:
        yield
        return
    layers = [m for m in flagged if isinstance(m, GradientCheckpointingLayer)]
    inner = inner_model(model)
    if not layers:
        raise ValueError(
            f"{type(inner).__name__} checkpoints activations outside its decoder layers; "
            "model.forward_layout=grouped cannot keep that: use model.forward_layout=padded"
        )
    patched = layers if torch.is_grad_enabled() else []
    own_forward = {id(m): m.__dict__.get("forward") for m in patched}  # normally none
    for m in flagged:
        m.gradient_checkpointing = False
    for m in patched:
        m.forward = functools.partial(
            torch.utils.checkpoint.checkpoint, _unflagged(m, m.forward), use_reentrant=False
        )
    try:
        yield
    finally:
        for m in flagged:
            m.gradient_checkpointing = True
        for m in patched:
            if own_forward[id(m)] is None:
                del m.forward  # the class's forward again
            else:
                m.forward = own_forward[id(m)]
