"""Prompt lookup decoding (Saxena 2023; input-guided copy): find the latest earlier occurrence of the last n tokens
in prompt + output and propose the tokens that followed it. Longer n-grams are tried first. The occurrences are kept
in a table per n-gram length, extended by the tokens each step adds (a request's context only grows), so a lookup
costs a few dictionary reads rather than a scan of the whole context.

Whether a copy goes on is learnt (drafters.calibration): each copied token's acceptance is estimated per matched
n-gram length and position in the copy, from how such tokens fared in earlier steps, and the draft stops where the
probability that all of it is accepted falls under the caller's floor. The planner then verifies only the part that
pays: where the answer copies the prompt long copies are verified whole, where it does not (a common one-token match)
the copy costs no verified rows."""

from __future__ import annotations

from ..errors import require
from .base import EMPTY, Draft, Drafter
from .calibration import AcceptanceCalibration, estimated_draft, score

PRIOR = 0.5  # a copied token's acceptance before any evidence
MAX_POSITION = 7  # positions past it share one bin


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"
    estimates_acceptance = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, calibration: AcceptanceCalibration | None = None):
        """`calibration`: shared with other drafters of the same target (drafters.factory), so that what one request
        learnt serves the next."""
        require(
            1 <= min_ngram <= max_ngram,
            f"prompt-lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}",
        )
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.calibration = calibration if calibration is not None else AcceptanceCalibration()
        self.start([], None)

    def start(self, prompt_ids, sampling) -> None:
        self.greedy = sampling is None or sampling.greedy
        self.proposal: tuple[list[int], list] | None = None  # the last copy, whole: tokens and their bins
        self._forget()

    def _forget(self) -> None:
        # per n-gram length 1 .. max_ngram: n-gram -> where the tokens after its latest occurrence start, for the
        # n-grams ending before the context's last token (the context's own tail is not an earlier occurrence)
        self.seen: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_ngram + 1)]
        self.indexed = 0  # n-grams ending at positions below this are in `seen`

    def _index(self, context: list[int]) -> None:
        if len(context) < self.indexed:  # not the context it indexed (contexts only grow): index it afresh
            self._forget()
        for end in range(max(self.indexed, 1), len(context)):
            for n in range(1, min(self.max_ngram, end) + 1):
                self.seen[n][tuple(context[end - n : end])] = end
        self.indexed = max(self.indexed, len(context))

    def propose(self, context: list[int], k: int) -> Draft:
        self.proposal = None
        self._index(context)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            start = self.seen[n].get(tuple(context[-n:]))
            if start is not None:
                return self._estimated(context[start : start + k], n)
        return EMPTY

    def _estimated(self, copied: list[int], n: int) -> Draft:
        """The copy with each token's estimated acceptance, cut where the probability that all of it is accepted
        falls under the floor (the whole copy is still proposed: observe scores it)."""
        group = ("copy", self.greedy)
        keys = [(group, (n, min(j, MAX_POSITION))) for j in range(len(copied))]
        draft, self.proposal = estimated_draft(self.calibration, copied, keys, PRIOR, self.floor)
        return draft

    def observe(self, context: list[int], n_new: int) -> None:
        score(self.calibration, self.proposal, context[-n_new:])
        self.proposal = None
