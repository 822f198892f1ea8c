"""Extremely Greedy Parallel (EGP), the oracle Learn2PD imitates: commit every masked position whose current
prediction already equals the reference decode's final token (or the most confident one if none does)."""

from __future__ import annotations

from ...errors import require
from ..loop import Commit, StepView
from .base import Decoder


class EGPDecoder(Decoder):
    name = "egp"

    def select(self, view: StepView) -> Commit:
        require(view.reference is not None, "the EGP oracle needs the reference decode's final tokens")
        return Commit(view.eligible & (view.argmax == view.reference))
