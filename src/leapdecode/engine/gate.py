"""Speculation that never loses: whether the engine drafts at all at the current load, decided by the goodput it
actually measures, not by the cost model alone.

The planner (controller.plan_draft_lengths) prices drafts with a model: the measured step cost per row count and
each sequence's acceptance estimate. Models miss things (a drafter's own cost as load grows, acceptance that differs
from the estimate, steps whose cost depends on more than their row count), and then drafting costs throughput. The
gate keeps, per load level (how many sequences decode: 1, 2-3, 4-7, 8-15, ...), a decayed average of the tokens per
second that decode-only steps delivered with drafts and without, and lets the planner draft only where drafts have
delivered more. Until both arms are measured at a level, it tries them in turn.

It keeps exploring, so that a change (another mix of prompts, another load) is seen: after EXPLORE_EVERY steps of a
level one step runs the arm that is behind. Each exploration that finds the same arm ahead doubles the wait before
the next (up to MAX_EXPLORE_EVERY); one that finds the lead changed brings it back to EXPLORE_EVERY. Each
exploration costs what the arm behind is behind by, so where one arm leads steadily (drafts at high load) the price
of exploring fades, while the arm behind is still tried at least once every MAX_EXPLORE_EVERY steps of the level.
"""

from __future__ import annotations

RATE_DECAY = 0.8  # weight of the old estimate in each tokens/second average
EXPLORE_EVERY = 16  # steps of a level before its first exploration, and after an exploration that changed the lead
MAX_EXPLORE_EVERY = 512  # the longest wait between explorations once the same arm keeps its lead
MIN_SAMPLES = 3  # steps an arm needs at a level before it is trusted


class SpeculationGate:
    def __init__(self):
        self.rates: dict[tuple[int, bool], float] = {}  # (level, drafted) -> decayed tokens/second
        self.samples: dict[tuple[int, bool], int] = {}
        self.waited: dict[int, int] = {}  # per level: steps since its last exploration (or since both arms had samples)
        self.every: dict[int, int] = {}  # per level: the steps to wait before the next exploration
        self.leader: dict[int, bool] = {}  # per level: whether drafting was ahead at its last exploration

    @staticmethod
    def level(decoding: int) -> int:
        return decoding.bit_length()

    def allow(self, decoding: int) -> bool:
        """Whether the planner may draft in a decode-only step of `decoding` sequences."""
        level = self.level(decoding)
        on, off = self.samples.get((level, True), 0), self.samples.get((level, False), 0)
        if on < MIN_SAMPLES or off < MIN_SAMPLES:
            return on <= off  # measure both arms, drafting first
        ahead = self.rates[(level, True)] >= self.rates[(level, False)]
        return ahead != self._explore(level, ahead)

    def _explore(self, level: int, ahead: bool) -> bool:
        """Whether this step of `level` explores the arm behind; `ahead`: whether drafting leads now."""
        waited = self.waited.get(level, 0) + 1
        every = self.every.get(level, EXPLORE_EVERY)
        if waited < every:
            self.waited[level] = waited
            return False
        self.waited[level] = 0
        same = self.leader.get(level, ahead) == ahead
        self.every[level] = min(2 * every, MAX_EXPLORE_EVERY) if same else EXPLORE_EVERY
        self.leader[level] = ahead
        return True

    def record(self, decoding: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A decode-only step of `decoding` sequences gave `tokens` tokens in `seconds`, with or without drafts."""
        if seconds <= 0:
            return
        key = (self.level(decoding), drafted)
        rate = tokens / seconds
        old = self.rates.get(key)
        self.rates[key] = rate if old is None else RATE_DECAY * old + (1 - RATE_DECAY) * rate
        self.samples[key] = self.samples.get(key, 0) + 1

    def drafting(self) -> dict[int, bool | None]:
        """Per load level, whether drafts currently lead (None: not measured yet); for metrics and reports."""
        levels = {level for level, _ in self.rates}
        return {
            level: (self.rates[(level, True)] >= self.rates[(level, False)])
            if (level, True) in self.rates and (level, False) in self.rates
            else None
            for level in sorted(levels)
        }
