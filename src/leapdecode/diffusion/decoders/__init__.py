"""Parallel-decoding policies behind one interface (`Decoder.select(view) -> Commit`), and a factory by name."""

from __future__ import annotations

from pathlib import Path

from ...errors import require
from .base import Decoder
from .credit import CreditDecoder
from .egp import EGPDecoder
from .fixed_steps import FixedStepsDecoder
from .learn2pd import Learn2PDDecoder, PositionFilter
from .prophet import ProphetDecoder
from .threshold import ThresholdDecoder, check_threshold

DECODERS = ["fixed_steps", "threshold", "credit", "prophet", "learn2pd", "egp"]


def make_decoder(
    name: str,
    *,
    threshold: float | None = None,
    steps: int | None = None,
    filter_dir: str | Path | None = None,
    prophet_scale: float = 1.0,
) -> Decoder:
    """Build a decoder from CLI-level settings; bad names or values raise LeapDecodeError with one line."""
    require(name in DECODERS, f"unknown decoder {name!r}; choose from {', '.join(DECODERS)}")
    if threshold is not None:
        check_threshold(threshold)
    if name == "fixed_steps":
        return FixedStepsDecoder(steps=steps)
    if name == "threshold":
        return ThresholdDecoder(0.9 if threshold is None else threshold)
    if name == "credit":
        return CreditDecoder(0.9 if threshold is None else threshold)
    if name == "prophet":
        return ProphetDecoder(scale=prophet_scale)
    if name == "learn2pd":
        from ..model import CHECKPOINT_DIR

        filt = PositionFilter.load(filter_dir or CHECKPOINT_DIR)
        return Learn2PDDecoder(filt, 0.9 if threshold is None else threshold)
    return EGPDecoder()


__all__ = [
    "DECODERS",
    "Decoder",
    "make_decoder",
    "CreditDecoder",
    "EGPDecoder",
    "FixedStepsDecoder",
    "Learn2PDDecoder",
    "PositionFilter",
    "ProphetDecoder",
    "ThresholdDecoder",
]
