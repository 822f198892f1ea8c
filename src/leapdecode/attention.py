"""The attention leapdecode's own forwards run, registered through transformers' public `AttentionInterface`.

Inside `leapdecode_attention(model)` the model's attention implementation is switched to "leapdecode" (and back on
exit, so HF `generate` on the same model is untouched). Two cases:

- one sequence over an HF cache (the Runner): grouped-query SDPA. HF's SDPA path copies every key/value head for
  its query heads whenever a mask is passed (any forward of several tokens over a cache); torch's SDPA takes grouped
  heads directly (`enable_gqa`): the same attention without the copy.
- a flat batch of many sequences (the Engine): a `layout` given to the context owns each sequence's keys and values
  and attends every row only within its own sequence (`layout.attend`).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

NAME = "leapdecode"
_layout = contextvars.ContextVar("leapdecode_attention_layout", default=None)


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [1, H, n, d], key/value [1, KVH, L, d] -> ([1, n, H, d], None), as transformers expects."""
    layout = _layout.get()
    if layout is not None:
        out = layout.attend(module.layer_idx, query, key, value, scaling)
    else:
        out = grouped_sdpa(query, key, value, attention_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def _mask(*args, **kwargs):
    """HF's SDPA mask for one sequence; none for a flat batch (the layout knows which rows see which keys)."""
    return None if _layout.get() is not None else sdpa_mask(*args, **kwargs)


AttentionInterface.register(NAME, _attention)
AttentionMaskInterface.register(NAME, _mask)
assert NAME in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping  # else transformers would build no mask at all


def grouped_sdpa(query, key, value, mask=None, scaling=None) -> torch.Tensor:
    """Causal attention of the last n = query.shape[2] positions over key/value (their past, then themselves).
    `mask` is HF's [1, 1, n, >=L] boolean mask, or None (then the causal pattern is built here when n > 1)."""
    n, length = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if mask is None and 1 < n == length:  # a fresh prefill: torch's causal kernel skips the masked half, same values
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    if mask is not None:
        mask = mask[:, :, :, :length]
    elif n > 1:
        mask = causal_mask(n, length, query.device)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)


def causal_mask(n: int, length: int, device=None) -> torch.Tensor:
    """[n, length] boolean: row i (absolute position length - n + i) sees keys 0 .. length - n + i."""
    rows = torch.arange(length - n, length, device=device)[:, None]
    return torch.arange(length, device=device)[None, :] <= rows


@contextlib.contextmanager
def leapdecode_attention(model: torch.nn.Module, layout=None):
    """Run the model's attention as leapdecode's for the duration (over a flat batch if `layout` is given)."""
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = NAME
    token = _layout.set(layout)
    try:
        yield
    finally:
        _layout.reset(token)
        config._attn_implementation = saved
