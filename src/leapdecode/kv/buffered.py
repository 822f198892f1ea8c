"""A KV cache whose layers grow in place. HF's DynamicLayer concatenates the whole cache with every step's new keys
and values, copying O(context) bytes per layer per step (at 1,200 tokens of SmolLM2-135M: 55 MB a step, a tenth of the
weights a decode step reads). Here each layer keeps a buffer with spare room: a step writes only its new rows, a
rollback only shortens the view, and the buffer is reallocated (with room to spare again) only when it is full."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .slots import room_for

SPARE = 256  # rows of room added beyond the need at each reallocation (at least; half the length for long caches)


class BufferedLayer(DynamicLayer):
    """`keys`/`values` are views of the first rows of a larger buffer. Anything that replaces them (a KV press
    pruning the prompt) simply hands over new tensors: the next update copies them into a fresh buffer."""

    key_buffer: torch.Tensor | None = None
    value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        need = length + key_states.shape[-2]
        if not self._views_buffer() or need > self.key_buffer.shape[-2]:
            self._reallocate(key_states, value_states, length, room_for(need, SPARE))
        self.key_buffer[..., length:need, :] = key_states
        self.value_buffer[..., length:need, :] = value_states
        self.keys, self.values = self.key_buffer[..., :need, :], self.value_buffer[..., :need, :]
        return self.keys, self.values

    def _views_buffer(self) -> bool:
        """Whether keys/values are still the buffers' leading rows (not replaced from outside)."""
        return self.key_buffer is not None and all(
            view.numel() == 0 or (view.data_ptr() == buffer.data_ptr() and view.stride() == buffer.stride())
            for view, buffer in ((self.keys, self.key_buffer), (self.values, self.value_buffer))
        )

    def _reallocate(self, key_states, value_states, length: int, capacity: int) -> None:
        self.key_buffer = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if length:
            self.key_buffer[..., :length, :] = self.keys
            self.value_buffer[..., :length, :] = self.values


def buffered_cache(config) -> DynamicCache:
    """HF's DynamicCache for `config`, its full-attention layers replaced by BufferedLayers (sliding-window layers,
    which trim themselves, stay as they are)."""
    cache = DynamicCache(config=config)
    cache.layers = [BufferedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
