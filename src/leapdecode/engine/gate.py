"""Speculation that never loses: whether the engine drafts at all at the current load, decided by the goodput it
actually measures, not by the cost model alone.

The planner (controller.plan_draft_lengths) prices drafts with a model: the measured step cost per row count and
each sequence's acceptance estimate. Models miss things (a drafter's own cost as load grows, acceptance that differs
from the estimate, steps whose cost depends on more than their row count), and then drafting costs throughput. The
gate keeps, per load level (how many sequences decode: 1, 2-3, 4-7, 8-15, ...) and per arm (drafts allowed or not),
the tokens and the seconds that decode-only steps delivered, each a decayed sum, and lets the planner draft only where
drafts have delivered more tokens per second. Until both arms have MIN_SAMPLES steps at a level, it follows a
neighbouring level that has them, or else alternates the arms.

A single step is a noisy sample (a drafted step yields one token or several), so the rate is a ratio of sums, not a
mean of per-step rates, and the arm behind is explored in bursts of EXPLORE_STEPS steps, never judged on one. It keeps
exploring, so that a change (another mix of prompts, another load) is seen: after EXPLORE_EVERY steps of a level one
burst runs the arm behind. Each burst after which the same arm leads doubles the wait before the next (up to
MAX_EXPLORE_EVERY); one after which the lead changed brings it back to EXPLORE_EVERY. So where one arm leads steadily
the price of exploring fades, while the arm behind is still tried every MAX_EXPLORE_EVERY steps of the level.
"""

from __future__ import annotations

RATE_DECAY = 0.9  # weight of the old sums at each new sample of an arm
EXPLORE_EVERY = 16  # steps of a level before its first exploration, and after one that changed the lead
MAX_EXPLORE_EVERY = 512  # the longest wait between explorations once the same arm keeps its lead
EXPLORE_STEPS = 4  # steps of the arm behind in one exploration
MIN_SAMPLES = 6  # steps an arm needs at a level before it is trusted


class SpeculationGate:
    def __init__(self):
        self.tokens: dict[tuple[int, bool], float] = {}  # (level, drafted) -> decayed sum of tokens
        self.seconds: dict[tuple[int, bool], float] = {}  # (level, drafted) -> decayed sum of seconds
        self.samples: dict[tuple[int, bool], int] = {}
        self.waited: dict[int, int] = {}  # per level: steps since its last exploration (or since both arms had samples)
        self.every: dict[int, int] = {}  # per level: the steps to wait before the next exploration
        self.leader: dict[int, bool] = {}  # per level: whether drafting led when its last exploration began
        self.burst: dict[int, int] = {}  # per level: steps of the current exploration still to run

    @staticmethod
    def level(decoding: int) -> int:
        return decoding.bit_length()

    def rate(self, level: int, drafted: bool) -> float:
        key = (level, drafted)
        return self.tokens[key] / self.seconds[key]

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
        same = self.leader.get(level, ahead) == ahead
        self.every[level] = min(2 * every, MAX_EXPLORE_EVERY) if same else EXPLORE_EVERY
        self.leader[level] = ahead
        self.burst[level] = EXPLORE_STEPS - 1
        return not ahead

    def record(self, decoding: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A decode-only step of `decoding` sequences gave `tokens` tokens in `seconds`, with or without drafts."""
        if seconds <= 0:
            return
        key = (self.level(decoding), drafted)
        self.tokens[key] = RATE_DECAY * self.tokens.get(key, 0.0) + tokens
        self.seconds[key] = RATE_DECAY * self.seconds.get(key, 0.0) + seconds
        self.samples[key] = self.samples.get(key, 0) + 1

    def drafting(self) -> dict[int, bool | None]:
        """Per load level, whether drafts currently lead (None: not measured yet); for metrics and reports."""
        levels = {level for level, _ in self.samples}
        return {
            level: (self.rate(level, True) >= self.rate(level, False))
            if (level, True) in self.samples and (level, False) in self.samples
            else None
            for level in sorted(levels)
        }
