"""FastKV (Jo et al. 2025, "FastKV: KV Cache Compression for Fast Long-Context Processing with Token-Selective
Propagation"): run the full context only up to the TSP layer, where the window's attention picks the tokens worth
propagating; later layers compute just those tokens, and every layer independently keeps its KV budget of entries
by GQA-aware SnapKV scores — so prefill compute (TSP layer, TSP rate) and decode memory (budget) are tuned apart.

One constraint of this engine: all layers must hold the same number of entries (the causal mask of a multi-token
verification forward is built from one layer's length), so the propagated set is never smaller than the budget:
tokens propagated = max(tsp_rate, budget) * n.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import create_causal_mask

from ..compat import cache_arg
from ..errors import LeapDecodeError, require
from .base import (
    Press,
    Window,
    cache_attention,
    fused_layers,
    gather_entries,
    keep_count,
    pool_scores,
    select_top,
    window_scores,
)


class FastKVPress(Press):
    name = "fastkv"

    def __init__(
        self, budget: float = 1.0, tsp_layer: int | None = None, tsp_rate: float = 0.2, window: int = 8, kernel: int = 7
    ):
        super().__init__(budget)
        require(
            tsp_layer is None or (isinstance(tsp_layer, int) and not isinstance(tsp_layer, bool)),
            f"fastkv TSP layer must be an integer layer index, got {tsp_layer!r}",
        )
        require(
            isinstance(tsp_rate, (int, float)) and 0 < tsp_rate <= 1,
            f"fastkv TSP rate must be in (0, 1] (the fraction of tokens propagated past the TSP layer), got {tsp_rate}",
        )
        require(isinstance(window, int) and window >= 1, f"fastkv window must be a positive integer, got {window}")
        require(
            isinstance(kernel, int) and kernel >= 1 and kernel % 2 == 1,
            f"fastkv pooling kernel must be a positive odd integer, got {kernel}",
        )
        self.tsp_layer, self.tsp_rate, self.window, self.kernel = tsp_layer, float(tsp_rate), window, kernel

    def layer_of(self, model) -> int:
        """The TSP layer index for this model. Default: the middle (layers // 2 - 1; the paper uses 15 of 32), where
        on SmolLM2-135M the window's attention first finds a hidden fact reliably (layer 14 of 30)."""
        layers = model.config.num_hidden_layers
        if self.tsp_layer is None:
            return max(0, layers // 2 - 1)
        return self.tsp_layer

    def check(self, model) -> None:
        super().check(model)
        layers = model.config.num_hidden_layers
        if self.tsp_layer is not None and not 0 <= self.tsp_layer < layers:
            raise LeapDecodeError(
                f"fastkv TSP layer {self.tsp_layer} is outside the model's layers "
                f"(0..{layers - 1} for this {layers}-layer model)"
            )

    def kept(self, n: int) -> int:
        return keep_count(self.budget, n, minimum=min(n, self.window))

    def propagated(self, n: int) -> int:
        """Tokens that reach the layers after the TSP layer."""
        return max(keep_count(self.tsp_rate, n, minimum=min(n, self.window)), self.kept(n))

    @torch.inference_mode()
    def prefill(self, model, input_ids, cache):
        self.check(model)
        inner = model.model
        n = input_ids.shape[1]
        tsp, keep, chosen = self.layer_of(model), self.kept(n), self.propagated(n)
        hidden = inner.embed_tokens(input_ids)
        positions = torch.arange(n).unsqueeze(0)
        fused = fused_layers(model)
        attend = cache_attention(cache)

        cos, sin = inner.rotary_emb(hidden, positions)
        mask = _mask(model, hidden)
        for i, block in enumerate(inner.layers[: model.config.num_hidden_layers]):
            length = hidden.shape[1]
            w = min(self.window, length)
            select_tokens = i == tsp and chosen < length
            compress = keep < length
            if select_tokens or compress:
                win = Window(block.input_layernorm(hidden[:, -w:]), cos[:, -w:], sin[:, -w:])
            if fused is not None:  # the fused layer (the Runner's own forward), attending over the same cache
                hidden = fused.layer(i, hidden, cos, sin, attend)
            else:
                hidden = block(
                    hidden,
                    attention_mask=mask,
                    position_ids=positions,
                    **cache_arg(cache),
                    use_cache=True,
                    position_embeddings=(cos, sin),
                )
            if not (select_tokens or compress):
                continue
            layer = cache.layers[i]
            scores = window_scores(block.self_attn, win, layer.keys)  # [kv_heads, length]
            if compress:
                gather_entries(layer, select_top(pool_scores(scores, self.kernel), keep, w))
            if select_tokens:  # Token-Selective Propagation: one token set for all heads
                index = select_top(pool_scores(scores.sum(0), self.kernel), chosen, w)
                hidden, positions = hidden[:, index], positions[:, index]
                cos, sin = cos[:, index], sin[:, index]
                mask = _mask(model, hidden)
        hidden = inner.norm(hidden[:, -1:])
        return model.lm_head(hidden)[0, -1]

    def settings(self) -> dict:
        return {
            **super().settings(),
            "tsp_layer": self.tsp_layer,
            "tsp_rate": self.tsp_rate,
            "window": self.window,
            "kernel": self.kernel,
        }


def _mask(model, hidden):
    """The causal mask HF would build for a fresh prefill of `hidden` (None for SDPA: it uses is_causal)."""
    return create_causal_mask(
        config=model.config, inputs_embeds=hidden, attention_mask=None, **cache_arg(None), position_ids=None
    )
