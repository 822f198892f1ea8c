"""Draft-head drafter: a trained head (see leapdecode.heads) drafts from the target's own last feature.

After each verification the decode loop hands over the target's final-norm hidden state at the position that produced
the step's last token; the head rolls it forward one token at a time, proposing its top-1 token each step. The head
scores the tokens it was trained on plus every token of the current prompt and output (names, numbers and code
identifiers a request copies are often rare elsewhere). The head has no attention, so it cannot copy long spans; with
`lookup_ngram` n > 0 (default 2), when the last n or more tokens occurred earlier in the request the draft starts with
what followed them (prompt lookup) and the head, fed those tokens, continues it to k. The head stops early once the
product of its top-1 probabilities along the draft falls under `confidence` (EAGLE-2's observation that the draft's
confidence tracks acceptance); a draft keeps at least one token. Drafting costs a few small matrix products per token
and no KV cache, so a rejected draft leaves nothing to undo.
"""

from __future__ import annotations

import torch

from ..errors import require
from ..kernels import install_packed_linear, packed_kernels
from .base import EMPTY, Draft, Drafter
from .prompt_lookup import PromptLookupDrafter


class HeadDrafter(Drafter):
    name = "head"
    needs_hidden = True

    def __init__(self, head, lookup_ngram: int = 2, confidence: float = 0.1):
        require(0 <= lookup_ngram <= 3, f"head lookup_ngram must be in 0..3 (0 = no lookup), got {lookup_ngram}")
        require(0 <= confidence < 1, f"head confidence threshold must be in [0, 1), got {confidence}")
        self.head = head
        self.confidence = confidence
        self.lookup = PromptLookupDrafter(max_ngram=3, min_ngram=lookup_ngram) if lookup_ngram else None
        install_packed_linear(head)
        self.feature: torch.Tensor | None = None
        self.start([], None)

    def start(self, prompt_ids, sampling) -> None:
        self.feature = None
        self.known = set(self.head.vocab_ids.tolist())
        self.extra_ids: list[int] = []  # request tokens outside vocab_ids
        self.extra_weight = self.head.out_weight[:0]  # their output-head rows
        self._add(prompt_ids)

    def observe(self, context: list[int], n_new: int) -> None:
        self._add(context[-n_new:])

    def see_hidden(self, feature: torch.Tensor | None) -> None:
        self.feature = feature

    def _add(self, tokens: list[int]) -> None:
        new = sorted(set(tokens) - self.known)
        if new:
            self.known.update(new)
            self.extra_ids += new
            self.extra_weight = torch.cat([self.extra_weight, self.head.rows(new)])

    @torch.inference_mode()
    def propose(self, context: list[int], k: int) -> Draft:
        if self.feature is None:  # e.g. a KV press prefill that bypassed the final norm
            return EMPTY
        tokens = list(self.lookup.propose(context, k).tokens) if self.lookup else []  # a copy: EMPTY is shared
        if len(tokens) == k:
            return Draft(tokens)
        feature, token = self.feature, torch.tensor(context[-1])
        with packed_kernels(True):
            for copied in tokens:  # roll the feature through the copied tokens
                feature, token = self.head.step(feature, token), torch.tensor(copied)
            path_probability = 1.0
            while len(tokens) < k:
                feature = self.head.step(feature, token)
                token, probability = self._top1(feature)
                path_probability *= probability
                if path_probability < self.confidence and tokens:
                    break
                tokens.append(int(token))
        return Draft(tokens)

    def _top1(self, feature: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The most likely token among those the head scores, and its probability among them."""
        scores = self.head.logits(feature)
        if self.extra_ids:
            scores = torch.cat([scores, self.extra_weight @ feature.to(self.extra_weight.dtype)])
        probability, best = scores.float().softmax(-1).max(-1)
        n = len(self.head.vocab_ids)
        token = self.head.vocab_ids[best] if best < n else torch.tensor(self.extra_ids[int(best) - n])
        return token, float(probability)
