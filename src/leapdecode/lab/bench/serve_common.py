"""What bench-serve's scenarios share: concurrency levels, the prompts, percentiles."""

from __future__ import annotations

from ...errors import LeapDecodeError, require


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LeapDecodeError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    require(levels and all(c >= 1 for c in levels), f"--concurrency levels must be >= 1, got {text!r}")
    return levels


def load_prompts(suite: str) -> list[str]:
    from .suites import load_suite

    return [q.turns[0] for q in load_suite(suite)]


def _pct(values: list[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between ranks (numpy's default, as `vllm bench serve`)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q / 100 * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
