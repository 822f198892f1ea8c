"""The press interface and the pieces every press shares: architecture checks, the budget, a full prefill that
remembers each layer's last queries, SnapKV-style window scores, and per-head selection of cache entries.

A press compresses the KV cache of the prompt during prefill (kvpress's convention: one press per file). After
prefill every layer holds the same number of entries (the causal mask of a multi-token verification forward is
built from one layer's length), decoded tokens are appended uncompressed, and rollback only ever removes decoded
tokens, so speculative decoding over a compressed cache is as lossless as over a full one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ..compat import cache_arg
from ..errors import LeapDecodeError, require
from ..kernels.fused_decoder import existing_decoder
from ..kernels.packed import kernels_on
from .slots import CacheSlot, FlatBatch, Segment

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def check_budget(budget) -> float:
    try:
        value = float(budget)
    except (TypeError, ValueError):
        raise LeapDecodeError(f"KV budget must be a number in (0, 1], got {budget!r}") from None
    require(
        0.0 < value <= 1.0 and math.isfinite(value),
        f"KV budget must be in (0, 1] (a fraction of the prompt's KV entries), got {budget}",
    )
    return value


def check_architecture(model, press_name: str) -> None:
    """Presses run the decoder layers of HF Llama/Qwen2-family models with full (not sliding) attention."""
    config = model.config
    kind = getattr(config, "model_type", type(model).__name__)
    require(
        kind in SUPPORTED_MODEL_TYPES and hasattr(getattr(model, "model", None), "layers"),
        f"KV press '{press_name}' is not available for model type '{kind}' "
        f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
    )
    layer_types = getattr(config, "layer_types", None) or []
    require(
        all(t == "full_attention" for t in layer_types),
        f"KV press '{press_name}' needs full attention in every layer; this '{kind}' model uses sliding windows",
    )


class Press:
    """A KV-cache press. `prefill(model, input_ids[1, n], cache)` fills `cache` (a DynamicCache) for the prompt,
    compressed, and returns the logits [V] that predict the token after it. `check(model)` raises LeapDecodeError
    for a model the press cannot run on; `kept(n)` is the number of entries every layer holds after prefill."""

    name = "press"

    def __init__(self, budget: float = 1.0):
        self.budget = check_budget(budget)

    def check(self, model) -> None:
        check_architecture(model, self.name)

    def kept(self, n: int) -> int:
        """Cache entries per layer (and per KV head) after prefilling n prompt tokens."""
        return keep_count(self.budget, n)

    posthoc = False  # True: prefill is a full prefill followed by compress() (kv/bench times the two apart)

    def prefill(self, model, input_ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        raise NotImplementedError

    def compress(self, cache: DynamicCache, n: int, windows=None, model=None) -> None:
        """Post-hoc presses: compress, in place, a full prefill's cache of n prompt entries (`windows`: the last
        queries of each layer that full_prefill recorded)."""
        raise NotImplementedError(f"KV press '{self.name}' compresses inside its own prefill")

    def settings(self) -> dict:
        """The options that define this press, for reports."""
        return {"press": self.name, "budget": self.budget}

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in self.settings().items() if k != "press")
        return f"{type(self).__name__}({options})"


def keep_count(budget: float, n: int, minimum: int = 1) -> int:
    """Entries kept from n at this budget: ceil(budget * n), at least `minimum` (never more than n)."""
    return min(n, max(minimum, math.ceil(budget * n - 1e-9)))


@dataclass
class Window:
    """What one layer's attention saw for the last w prompt tokens: normed hidden states and their RoPE cos/sin."""

    hidden: torch.Tensor  # [1, w, hidden]
    cos: torch.Tensor  # [1, w, head_dim]
    sin: torch.Tensor


def full_prefill(
    model, input_ids: torch.Tensor, cache: DynamicCache, window: int = 0
) -> tuple[torch.Tensor, list[Window]]:
    """The ordinary prefill (exactly what the Runner does without a press), remembering for each layer the inputs
    of its attention for the last `window` tokens (nothing when window is 0). Returns (logits [V], windows)."""
    fused = fused_layers(model)
    if fused is not None:  # the Runner's own forward, one layer at a time, over the press's cache
        return _fused_prefill(model, fused, input_ids, cache, window)
    windows: list[Window] = []
    hooks = []
    if window > 0:

        def grab(module, args, kwargs):
            cos, sin = kwargs["position_embeddings"]
            windows.append(Window(kwargs["hidden_states"][:, -window:].clone(), cos[:, -window:], sin[:, -window:]))

        hooks = [layer.self_attn.register_forward_pre_hook(grab, with_kwargs=True) for layer in model.model.layers]
    n = input_ids.shape[1]
    try:
        out = model(
            input_ids=input_ids,
            **cache_arg(cache),
            use_cache=True,
            position_ids=torch.arange(n).unsqueeze(0),
            logits_to_keep=1,
        )
    finally:
        for hook in hooks:
            hook.remove()
    return out.logits[0, -1], windows


