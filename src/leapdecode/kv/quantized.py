"""Quantized KV (after KIVI, Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"):
keys have outlier channels, so they are quantized per channel over groups of tokens, while values are quantized
per token; the prompt's cache is stored as int8 or packed int4 codes with a scale and minimum per group, and the
few tokens that do not fill a group, as well as every decoded token, stay in full precision."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ..errors import LeapDecodeError, require
from .base import Press, full_prefill

BITS = (8, 4)


def _quantize(x: torch.Tensor, dim: int, bits: int):
    """Asymmetric min/max quantization along `dim`: returns (codes uint8, scale, minimum)."""
    low = x.amin(dim=dim, keepdim=True)
    scale = ((x.amax(dim=dim, keepdim=True) - low) / (2**bits - 1)).clamp_min(1e-8)
    codes = ((x - low) / scale).round_().clamp_(0, 2**bits - 1).to(torch.uint8)
    if bits == 4:  # two codes per byte
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes, scale, low


def _unpack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return codes
    return torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten(-2)


class QuantizedPromptLayer(DynamicLayer):
    """One cache layer whose first `quantized` entries are stored as codes; `update` dequantizes them on the fly."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, bits: int, group: int):
        super().__init__()
        batch, heads, n, dim = keys.shape
        self.bits, self.group, self.dtype, self.device = bits, group, keys.dtype, keys.device
        self.quantized = (n // group) * group
        k = keys[:, :, : self.quantized].float().reshape(batch, heads, n // group, group, dim)
        # keys: per channel over a group of tokens (quantize along the token axis: move it last)
        self.key_codes, self.key_scale, self.key_min = _quantize(k.transpose(-1, -2), -1, bits)
        # values: per token over its head dimension
        self.value_codes, self.value_scale, self.value_min = _quantize(values[:, :, : self.quantized].float(), -1, bits)
        self.tail_keys = keys[:, :, self.quantized :].clone()
        self.tail_values = values[:, :, self.quantized :].clone()
        self.is_initialized = True

    def stored_tensors(self) -> list[torch.Tensor]:
        return [
            self.key_codes,
            self.key_scale,
            self.key_min,
            self.value_codes,
            self.value_scale,
            self.value_min,
            self.tail_keys,
            self.tail_values,
        ]

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of all entries [1, kv_heads, length, head_dim] as attention sees them."""
        k = _unpack(self.key_codes, self.bits).float() * self.key_scale + self.key_min  # [b, h, g, dim, group]
        b, h, g, dim, group = k.shape
        k = k.transpose(-1, -2).reshape(b, h, g * group, dim).to(self.dtype)
        v = (_unpack(self.value_codes, self.bits).float() * self.value_scale + self.value_min).to(self.dtype)
        return torch.cat([k, self.tail_keys], dim=-2), torch.cat([v, self.tail_values], dim=-2)

    @property
    def keys(self):
        return self.dequantized()[0] if self.is_initialized else None

    @keys.setter
    def keys(self, value):  # the base class initialises the attribute; the data lives in codes and tails
        pass

    @property
    def values(self):
        return self.dequantized()[1] if self.is_initialized else None

    @values.setter
    def values(self, value):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        self.tail_keys = torch.cat([self.tail_keys, key_states], dim=-2)
        self.tail_values = torch.cat([self.tail_values, value_states], dim=-2)
        return self.dequantized()

    def get_seq_length(self) -> int:
        return self.quantized + self.tail_keys.shape[-2]

    def crop(self, tokens_to_remove: int) -> None:
        remove = abs(tokens_to_remove)
        if remove == 0:
            return
        if tokens_to_remove > 0 or remove > self.tail_keys.shape[-2]:
            raise LeapDecodeError("cannot roll back into the quantized prompt cache")
        self.tail_keys = self.tail_keys[..., :-remove, :]
        self.tail_values = self.tail_values[..., :-remove, :]


def bytes_fraction(bits: int, element_size: int, head_dim: int, group: int) -> float:
    """Bytes per stored element relative to the full-precision cache (codes + float32 scale and minimum)."""
    per_key = bits / 8 + 8 / group
    per_value = bits / 8 + 8 / head_dim
    return (per_key + per_value) / (2 * element_size)


class QuantizedPress(Press):
    name = "quantized"
    posthoc = True

    def __init__(self, budget: float = 1.0, bits: int | None = None, group: int = 64):
        super().__init__(budget)
        require(bits is None or bits in BITS, f"quantized KV supports bits 8 or 4, got {bits}")
        require(
            isinstance(group, int) and group >= 2 and group % 2 == 0,
            f"quantized KV key group must be an even integer >= 2, got {group}",
        )
        self.bits, self.group = bits, group

    def kept(self, n: int) -> int:
        return n  # quantization keeps every entry, only smaller

    def bits_for(self, model) -> int | None:
        """The bits used for this model: explicit `bits`, else the widest whose bytes fit the budget (None = no
        quantization at budget 1.0)."""
        if self.bits is not None:
            return self.bits
        if self.budget >= 1.0:
            return None
        element = next(model.parameters()).element_size()
        head_dim = (
            getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
        )
        for bits in BITS:
            if bytes_fraction(bits, element, head_dim, self.group) <= self.budget + 1e-9:
                return bits
        smallest = bytes_fraction(4, element, head_dim, self.group)
        raise LeapDecodeError(
            f"quantized KV cannot reach budget {self.budget}: int4 keeps {smallest:.3f} of the "
            "full cache's bytes for this model"
        )

    def check(self, model) -> None:
        super().check(model)
        self.bits_for(model)

    @torch.inference_mode()
    def prefill(self, model, input_ids, cache):
        self.check(model)
        logits, _ = full_prefill(model, input_ids, cache)
        self.compress(cache, input_ids.shape[1], model=model)
        return logits

    def compress(self, cache, n: int, windows=None, model=None) -> None:
        bits = self.bits_for(model)
        if bits is None:
            return
        for i, layer in enumerate(cache.layers):
            cache.layers[i] = QuantizedPromptLayer(layer.keys, layer.values, bits, self.group)

    def settings(self) -> dict:
        return {**super().settings(), "bits": self.bits, "group": self.group}
