"""Draft length control: pick the k that maximises expected new tokens per second, from measured acceptance and cost.

A step with k draft tokens yields 1 + a + a^2 + ... + a^k new tokens in expectation (a = per-token acceptance rate)
and costs one target forward over k + 1 tokens plus k draft tokens. Both are measured online, so the choice follows
the machine: on a CPU where verifying 8 tokens costs little more than verifying 2, drafts grow long; where drafting
does not pay (low acceptance, costly verification), k = 0 and the step is plain decoding. The acceptance estimate
decays towards its prior while nothing is drafted, and after REPROBE_STEPS plain steps one draft of k_init is tried, so
stale estimates get refreshed: also for a drafter that drafts ahead and lets the controller choose how much of it to
verify (`choose`), whose drafts an inflated cost estimate would otherwise rule out for good (one slow first forward of
two rows, never timed again, made a process's later calls on that model draft nothing). The choice of k never
changes the output: greedy output stays that of plain greedy decoding for any k.

Many sequences sharing one forward (the batched Engine) are planned by the same rule, `plan_draft_lengths`: the
forward's cost is measured per total row count R, and draft tokens go where the expected accepted tokens are highest
until adding more no longer raises expected tokens per second of the whole step (Scylla/SmartSpec's observation that
under load the marginal cost of verification rows, not the per-sequence acceptance alone, decides what pays).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Sequence

from .errors import require

PRIOR_ACCEPTANCE = 0.6  # a before any evidence ...
PRIOR_WEIGHT = 2.0  # ... worth this many observed draft tokens
DECAY = 0.9  # per step, for the acceptance counts
COST_DECAY = 0.7  # weight of the old estimate in each per-size cost average
COST_SPIKE = 1.5  # a new sample counts for at most this multiple of its size's estimate
REPROBE_STEPS = 32  # plain steps in a row before one draft is tried again


class StepCost:
    """Seconds of one target forward over R rows, measured online (a decayed average per R) and interpolated between
    measured sizes; beyond the largest measured size, that size's cost (optimistic: it gets tried, then known).

    Estimates are read through a monotone envelope: R rows cost at most what any measured larger size costs. A forward
    over fewer rows does not cost more, so a size measured once in a slow moment (the first call at a new row count
    builds its kernel routes; the machine was busy) cannot look dearer than larger ones: otherwise the planner would
    avoid that size and never measure it again.

    A step's time has one-sided noise: a busy machine, a page fault or a thread woken late only ever add to it. So a
    sample enters its size's average clipped at COST_SPIKE times the estimate: one slow step raises a size's cost by
    15 % at most, not by half or more, while a real rise still comes through over a few steps. A spike in the
    one-row cost would otherwise read as drafts gone cheap, and one in the two-row cost as drafts gone dear, and
    drafts cut for that reason leave the size unmeasured, the spike in place."""

    def __init__(self):
        self.seconds: dict[int, float] = {}
        self._envelope: dict[int, float] | None = None

    def __bool__(self) -> bool:
        return bool(self.seconds)

    def __contains__(self, rows: int) -> bool:
        return rows in self.seconds

    def record(self, rows: int, seconds: float) -> None:
        if rows > 0 and seconds > 0:
            old = self.seconds.get(rows)
            if old is not None:
                seconds = COST_DECAY * old + (1 - COST_DECAY) * min(seconds, COST_SPIKE * old)
            self.seconds[rows] = seconds
            self._envelope = None

    def envelope(self) -> dict[int, float]:
        """Per measured size, its estimate capped by every larger size's."""
        if self._envelope is None:
            capped, lowest = {}, float("inf")
            for rows in sorted(self.seconds, reverse=True):
                lowest = min(lowest, self.seconds[rows])
                capped[rows] = lowest
            self._envelope = capped
        return self._envelope

    def __call__(self, rows: int) -> float:
        known = self.envelope()
        if rows in known:
            return known[rows]
        below = max((n for n in known if n < rows), default=None)
        above = min((n for n in known if n > rows), default=None)
        if below is None or above is None:
            return known[below if above is None else above]
        share = (rows - below) / (above - below)
        return known[below] + share * (known[above] - known[below])


