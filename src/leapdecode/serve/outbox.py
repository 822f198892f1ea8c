"""Outputs on their way from the engine thread to the event loops that wait for them.

The engine thread holds a step's outputs until the next step's forward starts, then hands them over in one wake-up
per event loop. The event loop writes the step's chunks while that forward runs in native code without the GIL;
outputs handed over as they were made had the event loop take the GIL just when the engine thread's Python schedules
and prepares the next step, which then waited for it. Where no forward follows at once (the engine went idle, a step ran none) the thread hands
them over itself, and outputs made on another thread (a cancel) go out at once, after whatever was held, so that a
request's outputs always arrive in order.
"""

from __future__ import annotations

import asyncio
import threading


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


class Outbox:
    def __init__(self):
        self._lock = threading.Lock()
        self._held: list[tuple[tuple[asyncio.AbstractEventLoop, asyncio.Queue], object]] = []
        self.holder: int | None = None  # the thread whose outputs wait for the next forward (the engine's)
        self.handed = False  # whether the holder handed over since it last cleared this

    @property
    def held(self) -> int:
        return len(self._held)

    def put(self, entry: tuple[asyncio.AbstractEventLoop, asyncio.Queue], item: object) -> None:
        """Queue `item` for `entry` (its request's loop and queue); at once unless the holder thread made it."""
        with self._lock:
            self._held.append((entry, item))
        if threading.get_ident() != self.holder:
            self.hand_over()

    def hand_over(self) -> None:
        """Hand every held item to its loop, one wake-up per loop, in the order they came (a loop that is gone, at
        shutdown, is skipped: nobody waits there)."""
        with self._lock:  # held while handing over, so that two threads' hand-overs cannot overtake each other
            if threading.get_ident() == self.holder:
                self.handed = True
            held, self._held = self._held, []
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            for (loop, queue), item in held:
                by_loop.setdefault(loop, []).append((queue, item))
            for loop, items in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_put_all, items)
                except RuntimeError:
                    pass
