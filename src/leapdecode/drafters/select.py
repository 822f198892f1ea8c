"""Per-request choice among drafters, from the acceptance each one would have had on this request.

No drafter wins everywhere: prompt lookup is ahead where the answer copies the prompt (extraction, summaries), the
draft head on free text, the online n-grams on repetitive output. For the first `trial_steps` steps of a request
every candidate proposes; after each step each candidate is scored by how many of its tokens the target actually
produced next (the common prefix of its draft and the step's new tokens), and the draft that is verified comes from
the candidate with the most matched tokens so far (ties go to the earlier one). After the trial only the leader
proposes, since the others' drafts would cost time and never be verified. Every candidate still observes every step,
so whichever leads has current state. The choice changes only which tokens are proposed, never how they are verified:
output stays that of plain greedy decoding.
"""

from __future__ import annotations

from ..errors import require
from .base import Draft, Drafter


class SelectDrafter(Drafter):
    name = "select"

    def __init__(self, candidates: list[Drafter], trial_steps: int = 8):
        require(len(candidates) >= 1, "drafter 'select' needs at least one candidate drafter")
        require(trial_steps >= 0, f"select trial_steps must be >= 0, got {trial_steps}")
        self.candidates = candidates
        self.trial_steps = trial_steps
        self.needs_hidden = any(c.needs_hidden for c in candidates)
        self.start([], None)

    def start(self, prompt_ids, sampling) -> None:
        for candidate in self.candidates:
            candidate.start(prompt_ids, sampling)
        self.matched = [0] * len(self.candidates)
        self.trials = 0
        self.drafts: list[Draft] = []  # every candidate's draft of the current trial step

    @property
    def leader(self) -> Drafter:
        return self.candidates[max(range(len(self.candidates)), key=lambda i: (self.matched[i], -i))]

    def propose(self, context: list[int], k: int) -> Draft:
        if self.trials >= self.trial_steps:
            return self.leader.propose(context, k)
        leader = self.leader
        self.drafts = [c.propose(context, k) for c in self.candidates]
        return self.drafts[self.candidates.index(leader)]

    def observe(self, context: list[int], n_new: int) -> None:
        if self.drafts:
            new = context[-n_new:]
            for i, draft in enumerate(self.drafts):
                self.matched[i] += _common_prefix(draft.tokens, new)
            self.trials += 1
            self.drafts = []
        for candidate in self.candidates:
            candidate.observe(context, n_new)

    def see_hidden(self, feature) -> None:
        for candidate in self.candidates:
            if candidate.needs_hidden:
                candidate.see_hidden(feature)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
