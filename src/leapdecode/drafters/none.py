"""The drafter that proposes nothing: plain autoregressive decoding through the same loop."""

from __future__ import annotations

from .base import EMPTY, Draft, Drafter


class NoDrafter(Drafter):
    name = "none"
    drafts = False

    def propose(self, context: list[int], k: int) -> Draft:
        return EMPTY
