"""Prompt lookup decoding (Saxena 2023; input-guided copy): find the latest earlier occurrence of the last n tokens
in prompt + output and propose the tokens that followed it. Longer n-grams are tried first."""

from __future__ import annotations

import torch

from ..errors import require
from .base import EMPTY, Draft, Drafter


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        require(
            1 <= min_ngram <= max_ngram,
            f"prompt-lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}",
        )
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: list[int], k: int) -> Draft:
        ids = torch.tensor(context)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            windows = ids[:-1].unfold(0, n, 1)  # every earlier n-gram that has at least one token after it
            hits = (windows == ids[-n:]).all(-1).nonzero()
            if len(hits):
                start = int(hits[-1]) + n
                return Draft(context[start : start + k])
        return EMPTY
