"""Speculation that never loses: whether the engine drafts at all at the current load, decided by the goodput it
actually measures, not by the cost model alone.

The planner (controller.plan_draft_lengths) prices drafts with a model: the measured step cost per row count and
each sequence's acceptance estimate. Models miss things (a drafter's own cost as load grows, acceptance that differs
from the estimate, steps whose cost depends on more than their row count), and then drafting costs throughput. The
gate keeps, per load level (how many sequences decode: 1, 2-3, 4-7, 8-15, ...), a decayed average of the tokens per
second that decode-only steps delivered with drafts and without, and lets the planner draft only where drafts have
delivered more. It keeps exploring: every EXPLORE_EVERY-th step of a level runs the arm that is behind, so a change
(another mix of prompts, another load) is seen. Until both arms are measured at a level, it tries them in turn.
"""

from __future__ import annotations

RATE_DECAY = 0.8  # weight of the old estimate in each tokens/second average
EXPLORE_EVERY = 16  # one step in this many runs the arm that is behind
MIN_SAMPLES = 3  # steps an arm needs at a level before it is trusted


class SpeculationGate:
    def __init__(self):
        self.rates: dict[tuple[int, bool], float] = {}  # (level, drafted) -> decayed tokens/second
        self.samples: dict[tuple[int, bool], int] = {}
        self.steps: dict[int, int] = {}  # decode-only steps planned per level

    @staticmethod
    def level(decoding: int) -> int:
        return decoding.bit_length()

    def allow(self, decoding: int) -> bool:
        """Whether the planner may draft in a decode-only step of `decoding` sequences."""
        level = self.level(decoding)
        step = self.steps.get(level, 0)
        self.steps[level] = step + 1
        on, off = self.samples.get((level, True), 0), self.samples.get((level, False), 0)
        if on < MIN_SAMPLES or off < MIN_SAMPLES:
            return on <= off  # measure both arms, drafting first
        ahead = self.rates[(level, True)] >= self.rates[(level, False)]
        return ahead != (step % EXPLORE_EVERY == EXPLORE_EVERY - 1)

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
