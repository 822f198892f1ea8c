"""Speculation that never loses: whether the engine drafts at all at the current load, decided by the goodput it
actually measures, not by the cost model alone.

The planner (controller.plan_draft_lengths) prices drafts with a model: the measured step cost per row count and
each sequence's acceptance estimate. Models miss things (a drafter's own cost as load grows, acceptance that differs
from the estimate, steps whose cost depends on more than their row count), and then drafting costs throughput. The
gate keeps, per load level (how many sequences decode: 1, 2-3, 4-7, 8-15, ...) and per arm (no drafts, or drafts of
one of the drafters' tiers: a draft head's copies alone, or copies and head steps), the tokens and the seconds that
decode-only steps delivered, each a decayed sum, and runs the arm that has delivered the most tokens per second, a
drafting arm only where its lead over plain steps is beyond the noise (PREFER_Z standard errors): the planner drafts
only where drafts have paid, and only in the way that paid most. Until every arm has MIN_SAMPLES
steps at a level, it follows a neighbouring level that has them, or else takes the arms in turn.

A single step is a noisy sample (a drafted step yields one token or several, and what a drafted step yields moves
with the text), so the rate is a ratio of sums, not a mean of per-step rates, over a memory of about fifty steps of
the level: every step of a level fades every arm's sums there, so an arm behind is judged on its recent samples,
not on samples from another stretch of text. Its standard error comes with it (the delta method over the same
decayed sums). An arm behind is explored in bursts of EXPLORE_STEPS steps, never judged on one, and it keeps
exploring, so that a change (another mix of prompts, another load) is seen: after EXPLORE_EVERY steps of a level one
burst runs an arm behind (those behind take turns). Each burst after which the same arm leads every other by more
than CLEAR_Z standard errors doubles the wait before the next (up to MAX_EXPLORE_EVERY); one after which the lead
changed, or is within the noise, brings it back to EXPLORE_EVERY. So where one arm leads clearly the price of
exploring fades, while the arms behind are still tried; where arms are close, they keep being measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..drafters.base import Drafter

RATE_DECAY = 0.98  # per step of a level, the weight left to both arms' older samples there
CLEAR_Z = 2.0  # a lead is clear when the two rates differ by this many standard errors
PREFER_Z = 1.0  # a drafting arm leads only where it is ahead of plain steps by this many standard errors
EXPLORE_EVERY = 16  # steps of a level before its first exploration, and after one that changed the lead
MAX_EXPLORE_EVERY = 512  # the longest wait between explorations once the same arm keeps its lead
EXPLORE_STEPS = 4  # steps of the arm behind in one exploration
MIN_SAMPLES = 6  # steps an arm needs at a level before it is trusted


@dataclass
class ArmSums:
    """One arm at one level: decayed sums of tokens and seconds (weights w), and of their squares and product with
    weights w^2, which give the variance of the ratio of the sums."""

    tokens: float = 0.0
    seconds: float = 0.0
    tokens2: float = 0.0
    cross: float = 0.0
    seconds2: float = 0.0

    def fade(self) -> None:
        self.tokens *= RATE_DECAY
        self.seconds *= RATE_DECAY
        self.tokens2 *= RATE_DECAY**2
        self.cross *= RATE_DECAY**2
        self.seconds2 *= RATE_DECAY**2

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.tokens2 += tokens * tokens
        self.cross += tokens * seconds
        self.seconds2 += seconds * seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def variance(self) -> float:
        """Of `rate` (delta method): the weighted squares of each step's tokens less what the rate predicts for its
        seconds, over the squared sum of seconds."""
        r = self.rate
        return max(0.0, self.tokens2 - 2 * r * self.cross + r * r * self.seconds2) / self.seconds**2


def leads_by(ahead: ArmSums, behind: ArmSums, z: float) -> bool:
    """Whether `ahead`'s rate exceeds `behind`'s by more than z standard errors of their difference."""
    return ahead.rate - behind.rate > z * math.sqrt(ahead.variance + behind.variance)


class SpeculationGate:
    """Arms: 0 runs plain steps; arm a > 0 lets the planner draft with the drafters' tier a - 1 (`tiers`, from
    Drafter.tiers: a drafter's ways to draft, cheapest first, e.g. the head's copies alone before copies and head
    steps). `names`: "none" and the tiers, as reports and metrics call the arms."""

    def __init__(self, tiers: tuple[str, ...] = Drafter.tiers):
        self.names = ("none", *tiers)
        self.n_arms = len(self.names)
        self.arms: dict[tuple[int, int], ArmSums] = {}  # (level, arm) -> its sums
        self.samples: dict[tuple[int, int], int] = {}
        self.waited: dict[int, int] = {}  # per level: steps since its last exploration (or since every arm had samples)
        self.every: dict[int, int] = {}  # per level: the steps to wait before the next exploration
        self.leader: dict[int, int] = {}  # per level: the arm that led when its last exploration began
        self.burst: dict[int, tuple[int, int]] = {}  # per level: the arm being explored, and its steps still to run
        self.explored: dict[int, int] = {}  # per level: explorations so far (the arms behind take turns)

    @staticmethod
    def level(decoding: int) -> int:
        return decoding.bit_length()

    def rate(self, level: int, arm: int) -> float:
        return self.arms[(level, arm)].rate

    def measured(self, level: int) -> bool:
        return all(self.samples.get((level, arm), 0) >= MIN_SAMPLES for arm in range(self.n_arms))

    def _best(self, level: int) -> int:
        """The drafting arm with the highest rate at `level` among those ahead of plain steps by more than PREFER_Z
        standard errors; plain steps where none is: a drafting arm whose lead is within the noise costs throughput
        as often as it gains it, and plain steps cost nothing to keep."""
        plain = self.arms[(level, 0)]
        ahead = [arm for arm in range(1, self.n_arms) if leads_by(self.arms[(level, arm)], plain, PREFER_Z)]
        return max(ahead, key=lambda arm: self.rate(level, arm), default=0)

    def lead(self, level: int) -> int | None:
        """The arm ahead at `level`: by its own samples once every arm has MIN_SAMPLES there; before that, by a
        neighbouring level's (loads next to each other behave alike, and each level's start-up samples of the
        losing arms are a price a short run notices); None where neither is known."""
        for near in (level, level - 1, level + 1):
            if self.measured(near):
                return self._best(near)
        return None

    def clear(self, level: int) -> bool:
        """Whether the arm ahead at `level` leads every other by more than CLEAR_Z standard errors."""
        best = self.arms[(level, self._best(level))]
        others = (self.arms[(level, arm)] for arm in range(self.n_arms))
        return all(leads_by(best, other, CLEAR_Z) for other in others if other is not best)

    def choose(self, decoding: int) -> int:
        """The arm of a decode-only step of `decoding` sequences: 0 no drafts, a > 0 drafts of tier a - 1."""
        level = self.level(decoding)
        ahead = self.lead(level)
        if ahead is None:  # measure every arm, the drafting ones first
            return min(range(self.n_arms), key=lambda arm: (self.samples.get((level, arm), 0), -arm))
        arm, left = self.burst.get(level, (0, 0))
        if left > 0:  # exploring: an arm that was behind when the burst began
            self.burst[level] = (arm, left - 1)
            return arm
        waited = self.waited.get(level, 0) + 1
        every = self.every.get(level, EXPLORE_EVERY)
        if waited < every:
            self.waited[level] = waited
            return ahead
        self.waited[level] = 0
        same = self.leader.get(level, ahead) == ahead and self.measured(level) and self.clear(level)
        self.every[level] = min(2 * every, MAX_EXPLORE_EVERY) if same else EXPLORE_EVERY
        self.leader[level] = ahead
        behind = [arm for arm in range(self.n_arms) if arm != ahead]
        turn = self.explored.get(level, 0)
        self.explored[level] = turn + 1
        arm = behind[turn % len(behind)]
        self.burst[level] = (arm, EXPLORE_STEPS - 1)
        return arm

    def record(self, decoding: int, arm: int, tokens: int, seconds: float) -> None:
        """A decode-only step of `decoding` sequences run by `arm` gave `tokens` tokens in `seconds`."""
        if seconds <= 0:
            return
        level = self.level(decoding)
        for other in range(self.n_arms):
            if (level, other) in self.arms:
                self.arms[(level, other)].fade()
        self.arms.setdefault((level, arm), ArmSums()).add(tokens, seconds)
        self.samples[(level, arm)] = self.samples.get((level, arm), 0) + 1

    @staticmethod
    def span(level: int) -> str:
        """The numbers of decoding sequences a level covers: "1", "2-3", "4-7", ..."""
        low, high = 1 << (level - 1), (1 << level) - 1
        return str(low) if low == high else f"{low}-{high}"

    def report(self) -> dict[str, dict]:
        """Per load level (its span): the arm ahead (by name; None until every arm has samples there) and each
        sampled arm's tokens per second: what the gate decides on, for the server's metrics."""
        names = self.names
        return {
            self.span(level): {
                "ahead": None if lead is None else names[lead],
                "rates": {names[arm]: self.rate(level, arm) for arm in range(self.n_arms) if (level, arm) in self.arms},
            }
            for level, lead in self.leaders().items()
        }

    def leaders(self) -> dict[int, int | None]:
        """Per load level, the arm currently ahead (None: not every arm measured there yet); for metrics and
        reports."""
        levels = {level for level, _ in self.samples}
        return {
            level: self._best(level) if all((level, arm) in self.samples for arm in range(self.n_arms)) else None
            for level in sorted(levels)
        }
