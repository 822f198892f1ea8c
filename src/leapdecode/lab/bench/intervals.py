"""How far a paired ratio measured a few times can be trusted: on a small shared host two runs of the same thing
differ by several percent, so a ratio of two methods read over a few slices or rounds is reported with an interval
that shows how much of it that noise could explain."""

from __future__ import annotations

import math
import statistics

# Student's t at 97.5 % for 1 .. 30 degrees of freedom (more: the normal's 1.96)
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11, 2.10,
         2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04)  # fmt: skip


def ratio_interval(ratios: list[float]) -> tuple[float, float] | None:
    """A ~95 % interval for the typical paired ratio: the mean of the logs plus or minus t standard errors, back
    from logs (a ratio and its inverse get mirrored intervals); None under two ratios."""
    if len(ratios) < 2:
        return None
    logs, df = [math.log(r) for r in ratios], len(ratios) - 1
    half = (_T975[df - 1] if df <= len(_T975) else 1.96) * statistics.stdev(logs) / math.sqrt(len(ratios))
    return math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)
