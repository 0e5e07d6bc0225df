"""KV caches for the decoding loop: preallocated per-row buffers, and prompts kept once per group.

`BufferedLayer` holds each row's keys and values in a buffer with room for the whole generation, so a decode step
writes one position instead of concatenating the cache. `GroupedLayer` keeps each distinct prompt's keys and values
once, `(G, H, P, D)`, and only the generated positions per row: attention then reads a prompt once per group instead
of once per row (`column_step._attend_grouped`), and the prompt's cache is never copied to the rows. It needs the
rows grouped in order, `num_generations` per prompt (how GRPO batches come); when rows leave the batch, `ungrouped`
turns the cache into plain per-row buffers.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


def cache_kwarg(forward) -> str:
    """The name under which `forward` takes a KV cache: `cache` from transformers 5.24 on (where `past_key_values` is
    deprecated, to be removed in 5.40), `past_key_values` before."""
    return _cache_kwarg(getattr(forward, "__func__", forward))


@functools.cache
def _cache_kwarg(function) -> str:
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


class BufferedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values `(B, H, length, D)` are views of `(B, H, capacity, D)` buffers:
    appending writes in place instead of concatenating the whole cache."""

    def __init__(self, keys: Tensor, values: Tensor, capacity: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.length = 0
        self.key_buffer = keys.new_empty(*keys.shape[:2], max(capacity, keys.size(2)), keys.size(3))
        self.value_buffer = values.new_empty(*values.shape[:2], self.key_buffer.size(2), values.size(3))
        self.is_initialized = True
        self.update(keys, values)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        end = self.length + key_states.size(2)
        if end > self.key_buffer.size(2):  # more than planned: grow
            grow = (0, 0, 0, end - self.key_buffer.size(2))
            self.key_buffer = nn.functional.pad(self.key_buffer, grow)
            self.value_buffer = nn.functional.pad(self.value_buffer, grow)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]


def buffered_cache(cache: DynamicCache, index: Tensor, *, capacity: int) -> Cache:
    """A cache of `BufferedLayer`s whose row b holds row `index[b]` of the filled `cache`, with room for `capacity`
    positions per layer."""
    return Cache(layers=[BufferedLayer(layer.keys[index], layer.values[index], capacity) for layer in cache.layers])


class GroupedLayer:
    """One layer's cache for rows in groups of `group_size` consecutive rows sharing a prompt: the prompts' keys and
    values `(G, H, P, D)` once, and each row's generated positions in a `BufferedLayer` `(G * group_size, H, t, D)`.
    `update` appends to (and returns) the generated part only."""

    def __init__(self, prompt_keys: Tensor, prompt_values: Tensor, group_size: int, capacity: int):
        self.prompt_keys, self.prompt_values = prompt_keys.contiguous(), prompt_values.contiguous()
        self.group_size, self.capacity = group_size, capacity
        groups, heads, prompt_len, head_dim = self.prompt_keys.shape
        empty = self.prompt_keys.new_empty(groups * group_size, heads, 0, head_dim)
        self.generated = BufferedLayer(empty, empty, max(1, capacity - prompt_len))

    def update(self, key_states: Tensor, value_states: Tensor) -> tuple[Tensor, Tensor]:
        return self.generated.update(key_states, value_states)

    def get_seq_length(self) -> int:
        return self.prompt_keys.size(2) + self.generated.length

    def per_row(self) -> BufferedLayer:
        """The same cache as plain per-row buffers (the prompt copied to each of its rows), with the same room."""
        keys = torch.cat([self.prompt_keys.repeat_interleave(self.group_size, 0), self.generated.keys], dim=2)
        values = torch.cat([self.prompt_values.repeat_interleave(self.group_size, 0), self.generated.values], dim=2)
        return BufferedLayer(keys, values, self.capacity)


def grouped_cache(cache: DynamicCache, group_size: int, *, capacity: int) -> Cache:
    """`GroupedLayer`s over the filled `cache` of G distinct prompts, for rows `[0] * group_size + [1] * group_size
    + ...`, with room for `capacity` positions in all."""
    return Cache(layers=[GroupedLayer(layer.keys, layer.values, group_size, capacity) for layer in cache.layers])


def ungrouped(cache: Cache) -> Cache:
    """`cache` with any `GroupedLayer` turned into per-row buffers (the rows can then be selected)."""
    if not any(isinstance(layer, GroupedLayer) for layer in cache.layers):
        return cache
    return Cache(layers=[layer.per_row() if isinstance(layer, GroupedLayer) else layer for layer in cache.layers])
