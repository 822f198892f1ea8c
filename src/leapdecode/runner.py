"""Runner: one sequence of one model, run through the one forward (leapdecode.forward) as a flat batch of one.

Its keys/values live in the engine's slot type (kv.slots.SequenceKV): a single request is the engine's one-sequence
case, with the same attention, kernels and rollback. A KV press (see leapdecode.kv) fills an HF cache during prefill,
compressed; decoding then goes on over that cache through the same slot interface (kv.slots.CacheSlot). With a
prefix cache (kv.prefix_cache), a prompt starts from the cached keys/values of its longest known prefix and the
finished sequence leaves its own there (`remember`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .forward import ModelForward, final_norm_output, model_kernels
from .kv.buffered import buffered_cache
from .kv.slots import CacheSlot, FlatBatch, Segment, SequenceKV


class Runner:
    """Prefill a prompt, feed any number of new tokens at once, and roll back rejected positions.

    `position` counts the tokens the model has seen (the next token's position id). It equals the KV length unless a
    KV press dropped entries, which is why position ids are always passed explicitly.
    `packed_weights`: leapdecode's kernels (see forward.ModelForward); False keeps HF's forward and `F.linear`.
    With `argmax_only` (greedy decoding reads nothing else), returned logits are faithful only in their argmax.
    With `keep_hidden`, `hidden` holds the final-norm hidden states of the rows of the last returned logits (what a
    draft head drafts from), or None when the forward did not pass the final norm (a KV press prefill may not).
    """

    def __init__(self, model: torch.nn.Module, press=None, packed_weights: bool = True, prefix_cache=None):
        self.model = model
        self.press = press
        self.packed_weights = packed_weights
        self.run = ModelForward(model, packed_weights)
        # a press compresses what it caches; models whose rows must be read in one call (forward.rows_alone) too
        self.prefix_cache = None if press is not None or self.run.rows_alone else prefix_cache
        self.reused = 0  # prompt tokens the last prefill took from the prefix cache
        self.argmax_only = False
        self.kv: SequenceKV | CacheSlot | None = None
        self.position = 0
        self.keep_hidden = False
        self.hidden: torch.Tensor | None = None

    @property
    def decoder(self):
        return self.run.decoder

    @property
    def cache(self) -> DynamicCache | None:
        """The HF cache a KV press filled (None without a press)."""
        return self.kv.cache if isinstance(self.kv, CacheSlot) else None

    def use_cache(self, cache: DynamicCache, position: int) -> None:
        """Go on from an HF cache filled elsewhere (a press's), `position` tokens into the sequence."""
        self.kv, self.position = CacheSlot(cache), position

    def kv_layers(self) -> list:
        """Per layer the valid keys and values ([1, kv_heads, length, head_dim]), whatever holds them."""
        return self.kv.layers()

    @property
    def cache_length(self) -> int:
        return self.kv.length if self.kv is not None else 0

    @torch.inference_mode()
    def prefill(self, token_ids: list[int]) -> torch.Tensor:
        """Start a new sequence; return the logits [V] that predict the token after the prompt."""
        self.position = self.reused = 0
        if self.press is not None:
            cache = buffered_cache(self.model.config)
            kernels = model_kernels(self.model, self.packed_weights, self.argmax_only)
            with kernels, final_norm_output(self.model, self.keep_hidden) as captured:
                logits = self.press.prefill(self.model, self._ids(token_ids)[None], cache)
            self.hidden = captured[-1][0, -1:] if captured else None
            self.use_cache(cache, len(token_ids))
            return logits
        self.kv = SequenceKV(self.model.config.num_hidden_layers)
        cached = self.prefix_cache.lookup(token_ids) if self.prefix_cache is not None else None
        if cached is not None:
            self.kv.load(*cached)
        self.position = self.reused = self.kv.length
        return self._forward(token_ids[self.position :], last_only=True)[-1]

    def remember(self, tokens: list[int]) -> None:
        """Leave the sequence's keys/values in the prefix cache; `tokens`: the sequence so far (its rows 0.. are
        theirs; the last token, not yet fed, has none)."""
        if self.prefix_cache is not None and isinstance(self.kv, SequenceKV):
            self.prefix_cache.insert(tokens, self.kv)

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Append tokens to the sequence; return logits [len(token_ids), V], row i predicting the token after i
        (only the last row with `last_only`: the output head is costly per position for large vocabularies)."""
        return self._forward(token_ids, last_only)

    def rollback(self, n: int) -> None:
        """Forget the last n positions (rejected draft tokens)."""
        if n > 0:
            self.kv.truncate(self.kv.length - n)
            self.position -= n

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor(token_ids, dtype=torch.long, device=self.model.device)

    def _forward(self, token_ids: list[int], last_only: bool) -> torch.Tensor:
        n = len(token_ids)
        layout = FlatBatch([Segment(self.kv, 0, n, self.kv.length)])
        positions = torch.arange(self.position, self.position + n, device=self.model.device)
        keep = torch.arange(n - 1 if last_only else 0, n, device=self.model.device)
        logits, self.hidden = self.run(
            self._ids(token_ids), positions, layout, keep, argmax_only=self.argmax_only, hidden=self.keep_hidden
        )
        self.position += n
        return logits
