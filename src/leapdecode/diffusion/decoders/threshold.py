"""Fast-dLLM confidence threshold: commit every masked position whose top probability is at least tau
(at least the most confident one per step)."""

from __future__ import annotations

from ...errors import require
from ..loop import Commit, StepView
from .base import Decoder


def check_threshold(tau: float, what: str = "threshold") -> float:
    require(0 < tau <= 1, f"{what} must be in (0, 1], got {tau}")
    return float(tau)


class ThresholdDecoder(Decoder):
    name = "threshold"

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = check_threshold(threshold)

    def select(self, view: StepView) -> Commit:
        return Commit(view.eligible & (view.confidence >= self.threshold))

    def describe(self) -> str:
        return f"threshold({self.threshold:g})"
