"""Runner: owns one causal LM and its KV cache. The only place that calls the model's forward pass."""
from __future__ import annotations

import torch
from transformers import DynamicCache


class Runner:
    """Prefill a prompt, feed any number of new tokens at once, and roll back rejected positions.

    `position` counts the tokens the model has seen (the next token's position id). It equals the KV cache length
    unless a KV press dropped entries, which is why position ids are always passed explicitly.
    A `press` (see leapdecode.kv) may compress the cache during prefill; decoding and rollback work the same after it.
    """

    def __init__(self, model: torch.nn.Module, press=None):
        self.model = model
        self.press = press
        self.cache: DynamicCache | None = None
        self.position = 0

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    @torch.inference_mode()
    def prefill(self, token_ids: list[int]) -> torch.Tensor:
        """Start a new sequence; return the logits [V] that predict the token after the prompt."""
        self.cache = DynamicCache(config=self.model.config)
        self.position = 0
        if self.press is not None:
            logits = self.press.prefill(self.model, self._ids(token_ids), self.cache)
            self.position = len(token_ids)
            return logits
        return self._forward(token_ids, logits_to_keep=1)[-1]

    @torch.inference_mode()
    def forward(self, token_ids: list[int]) -> torch.Tensor:
        """Append tokens to the sequence; return logits [len(token_ids), V], row i predicting the token after i."""
        return self._forward(token_ids, logits_to_keep=0)

    def rollback(self, n: int) -> None:
        """Forget the last n positions (rejected draft tokens)."""
        if n > 0:
            self.cache.crop(-n)
            self.position -= n

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor([token_ids], dtype=torch.long)

    def _forward(self, token_ids: list[int], logits_to_keep: int) -> torch.Tensor:
        n = len(token_ids)
        past = self.cache_length
        out = self.model(
            input_ids=self._ids(token_ids),
            past_key_values=self.cache,
            use_cache=True,
            position_ids=torch.arange(self.position, self.position + n).unsqueeze(0),
            cache_position=torch.arange(past, past + n),
            logits_to_keep=logits_to_keep,
        )
        self.position += n
        return out.logits[0]
