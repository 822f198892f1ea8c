"""StreamingLLM (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"): keep the first few
tokens, which soak up attention as "sinks", plus the most recent window, and drop everything in between."""

from __future__ import annotations

import torch

from ..errors import require
from .base import Press, full_prefill, gather_entries, keep_count


class StreamingLLMPress(Press):
    name = "streaming-llm"
    posthoc = True

    def __init__(self, budget: float = 1.0, sinks: int = 4):
        super().__init__(budget)
        require(
            isinstance(sinks, int) and sinks >= 0, f"streaming-llm sinks must be a non-negative integer, got {sinks}"
        )
        self.sinks = sinks

    def kept(self, n: int) -> int:
        return keep_count(self.budget, n, minimum=min(n, self.sinks + 1))

    @torch.inference_mode()
    def prefill(self, model, input_ids, cache):
        self.check(model)
        logits, _ = full_prefill(model, input_ids, cache)
        self.compress(cache, input_ids.shape[1])
        return logits

    def compress(self, cache, n: int, windows=None, model=None) -> None:
        keep = self.kept(n)
        if keep >= n:
            return
        sinks = min(self.sinks, keep - 1)
        index = torch.cat([torch.arange(sinks), torch.arange(n - (keep - sinks), n)])
        for layer in cache.layers:
            gather_entries(layer, index)

    def settings(self) -> dict:
        return {**super().settings(), "sinks": self.sinks}