@dataclass
class DraftDemand:
    """What the planner knows of one decoding sequence: its acceptance estimate, its drafter's seconds per draft
    token, and the most draft tokens it may take this step. `chain`: for a draft already made by a drafter that
    estimates acceptance, the probability that its first j + 1 tokens are all accepted, per j (it replaces
    acceptance^(j + 1), and the draft's length caps k)."""

    acceptance: float
    draft_seconds: float
    cap: int
    chain: tuple[float, ...] | None = None

    @property
    def most(self) -> int:
        """The most draft tokens it can take: its cap, and no more than a draft made ahead holds."""
        return self.cap if self.chain is None else min(self.cap, len(self.chain))

    def gain(self, k: int) -> float:
        """Expected accepted tokens that the (k + 1)-th draft token adds; -1 past the most it can take."""
        if k >= self.most:
            return -1.0
        return self.chain[k] if self.chain is not None else self.acceptance ** (k + 1)


def plan_draft_lengths(
    demands: Sequence[DraftDemand],
    costs: StepCost,
    base_rows: int,
    base_tokens: float,
    k_min: int = 1,
    row_budget: int | None = None,
    plain_rate: float = 0.0,
) -> list[int]:
    """Draft lengths for sequences that share one forward of `base_rows` rows without drafts (their last tokens and
    any prompt chunks), which yields `base_tokens` tokens. The i-th draft token of a sequence with acceptance a is
    accepted with probability a^i, so tokens are added in order of that gain; the plan kept is the prefix of that
    order with the most expected tokens per second (forward cost at the new row count plus drafting time), all zeros
    included, these at `plain_rate` where that is more (the tokens a second of the plain step the caller runs when
    nothing is drafted, e.g. one serving fewer streams). Costs must hold at least one measurement."""
    ks = [0] * len(demands)
    budget = sum(d.most for d in demands)
    if row_budget is not None:
        budget = min(budget, row_budget - base_rows)
    if budget <= 0:
        return ks
    tokens, draft_time, added = base_tokens, 0.0, 0
    best, best_rate = list(ks), max(base_tokens / costs(base_rows), plain_rate)
    while added < budget:
        gains = [(d.gain(k), i) for i, (d, k) in enumerate(zip(demands, ks))]
        gain, i = max(gains)
        if gain < 0:
            break
        ks[i] += 1
        added += 1
        tokens += gain
        draft_time += demands[i].draft_seconds
        if any(0 < k < k_min for k in ks):
            continue
        rate = tokens / (costs(base_rows + added) + draft_time)
        if rate > best_rate * 1.0001:
            best, best_rate = list(ks), rate
    return best


def row_floor(costs: StepCost, rows: int) -> float:
    """The least probability of acceptance at which one more draft token could pay in a forward of `rows` rows that
    yields `rows` tokens: rows times the relative cost of one more row, as measured (interpolated between measured
    sizes; 0 where `rows` or no larger size is measured)."""
    if rows not in costs or max(costs.seconds) <= rows:
        return 0.0
    return max(0.0, rows * (costs(rows + 1) / costs(rows) - 1))


