"""A pre-sized KV cache for the KV-cached sampler (:mod:`gmts.sampling.rollout`).

``transformers.DynamicCache`` grows each layer's keys and values by concatenation, so every
generated token copies the whole cache of every layer: on a 30-layer model with 32 rows that is
O(length) bytes per layer per step, quadratic over an answer. :class:`PresizedLayer` allocates
each layer's keys and values once, for the prompt plus the whole generation budget, writes every
new position in place, and hands attention the view of the filled positions: the same values in
the same shapes as the concatenated tensors (the tests check that the sampled tokens are
identical), without the copies.

Rows leave the cache with :meth:`PresizedLayer.batch_select_indices` (``DynamicCache``'s
``batch_select_indices`` calls it on every layer): the sampler drops the rows that have stopped
(:func:`gmts.sampling.rollout._sample_cache_loop`), so later steps compute only the rows still
generating. :func:`can_drop_rows` says whether every layer of a cache can.

Imported on use (it imports ``transformers``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["PresizedLayer", "can_drop_rows", "presized_cache"]


class PresizedLayer(DynamicLayer):
    """One layer's keys and values in buffers of ``capacity`` positions.

    Buffers are ``(b, heads, capacity, head_dim)``, allocated at the first update (the
    prompt's forward) with that update's batch, heads, head dims, dtype and device;
    ``self.keys`` / ``self.values`` are the views ``[:, :, :length]`` of the filled
    positions, as ``DynamicLayer`` keeps them.
    """

    is_croppable = False

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(b, heads, n, head_dim)`` new keys and values after the filled positions;
        return the views of all filled positions."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._key_buffer is None:
            b, heads, _, key_dim = key_states.shape
            value_dim = value_states.shape[-1]
            self._key_buffer = key_states.new_empty((b, heads, self.capacity, key_dim))
            self._value_buffer = value_states.new_empty((b, heads, self.capacity, value_dim))
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(
                f"the pre-sized KV cache holds {self.capacity} positions, {end} were written"
            )
        assert self._value_buffer is not None
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys = self._key_buffer[:, :, :end]  # (b, heads, end, key_dim)
        self.values = self._value_buffer[:, :, :end]  # (b, heads, end, value_dim)
        return self.keys, self.values

    def reset(self) -> None:
        """Forget the filled positions and the buffers."""
        super().reset()
        self.length = 0
        self._key_buffer = self._value_buffer = None

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a pre-sized KV cache does not grow its batch")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` ((a,) long, rows of the current batch, in the new
        order): new buffers of ``a`` rows and the same capacity, the filled positions copied
        (one copy of the kept rows' keys and values; the old buffers are freed)."""
        if self._key_buffer is None:
            return  # nothing written yet: the first update allocates with its own batch
        assert self._value_buffer is not None
        self._key_buffer = _kept_rows(self._key_buffer, indices, self.length)
        self._value_buffer = _kept_rows(self._value_buffer, indices, self.length)
        self.keys = self._key_buffer[:, :, : self.length]  # (a, heads, length, key_dim)
        self.values = self._value_buffer[:, :, : self.length]  # (a, heads, length, value_dim)


def _kept_rows(buffer: torch.Tensor, indices: torch.Tensor, length: int) -> torch.Tensor:
    """(b, heads, capacity, dim) -> (a, heads, capacity, dim): rows ``indices``, the first
    ``length`` positions copied, the rest left unwritten."""
    kept = buffer.new_empty((indices.shape[0], *buffer.shape[1:]))
    torch.index_select(buffer[:, :, :length], 0, indices, out=kept[:, :, :length])
    return kept


def can_drop_rows(cache: Any) -> bool:
    """Whether ``cache.batch_select_indices`` can drop rows of every layer of ``cache``: true
    for ``DynamicCache`` layers of the plain kinds (full attention, :class:`PresizedLayer`,
    sliding window), false for kinds that do not define it (e.g. linear-attention states)."""
    layers = getattr(cache, "layers", None)
    if not layers or not callable(getattr(cache, "batch_select_indices", None)):
        return False
    return all(callable(getattr(layer, "batch_select_indices", None)) for layer in layers)


def presized_cache(config: Any, capacity: int) -> DynamicCache:
    """``DynamicCache(config=config)`` with each of its plain full-attention layers
    (``DynamicLayer``, not sliding-window or other kinds, which stay as they are) replaced by a
    :class:`PresizedLayer` of ``capacity`` positions."""
    cache = DynamicCache(config=config)
    cache.layers = [
        PresizedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache
