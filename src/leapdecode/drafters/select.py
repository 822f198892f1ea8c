"""Per-request choice among drafters, from the acceptance each one would have had on this request.

No drafter wins everywhere: prompt lookup is ahead where the answer copies the prompt (extraction, summaries), the
draft head on free text, the online n-grams on repetitive output. For the first `trial_steps` steps of a request
every candidate proposes, and each draft is scored by the tokens the target would have accepted had it been the one
verified: the common prefix of the draft and what the target produces at those positions. Only the verified draft's
positions are known after its own step, so a draft longer than what was accepted is scored over the following steps,
as the target produces those tokens (scoring against one step's new tokens alone would cap every other candidate at
the leader's acceptance, and keep the leader). The verified draft comes from the candidate with the most accepted
tokens so far, counting what is already known of drafts still being scored (ties go to the earlier one). After the
trial only the leader proposes, since the others' drafts would cost time and never be verified. Every candidate still
observes every step, so whichever leads has current state. The choice changes only which tokens are proposed, never
how they are verified: output stays that of plain greedy decoding.
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
        self.matched = [0] * len(self.candidates)  # accepted tokens of fully scored drafts, per candidate
        self.score = list(self.matched)  # matched, plus what is known so far of drafts still being scored
        self.pending: list[tuple[int, int, list[int]]] = []  # (candidate, position of its first token, tokens)
        self.trials = 0

    @property
    def leader(self) -> Drafter:
        return self.candidates[max(range(len(self.candidates)), key=lambda i: (self.score[i], -i))]

    def propose(self, context: list[int], k: int) -> Draft:
        if self.trials >= self.trial_steps:
            return self.leader.propose(context, k)
        leader = self.leader
        drafts = [c.propose(context, k) for c in self.candidates]
        self.pending += [(i, len(context), d.tokens) for i, d in enumerate(drafts) if d.tokens]
        self.trials += 1
        return drafts[self.candidates.index(leader)]

    def observe(self, context: list[int], n_new: int) -> None:
        still, known = [], [0] * len(self.candidates)
        for i, start, tokens in self.pending:
            produced = context[start : start + len(tokens)]
            n = _common_prefix(tokens, produced)
            if n < len(produced) or len(produced) == len(tokens):  # mismatched, or every drafted position known
                self.matched[i] += n
            else:
                still.append((i, start, tokens))
                known[i] += n
        self.pending = still
        self.score = [m + n for m, n in zip(self.matched, known)]
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
