"""Adaptive n-gram drafter in the spirit of ADED (Liu et al. 2024): tri-gram statistics with back-off to bigrams,
seeded from the prompt and updated online from every accepted token, kept across requests of the same process.
Each draft token maximises an upper confidence bound: the successor's observed frequency (exploitation) plus a
bonus for successors that were rarely proposed yet (exploration)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from ..errors import require
from ..sampling import SamplingConfig
from .base import Draft, Drafter


class NGramStore:
    """Successor counts for 2-token and 1-token contexts, plus how often each successor was proposed."""

    def __init__(self):
        self.successors: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        self.proposed: dict[tuple[int, ...], Counter] = defaultdict(Counter)

    def add(self, tokens: list[int], first_new: int) -> None:
        """Count the transitions into tokens[first_new:], using up to two tokens of left context."""
        for i in range(max(first_new, 1), len(tokens)):
            nxt = tokens[i]
            self.successors[(tokens[i - 1],)][nxt] += 1
            if i >= 2:
                self.successors[(tokens[i - 2], tokens[i - 1])][nxt] += 1


class NGramDrafter(Drafter):
    name = "ngram"
    _shared: dict[str, NGramStore] = {}  # one store per vocabulary key, alive for the whole process

    def __init__(
        self, exploration: float = 0.3, min_score: float = 0.2, min_count: int = 1, store_key: str = "default"
    ):
        require(exploration >= 0, f"ngram exploration must be >= 0, got {exploration}")
        require(0 <= min_score <= 1, f"ngram min_score must be in [0, 1], got {min_score}")
        self.exploration, self.min_score, self.min_count = exploration, min_score, min_count
        self.store = self._shared.setdefault(store_key, NGramStore())

    def start(self, prompt_ids: list[int], sampling: SamplingConfig) -> None:
        self.store.add(prompt_ids, 1)

    def observe(self, context: list[int], n_new: int) -> None:
        self.store.add(context, len(context) - n_new)

    def propose(self, context: list[int], k: int) -> Draft:
        tokens: list[int] = []
        last2 = tuple(context[-2:])
        for _ in range(k):
            choice = self._best_successor(last2)
            if choice is None:
                break
            tokens.append(choice)
            last2 = (last2[-1], choice)
        return Draft(tokens)

    def _best_successor(self, last2: tuple[int, ...]) -> int | None:
        for ctx in (last2, last2[-1:]):  # tri-gram first, back off to bigram
            counts = self.store.successors.get(ctx)
            if not counts:
                continue
            total = sum(counts.values())
            if total < self.min_count:
                continue
            tried = self.store.proposed[ctx]
            log_total = math.log(1 + sum(tried.values()))
            best, best_score, best_freq = None, -1.0, 0.0
            for token, count in counts.most_common(8):
                score = count / total + self.exploration * math.sqrt(log_total / (1 + tried[token]))
                if score > best_score:
                    best, best_score, best_freq = token, score, count / total
            if best_freq < self.min_score:
                return None  # too unsure: a shorter draft is cheaper to verify
            tried[best] += 1
            return best
        return None
