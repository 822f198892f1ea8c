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

from dataclasses import dataclass

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
        # the output-head rows of the first extra_ids: gathered when a draft needs them (extra_weight)
        self._extra_weight = self.head.out_weight[:0]
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

    @property
    def extra_weight(self) -> torch.Tensor:
        """The output-head rows of extra_ids, gathered only when a draft needs them: most steps under load draft
        nothing, and a step that only observes new tokens should cost nothing (no copy of a growing matrix)."""
        have = len(self._extra_weight)
        if have < len(self.extra_ids):
            self._extra_weight = torch.cat([self._extra_weight, self.head.rows(self.extra_ids[have:])])
        return self._extra_weight

    def propose(self, context: list[int], k: int) -> Draft:
        return self.propose_many([self], [context], [k])[0]

    @classmethod
    @torch.inference_mode()
    def propose_many(cls, drafters: list[HeadDrafter], contexts: list[list[int]], ks: list[int]) -> list[Draft]:
        """Each sequence's draft as `propose` makes it alone, the head's steps of all sequences sharing a head run as
        one batch (its weights read once per step, not once per sequence)."""
        drafts: list[Draft] = [EMPTY] * len(drafters)
        rolling = []
        for i, (drafter, context, k) in enumerate(zip(drafters, contexts, ks)):
            if k <= 0 or drafter.feature is None:  # e.g. a KV press prefill that bypassed the final norm
                continue
            # a copy: EMPTY is shared
            copied = list(drafter.lookup.propose(context, k).tokens) if drafter.lookup else []
            drafts[i] = Draft(copied)
            if len(copied) < k:
                rolling.append(_Rolling(i, drafter, k, drafter.feature, context[-1], list(copied), copied))
        for head in {id(r.drafter.head): r.drafter.head for r in rolling}.values():
            _roll(head, [r for r in rolling if r.drafter.head is head], drafts)
        return drafts

    def _top1(self, feature: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The most likely token among those the head scores (`scores`: its logits over the head's vocabulary; the
        request's own extra tokens are scored here), and its probability among them."""
        if self.extra_ids:
            extra = self.extra_weight
            scores = torch.cat([scores, extra @ feature.to(extra.dtype)])
        probability, best = scores.float().softmax(-1).max(-1)
        n = len(self.head.vocab_ids)
        token = self.head.vocab_ids[best] if best < n else torch.tensor(self.extra_ids[int(best) - n])
        return token, float(probability)


@dataclass
class _Rolling:
    """One sequence's draft in the making: the feature and the token the head steps next, the copied tokens still to
    feed, the tokens so far and the path's probability."""

    index: int
    drafter: HeadDrafter
    k: int
    feature: torch.Tensor
    token: int
    to_feed: list[int]
    tokens: list[int]
    probability: float = 1.0


def _roll(head, rolling: list[_Rolling], drafts: list[Draft]) -> None:
    """Step the features of sequences sharing `head` together: first through their copied tokens, then one drafted
    token at a time, each sequence stopping at its k or its confidence threshold."""
    with packed_kernels(True):
        while rolling:
            features = head.step(
                torch.stack([r.feature for r in rolling]), torch.tensor([r.token for r in rolling], dtype=torch.long)
            )
            drafting = [row for row, r in enumerate(rolling) if not r.to_feed]
            scores = dict(zip(drafting, head.logits(features[drafting])))  # the shared vocabulary's rows read once
            going = []
            for row, r in enumerate(rolling):
                r.feature = features[row]
                if r.to_feed:  # rolled through one copied token
                    r.token = r.to_feed.pop(0)
                    going.append(r)
                    continue
                token, probability = r.drafter._top1(r.feature, scores[row])
                r.probability *= probability
                if r.probability < r.drafter.confidence and r.tokens:
                    continue
                r.token = int(token)
                r.tokens.append(r.token)
                if len(r.tokens) < r.k:
                    going.append(r)
            for r in rolling:
                drafts[r.index] = Draft(r.tokens)
            rolling = going