@dataclass
class DraftLengthController:
    """Chooses k in [0, k_max] per step; `adaptive=False` keeps k at k_init. `k_min` is the smallest k tried when
    drafting at all (k = 0, no draft, is always allowed when it is expected to be faster). `costs` may be shared
    (the Engine measures whole-batch forwards into one StepCost)."""

    k_init: int = 4
    k_min: int = 1
    k_max: int = 16
    adaptive: bool = True
    costs: StepCost = field(default_factory=StepCost)
    accepted: float = field(default=0.0, init=False)  # decayed count of accepted draft tokens
    rejected: float = field(default=0.0, init=False)  # decayed count of rejections (at most one per step)
    draft_seconds: float | None = field(default=None, init=False)  # per draft token
    plain_steps: int = field(default=0, init=False)  # k = 0 steps in a row
    drafted_last: bool = field(default=False, init=False)  # the previous step drafted
    reprobing: bool = field(default=False, init=False)  # this step tries a draft whatever the estimates say

    def __post_init__(self) -> None:
        require(
            1 <= self.k_min <= self.k_init <= self.k_max,
            f"draft length needs 1 <= k_min <= k <= k_max, got {self.k_min}, {self.k_init}, {self.k_max}",
        )
        self.k = self.k_init

    @property
    def forward_seconds(self) -> dict[int, float]:
        """Measured forward seconds per number of tokens fed."""
        return self.costs.seconds

    @forward_seconds.setter
    def forward_seconds(self, seconds: dict[int, float]) -> None:
        self.costs.seconds, self.costs._envelope = dict(seconds), None

    @property
    def acceptance(self) -> float:
        hits = self.accepted + PRIOR_ACCEPTANCE * PRIOR_WEIGHT
        return hits / (hits + self.rejected + (1 - PRIOR_ACCEPTANCE) * PRIOR_WEIGHT)

    def demand(self, cap: int) -> DraftDemand:
        return DraftDemand(
            self.acceptance, self.draft_seconds or 0.0, min(cap, self.k_max if self.adaptive else self.k)
        )

    def next_k(self) -> int:
        return self.k

    def update(
        self,
        proposed: int,
        accepted: int,
        forward_tokens: int = 0,
        forward_seconds: float = 0.0,
        draft_seconds: float = 0.0,
    ) -> None:
        """Record one step: `proposed` draft tokens of which `accepted` passed, verified by a target forward over
        `forward_tokens` tokens that took `forward_seconds`; drafting took `draft_seconds`."""
        if not self.adaptive:
            return
        self.reprobing = False
        self.accepted = self.accepted * DECAY + accepted
        self.rejected = self.rejected * DECAY + (accepted < proposed)
        self.costs.record(forward_tokens, forward_seconds)
        # a draft right after plain steps includes the drafter's catch-up (a draft model feeds every token it
        # missed in one forward): not a per-token cost, so only drafts that follow drafts are timed
        timed, self.drafted_last = proposed > 0 and self.drafted_last, proposed > 0
        if timed:
            per_token = draft_seconds / proposed
            self.draft_seconds = (
                per_token
                if self.draft_seconds is None
                else (COST_DECAY * self.draft_seconds + (1 - COST_DECAY) * per_token)
            )
        if 1 not in self.costs:
            if self.costs:  # time one plain step: drafts are weighed against it
                self.k = 0
            return
        self.k = self.best_k()
        self.plain_steps = self.plain_steps + 1 if self.k == 0 else 0
        if self.plain_steps >= REPROBE_STEPS:  # estimates made while drafting may be stale: try once more
            self.k, self.plain_steps, self.reprobing = self.k_init, 0, True

    def best_k(self) -> int:
        return plan_draft_lengths(
            [self.demand(self.k_max)], self.costs, base_rows=1, base_tokens=1.0, k_min=self.k_min
        )[0]

    @property
    def cap(self) -> int:
        """The most draft tokens a step may take."""
        return self.k_max if self.adaptive else self.k

    def floor(self) -> float:
        """`row_floor` for one request alone (0 on a reprobe: the drafter drafts as it would at no cost)."""
        return 0.0 if self.reprobing else row_floor(self.costs, 1)

    def choose(self, chain: tuple[float, ...]) -> int:
        """How much of a draft made first (drafters that estimate acceptance) to verify: the prefix with the most
        expected tokens per second; the whole draft at a fixed k; none until a plain step has been timed."""
        if not self.adaptive:
            return len(chain)
        if 1 not in self.costs:
            return 0
        if self.reprobing:  # a draft made ahead is verified up to k_init on a reprobe, as next_k's drafts are
            return min(len(chain), self.k_init)
        # costs beyond the largest measured forward are guessed flat (optimistic): explore at most twice as far
        cap = min(len(chain), 2 * max(self.costs.seconds) - 1)
        demand = DraftDemand(0.0, 0.0, cap, chain)  # drafting is done: its time is spent either way
        return plan_draft_lengths([demand], self.costs, base_rows=1, base_tokens=1.0, k_min=self.k_min)[0]

    def cost(self, tokens: int) -> float:
        """Seconds of a target forward over `tokens` tokens (see StepCost)."""
        return self.costs(tokens)


_shared: "weakref.WeakKeyDictionary[object, StepCost]" = weakref.WeakKeyDictionary()


def costs_for(model) -> StepCost:
    """The forward costs that single-request calls on `model` share (one per model object, so per dtype): each call
    starts from what earlier calls measured instead of exploring row counts again."""
    if model not in _shared:
        _shared[model] = StepCost()
    return _shared[model]
