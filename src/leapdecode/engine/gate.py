"""Speculation that never loses: whether the engine drafts at all at the current load, decided by the goodput it
actually measures, not by the cost model alone.

The planner (controller.plan_draft_lengths) prices drafts with a model: the measured step cost per row count and
each sequence's acceptance estimate. Models miss things (a drafter's own cost as load grows, acceptance that differs
from the estimate, steps whose cost depends on more than their row count), and then drafting costs throughput. The
gate keeps, per load level (how many sequences decode: 1, 2-3, 4-7, 8-15, ...) and per arm (drafts allowed or not),
the tokens and the seconds that decode-only steps delivered, each a decayed sum, and lets the planner draft only where
drafts have delivered more tokens per second. Until both arms have MIN_SAMPLES steps at a level, it follows a
neighbouring level that has them, or else alternates the arms.

A single step is a noisy sample (a drafted step yields one token or several, and what a drafted step yields moves
with the text), so the rate is a ratio of sums, not a mean of per-step rates, over a memory of about fifty steps of
the level: every step of a level fades both arms' sums there, so the arm behind is judged on its recent samples,
not on samples from another stretch of text. Its standard error comes with it (the delta method over the same
decayed sums). The arm behind is explored in bursts of EXPLORE_STEPS steps, never judged on one, and it keeps
exploring, so that a change (another mix of prompts, another load) is seen: after EXPLORE_EVERY steps of a level one
burst runs the arm behind. Each burst after which the same arm leads by more than CLEAR_Z standard errors doubles the
wait before the next (up to MAX_EXPLORE_EVERY); one after which the lead changed, or is within the noise, brings it
back to EXPLORE_EVERY. So where one arm leads clearly the price of exploring fades, while the arm behind is still
tried every MAX_EXPLORE_EVERY steps of the level; where the two are close, both keep being measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RATE_DECAY = 0.98  # per step of a level, the weight left to both arms' older samples there
CLEAR_Z = 2.0  # a lead is clear when the two rates differ by this many standard errors
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


class SpeculationGate:
    def __init__(self):
        self.arms: dict[tuple[int, bool], ArmSums] = {}  # (level, drafted) -> its sums
        self.samples: dict[tuple[int, bool], int] = {}
        self.waited: dict[int, int] = {}  # per level: steps since its last exploration (or since both arms had samples)
        self.every: dict[int, int] = {}  # per level: the steps to wait before the next exploration
        self.leader: dict[int, bool] = {}  # per level: whether drafting led when its last exploration began
        self.burst: dict[int, int] = {}  # per level: steps of the current exploration still to run

    @staticmethod
    def level(decoding: int) -> int:
        return decoding.bit_length()

    def rate(self, level: int, drafted: bool) -> float:
        return self.arms[(level, drafted)].rate

    def measured(self, level: int) -> bool:
        return all(self.samples.get((level, arm), 0) >= MIN_SAMPLES for arm in (True, False))

    def lead(self, level: int) -> bool | None:
        """Whether drafting leads at `level`: by its own samples once both arms have MIN_SAMPLES there; before that,
        by a neighbouring level's (loads next to each other behave alike, and each level's start-up samples of the
        losing arm are a price a short run notices); None where neither is known."""
        for near in (level, level - 1, level + 1):
            if self.measured(near):
                return self.rate(near, True) >= self.rate(near, False)
        return None

    def clear(self, level: int) -> bool:
        """Whether the two arms' rates at `level` differ by more than CLEAR_Z standard errors."""
        on, off = self.arms[(level, True)], self.arms[(level, False)]
        return abs(on.rate - off.rate) > CLEAR_Z * math.sqrt(on.variance + off.variance)

    def allow(self, decoding: int) -> bool:
        """Whether the planner may draft in a decode-only step of `decoding` sequences."""
        level = self.level(decoding)
        ahead = self.lead(level)
        if ahead is None:  # measure both arms, drafting first
            return self.samples.get((level, True), 0) <= self.samples.get((level, False), 0)
        if self.burst.get(level, 0) > 0:  # exploring: the arm that was behind when the burst began
            self.burst[level] -= 1
            return not self.leader[level]
        waited = self.waited.get(level, 0) + 1
        every = self.every.get(level, EXPLORE_EVERY)
        if waited < every:
            self.waited[level] = waited
            return ahead
        self.waited[level] = 0
        same = self.leader.get(level, ahead) == ahead and self.measured(level) and self.clear(level)
        self.every[level] = min(2 * every, MAX_EXPLORE_EVERY) if same else EXPLORE_EVERY
        self.leader[level] = ahead
        self.burst[level] = EXPLORE_STEPS - 1
        return not ahead

    def record(self, decoding: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A decode-only step of `decoding` sequences gave `tokens` tokens in `seconds`, with or without drafts."""
        if seconds <= 0:
            return
        level = self.level(decoding)
        for arm in (True, False):
            if (level, arm) in self.arms:
                self.arms[(level, arm)].fade()
        self.arms.setdefault((level, drafted), ArmSums()).add(tokens, seconds)
        self.samples[(level, drafted)] = self.samples.get((level, drafted), 0) + 1

    def drafting(self) -> dict[int, bool | None]:
        """Per load level, whether drafts currently lead (None: not measured yet); for metrics and reports."""
        levels = {level for level, _ in self.samples}
        return {
            level: (self.rate(level, True) >= self.rate(level, False))
            if (level, True) in self.samples and (level, False) in self.samples
            else None
            for level in sorted(levels)
        }
