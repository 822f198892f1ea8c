"""Draft length control: pick the k that maximises expected new tokens per second, from measured acceptance and cost.

A step with k draft tokens yields 1 + a + a^2 + ... + a^k new tokens in expectation (a = per-token acceptance rate)
and costs one target forward over k + 1 tokens plus k draft tokens. Both are measured online, so the choice follows
the machine: on a CPU where verifying 8 tokens costs little more than verifying 2, drafts grow long; where drafting
does not pay (low acceptance, costly verification), k = 0 and the step is plain decoding. The acceptance estimate
decays towards its prior while nothing is drafted, and after REPROBE_STEPS plain steps one draft of k_init is tried, so
stale estimates get refreshed. The choice of k never changes the output: greedy output stays that of plain greedy
decoding for any k.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import require

PRIOR_ACCEPTANCE = 0.6   # a before any evidence ...
PRIOR_WEIGHT = 2.0       # ... worth this many observed draft tokens
DECAY = 0.9              # per step, for the acceptance counts
COST_DECAY = 0.7         # weight of the old estimate in each per-size cost average
REPROBE_STEPS = 32       # plain steps in a row before one draft is tried again


@dataclass
class DraftLengthController:
    """Chooses k in [0, k_max] per step; `adaptive=False` keeps k at k_init. `k_min` is the smallest k tried when
    drafting at all (k = 0, no draft, is always allowed when it is expected to be faster)."""

    k_init: int = 4
    k_min: int = 1
    k_max: int = 16
    adaptive: bool = True
    accepted: float = field(default=0.0, init=False)   # decayed count of accepted draft tokens
    rejected: float = field(default=0.0, init=False)   # decayed count of rejections (at most one per step)
    forward_seconds: dict[int, float] = field(default_factory=dict, init=False)  # tokens fed -> seconds
    draft_seconds: float | None = field(default=None, init=False)                 # per draft token
    plain_steps: int = field(default=0, init=False)                               # k = 0 steps in a row
    drafted_last: bool = field(default=False, init=False)                         # the previous step drafted

    def __post_init__(self) -> None:
        require(1 <= self.k_min <= self.k_init <= self.k_max,
                f"draft length needs 1 <= k_min <= k <= k_max, got {self.k_min}, {self.k_init}, {self.k_max}")
        self.k = self.k_init

    @property
    def acceptance(self) -> float:
        hits = self.accepted + PRIOR_ACCEPTANCE * PRIOR_WEIGHT
        return hits / (hits + self.rejected + (1 - PRIOR_ACCEPTANCE) * PRIOR_WEIGHT)

    def next_k(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int, forward_tokens: int = 0, forward_seconds: float = 0.0,
               draft_seconds: float = 0.0) -> None:
        """Record one step: `proposed` draft tokens of which `accepted` passed, verified by a target forward over
        `forward_tokens` tokens that took `forward_seconds`; drafting took `draft_seconds`."""
        if not self.adaptive:
            return
        self.accepted = self.accepted * DECAY + accepted
        self.rejected = self.rejected * DECAY + (accepted < proposed)
        if forward_tokens > 0 and forward_seconds > 0:
            old = self.forward_seconds.get(forward_tokens)
            self.forward_seconds[forward_tokens] = forward_seconds if old is None else (
                COST_DECAY * old + (1 - COST_DECAY) * forward_seconds)
        # a draft right after plain steps includes the drafter's catch-up (a draft model feeds every token it
        # missed in one forward): not a per-token cost, so only drafts that follow drafts are timed
        timed, self.drafted_last = proposed > 0 and self.drafted_last, proposed > 0
        if timed:
            per_token = draft_seconds / proposed
            self.draft_seconds = per_token if self.draft_seconds is None else (
                COST_DECAY * self.draft_seconds + (1 - COST_DECAY) * per_token)
        if 1 not in self.forward_seconds:
            if self.forward_seconds:  # time one plain step: drafts are weighed against it
                self.k = 0
            return
        self.k = self.best_k()
        self.plain_steps = self.plain_steps + 1 if self.k == 0 else 0
        if self.plain_steps >= REPROBE_STEPS:  # estimates made while drafting may be stale: try once more
            self.k, self.plain_steps = self.k_init, 0

    def best_k(self) -> int:
        a, draft = self.acceptance, self.draft_seconds or 0.0
        best, best_rate = 0, 1.0 / self.cost(1)
        for k in range(self.k_min, self.k_max + 1):
            expected = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1.0
            rate = expected / (self.cost(k + 1) + k * draft)
            if rate > best_rate * 1.0001:
                best, best_rate = k, rate
        return best

    def cost(self, tokens: int) -> float:
        """Seconds of a target forward over `tokens` tokens: measured, else interpolated between measured sizes,
        else that of the nearest measured size (optimistic beyond the largest measured: it gets tried, then known)."""
        known = self.forward_seconds
        if tokens in known:
            return known[tokens]
        below = max((n for n in known if n < tokens), default=None)
        above = min((n for n in known if n > tokens), default=None)
        if below is None or above is None:
            return known[below if above is None else above]
        share = (tokens - below) / (above - below)
        return known[below] + share * (known[above] - known[below])
