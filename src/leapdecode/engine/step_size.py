"""How many rows a step takes, from measured step costs (controller.StepCost): how many prompt rows ride along
beside the streams (SARATHI's chunked prefill: the step's row budget, or, under a bound on how much dearer the
streams' step may get, fewer), and how many streams a plain step serves (a forward's cost rises in stairs, and one
stream past a stair's edge can cost more than it gives)."""

from __future__ import annotations

import math

from ..controller import StepCost

MIN_CHUNK = 16  # prompt rows a step takes at least while streams decode (half the rows when max_batch_tokens < 32)
STAIR_MARGIN = 0.1  # how much more tokens a second serving fewer streams must promise (see streams_served)


def prefill_rows(costs: StepCost, decode_rows: int, budget: int, rest: int, slowdown: float, joining: int = 0) -> int:
    """Rows a step may hold while streams decode: prompt chunks only up to where the measured forward cost reaches
    `slowdown` times the decode-only step the streams will have once the `joining` requests being read join them
    (SARATHI: prefill rides along without stalling the streams); at least MIN_CHUNK prompt rows, so a long prompt
    always advances. Bounded by the decode-only step of the streams decoding now instead, a wave of new requests
    would be read a few rows a step beside its first streams: those would decode fast while the rest of the wave
    waited, and the batch would stay small, and slow per token, for longer.

    Where even MIN_CHUNK rows cost more than that (few streams, whose decode-only steps are far cheaper than any step
    that reads: a many-row product widens the weights first), the bound cannot be kept. Then a prompt whose `rest`
    fits in a step costing at most `slowdown` times that cheapest reading step is read whole: the streams wait once
    instead of over several steps that each pay the reading step's fixed cost. A longer prompt still advances by
    MIN_CHUNK rows a step, so its many steps each stay as light as they can be."""
    if not costs or slowdown == math.inf:
        return budget
    floor = min(decode_rows + MIN_CHUNK, budget)
    limit = slowdown * costs(decode_rows + joining)
    if costs(floor) > limit:
        whole = decode_rows + rest
        fits = floor < whole <= budget and costs(whole) <= slowdown * costs(floor)
        return whole if fits else floor
    low, high = floor, budget
    while low < high:  # the largest row count whose cost stays within the limit
        mid = (low + high + 1) // 2
        low, high = (mid, high) if costs(mid) <= limit else (low, mid - 1)
    return low


def streams_served(costs: StepCost, decoding: int) -> int:
    """How many of `decoding` streams a plain step (no prompt chunk, no drafts) serves: the count, down to half of
    them, whose measured step cost gives the most tokens a second, by more than STAIR_MARGIN; the rest wait for the
    next step. A forward's cost rises in stairs, not smoothly (a product's rows go in tiles, and a row past a tile's
    edge costs nearly a tile more), so one stream past an edge can cost more than the stream gives; then serving the
    streams in turns gives the batch more tokens a second and each stream its tokens sooner on average (a stream
    served in m steps of n costs cost(m) n / m a token, not cost(n)). Only measured counts are weighed (the envelope
    caps a count measured in a slow moment by the larger ones)."""
    fewer = [m for m in range((decoding + 1) // 2, decoding) if m in costs]
    if decoding not in costs or not fewer:
        return decoding
    best = max(fewer, key=lambda m: m / costs(m))
    return best if best / costs(best) > (1 + STAIR_MARGIN) * decoding / costs(decoding) else decoding
