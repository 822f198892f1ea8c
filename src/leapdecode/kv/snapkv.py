"""SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation"): the attention that the
last prompt tokens (the observation window, usually the question) pay to the context predicts which entries will
matter while generating, so each KV head keeps its most-attended entries (pooled, to keep neighbours) + the window."""

from __future__ import annotations

import torch

from ..errors import require
from .base import Press, Window, full_prefill, gather_entries, pool_scores, select_top, window_scores


class SnapKVPress(Press):
    name = "snapkv"
    posthoc = True

    def __init__(self, budget: float = 1.0, window: int = 32, kernel: int = 7):
        super().__init__(budget)
        require(isinstance(window, int) and window >= 1, f"snapkv window must be a positive integer, got {window}")
        require(
            isinstance(kernel, int) and kernel >= 1 and kernel % 2 == 1,
            f"snapkv pooling kernel must be a positive odd integer, got {kernel}",
        )
        self.window, self.kernel = window, kernel

    @torch.inference_mode()
    def prefill(self, model, input_ids, cache):
        self.check(model)
        n = input_ids.shape[1]
        need = self.kept(n) < n
        logits, windows = full_prefill(model, input_ids, cache, window=self.window if need else 0)
        if need:
            self.compress(cache, n, windows, model)
        return logits

    def compress(self, cache, n: int, windows, model) -> None:
        """Shrink every layer of a full prefill's cache to the budget, given the windows full_prefill remembered."""
        keep = self.kept(n)
        if keep >= n:
            return
        for layer, win, block in zip(cache.layers, windows, model.model.layers):
            win = _last(win, self.window)
            scores = pool_scores(window_scores(block.self_attn, win, layer.keys), self.kernel)
            gather_entries(layer, select_top(scores, keep, win.hidden.shape[1]))

    def settings(self) -> dict:
        return {**super().settings(), "window": self.window, "kernel": self.kernel}


def _last(win: Window, w: int) -> Window:
    """The last w positions of a remembered window (the bench shares one wide window among presses)."""
    if win.hidden.shape[1] <= w:
        return win
    return Window(win.hidden[:, -w:], win.cos[:, -w:], win.sin[:, -w:])