def fused_layers(model):
    """The model's fused decoder when the forward running now uses leapdecode's kernels (a press then runs the same
    layers as the Runner), else None (HF's own decoder blocks)."""
    return existing_decoder(model) if kernels_on() else None


def cache_attention(cache: DynamicCache):
    """The fused layers' attention callback over an HF cache: append the layer's new keys/values and attend causally,
    through the same kernel as the Runner's forward without a press (kv.slots.FlatBatch over the cache), so that a
    press keeping every entry keeps exactly the Runner's keys and values."""

    def attend(layer, query, key, value, scaling):
        past = cache.get_seq_length(layer) if layer < len(cache.layers) else 0
        batch = FlatBatch([Segment(CacheSlot(cache), 0, query.shape[2], past)])
        batch.native_attention = kernels_on()
        return batch.attend(layer, query, key, value, scaling)

    return attend


def _fused_prefill(model, fused, input_ids: torch.Tensor, cache: DynamicCache, window: int):
    """full_prefill on the fused decoder's layers: the same keys/values and logits the Runner computes without a
    press (so a press at budget 1 keeps exactly the Runner's cache), and each layer's attention input over the
    window (its input norm applied to the last `window` rows, row by row as in the layer)."""

    n = input_ids.shape[1]
    x, cos, sin = fused.embed(input_ids[0], torch.arange(n, device=input_ids.device))
    windows: list[Window] = []
    for i, layer in enumerate(model.model.layers):
        if window > 0:
            normed = layer.input_layernorm(x[:, -window:])
            windows.append(Window(normed, cos[:, -window:], sin[:, -window:]))
        x = fused.layer(i, x, cos, sin, cache_attention(cache))
    hidden = model.model.norm(x[:, -1:])
    return model.get_output_embeddings()(hidden[0])[-1], windows


def window_scores(attn: torch.nn.Module, win: Window, keys: torch.Tensor) -> torch.Tensor:
    """SnapKV's observation: attention of the last w queries over all n keys of one layer, softmaxed (causal
    inside the window), averaged over the window and over the query heads that share each KV head (GQA-aware).
    keys: [1, kv_heads, n, head_dim] with RoPE applied. Returns [kv_heads, n] in float32."""
    w = win.hidden.shape[1]
    head_dim = attn.head_dim
    query = attn.q_proj(win.hidden).view(1, w, -1, head_dim).transpose(1, 2)
    query, _ = apply_rotary_pos_emb(query, query, win.cos, win.sin)
    kv_heads, n = keys.shape[1], keys.shape[2]
    groups = query.shape[1] // kv_heads
    query = query.float().reshape(kv_heads, groups * w, head_dim)
    logits = torch.matmul(query, keys[0].float().transpose(1, 2)) * attn.scaling  # [kv, g*w, n]
    logits = logits.view(kv_heads, groups, w, n)
    future = torch.ones(w, w, dtype=torch.bool).triu(1)  # query i (position n-w+i) may not see keys after it
    logits[..., n - w :].masked_fill_(future, float("-inf"))
    return logits.softmax(-1).mean(dim=(1, 2))


def pool_scores(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """Smooth scores [..., n] along the sequence (SnapKV's clustering: keep the neighbours of a hit too)."""
    if kernel <= 1:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    return F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2, count_include_pad=False).reshape(shape)


def select_top(scores: torch.Tensor, keep: int, window: int) -> torch.Tensor:
    """Indices [..., keep] (ascending) of the `keep` entries to retain: the last `window` always, the rest by score."""
    n = scores.shape[-1]
    window = min(window, keep)
    recent = torch.arange(n - window, n).expand(*scores.shape[:-1], window)
    if keep == window:
        return recent.contiguous()
    top = scores[..., : n - window].topk(keep - window, dim=-1).indices
    return torch.cat([top, recent], dim=-1).sort(dim=-1).values


def gather_entries(layer, index: torch.Tensor) -> None:
    """Keep only the entries `index` of one cache layer: index [kv_heads, keep] (per head) or [keep] (shared)."""
    if index.dim() == 1:
        layer.keys = layer.keys[:, :, index].contiguous()
        layer.values = layer.values[:, :, index].contiguous()
        return
    expand = index[None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
    layer.keys = layer.keys.gather(2, expand)
    layer.values = layer.values.gather(2, expand)


def kv_bytes(cache) -> int:
    """Bytes held by the tensors of a KV cache (quantized layers count their codes, scales and full-precision tail)."""
    if cache is None:
        return 0
    total = 0
    for layer in cache.layers:
        if hasattr(layer, "stored_tensors"):
            tensors = layer.stored_tensors()
        elif getattr(layer, "is_initialized", False):
            tensors = [layer.keys, layer.values]
        else:
            tensors = []
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total
