"""Oracle drafter (benchmark only): proposes the known greedy continuation, the ceiling for any drafter."""

from __future__ import annotations

from ..sampling import SamplingConfig
from .base import EMPTY, Draft, Drafter


class OracleDrafter(Drafter):
    name = "oracle"

    def __init__(self, reference: list[int]):
        self.reference = list(reference)
        self.prompt_len = 0

    def start(self, prompt_ids: list[int], sampling: SamplingConfig) -> None:
        self.prompt_len = len(prompt_ids)

    def propose(self, context: list[int], k: int) -> Draft:
        done = len(context) - self.prompt_len
        if context[self.prompt_len :] != self.reference[:done]:
            return EMPTY  # diverged from the reference: nothing known to propose
        return Draft(self.reference[done : done + k])
