"""Prefix cache: keys/values of prompt prefixes that earlier requests computed, reused by later ones.

The RadixAttention/Hydragen observation: requests of one deployment share long prefixes (a system prompt, the
earlier turns of a chat), and recomputing them is most of a prefill. Prompts are cut into blocks of `block` tokens;
a block is keyed by its tokens and its parent's key (so a key names the whole prefix up to the block's end, as in
vLLM's prefix caching), and holds that block's keys/values for every layer. A new prompt reuses its longest run of
cached blocks from the start and computes only the rest. Memory is bounded by `max_tokens`; the least recently used
blocks go first. One cache belongs to one engine, hence to one model and dtype; the engine runs no KV press, so
entries are always the model's exact keys/values at those positions.

`generate` keeps one cache per model too (`for_model`), filled with each call's prompt and output: the next turn of
a chat, whose prompt repeats the whole conversation so far, computes only its new message (as OpenVINO GenAI and
llama.cpp reuse a conversation's KV).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .slots import SequenceKV


@dataclass
class _Block:
    tokens: tuple[int, ...]
    parent: int | None
    keys: list[torch.Tensor]  # per layer [kv_heads, block, head_dim]
    values: list[torch.Tensor]


class PrefixCache:
    def __init__(self, max_tokens: int, block: int = 16):
        self.max_tokens, self.block = max_tokens, block
        self.blocks: OrderedDict[int, _Block] = OrderedDict()
        self.hits = self.queries = 0

    @property
    def tokens(self) -> int:
        return len(self.blocks) * self.block

    def _keys(self, tokens: list[int], limit: int):
        """(key, parent key, block tokens) of each full block of tokens[:limit]."""
        parent = None
        for start in range(0, limit - self.block + 1, self.block):
            chunk = tuple(tokens[start : start + self.block])
            key = hash((parent, chunk))
            yield key, parent, chunk
            parent = key

    def lookup(self, tokens: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Keys/values of the longest cached prefix of `tokens` (at least one token is always left to compute, so
        the prompt's last position still gets its logits), or None."""
        self.queries += 1
        found: list[_Block] = []
        for key, parent, chunk in self._keys(tokens, len(tokens) - 1):
            entry = self.blocks.get(key)
            if entry is None or entry.tokens != chunk or entry.parent != parent:
                break
            self.blocks.move_to_end(key)
            found.append(entry)
        if not found:
            return None
        self.hits += 1
        layers = range(len(found[0].keys))
        return (
            [torch.cat([b.keys[i] for b in found], dim=1) for i in layers],
            [torch.cat([b.values[i] for b in found], dim=1) for i in layers],
        )

    def insert(self, tokens: list[int], kv: SequenceKV) -> None:
        """Remember the full blocks of `tokens`, whose keys/values are rows 0.. of `kv`."""
        if self.max_tokens < self.block:
            return
        for index, (key, parent, chunk) in enumerate(self._keys(tokens, min(len(tokens), kv.length))):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            start = index * self.block
            keys, values = kv.rows(start, start + self.block)
            self.blocks[key] = _Block(chunk, parent, keys, values)
        while self.tokens > self.max_tokens:
            self.blocks.popitem(last=False)

    def evict(self, tokens: int) -> int:
        """Drop least recently used blocks until `tokens` rows are freed (or the cache is empty); return rows freed."""
        freed = 0
        while freed < tokens and self.blocks:
            self.blocks.popitem(last=False)
            freed += self.block
        return freed


GENERATE_TOKENS = 4096  # rows `generate` keeps per model: a few turns of a conversation (~47 KB a row for SmolLM2)
_per_model: "weakref.WeakKeyDictionary[torch.nn.Module, PrefixCache]" = weakref.WeakKeyDictionary()


def for_model(model: torch.nn.Module) -> PrefixCache:
    """The prefix cache `generate` shares between its calls on this model (one per model object, so per dtype)."""
    if model not in _per_model:
        _per_model[model] = PrefixCache(GENERATE_TOKENS)
    return _per_model[model]
