"""The one interface every drafter implements."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import SamplingConfig


@dataclass
class Draft:
    """Proposed continuation. `probs` [len(tokens), V] is the drafter's distribution q when it sampled its tokens;
    None means the tokens were chosen deterministically (q is one-hot). `estimates`: from drafters that estimate
    acceptance (drafters.calibration), each token's probability of being accepted given the ones before it were."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    estimates: tuple[float, ...] | None = None

    def cut(self, k: int) -> "Draft":
        """The first k tokens."""
        if k >= len(self.tokens):
            return self
        probs = None if self.probs is None else self.probs[:k]
        return Draft(self.tokens[:k], probs, None if self.estimates is None else self.estimates[:k])


EMPTY = Draft([])


class Drafter:
    """propose(context, k) guesses up to k next tokens; observe(context, n_new) learns from the accepted ones.

    `context` is the whole sequence so far (prompt + generated), as a list of token ids.
    """

    name = "base"
    needs_hidden = False  # True: the loop calls see_hidden() with the target's last feature after every step
    # True: drafts carry `estimates`; the caller drafts up to a cap first and then lets the planner cut each draft
    # where one more verified row stops paying. `floor` is set by the caller before proposing: the least
    # probability of acceptance at which a further token could still pay (from the measured cost of a row); such a
    # drafter stops there instead of drafting tokens nobody will verify.
    estimates_acceptance = False
    floor = 0.0
    # Ways to draft, cheapest first (a draft head: its copies alone, then copies and head steps). The engine's gate
    # measures each as an arm of its own and sets `tier` before a step's drafts; -1, the whole way, elsewhere.
    tiers: tuple[str, ...] = ("draft",)
    tier = -1
    drafts = True  # False: it never proposes a token, so the engine's planner gives it no draft rows

    def start(self, prompt_ids: list[int], sampling: SamplingConfig) -> None:
        """Called once per request, before decoding starts."""

    def propose(self, context: list[int], k: int) -> Draft:
        raise NotImplementedError

    @classmethod
    def propose_many(cls, drafters: list["Drafter"], contexts: list[list[int]], ks: list[int]) -> list[Draft]:
        """Drafts of several sequences at once (the engine's step), each drafter of this class: one by one here; a
        drafter whose work batches across sequences (a draft head) does it in one pass."""
        return [d.propose(c, k) if k > 0 else EMPTY for d, c, k in zip(drafters, contexts, ks)]

    def observe(self, context: list[int], n_new: int) -> None:
        """Called after every step; the last n_new tokens of context are new (accepted + the target's token)."""

    def report(self, stats, context: list[int], prompt_length: int) -> None:
        """Called as the request's stats are closed: put what only the drafter knows in them."""

    def see_hidden(self, feature) -> None:
        """Only for needs_hidden drafters: the target's final-norm hidden state [d] at the position that predicted
        the last token of the context (None when the runner could not record it)."""
