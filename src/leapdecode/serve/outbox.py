"""Outputs on their way from the engine thread to the event loops that wait for them.

The engine thread collects a step's outputs and hands them over when the step is done, in one wake-up per event loop,
then waits (bounded) until each loop has run the requests they woke, so that their chunks are written before the next
forward starts. The event loop's Python thus runs between forwards, not during one: where the forward's OpenMP team
has a thread on every core, any other thread that runs meanwhile delays one team member and with it every barrier,
so the forward lost more than the event loop's time (docs/serving.md). Outputs made on another thread (a cancel) go
out at once, after whatever was held, so that a request's outputs always arrive in order.
"""

from __future__ import annotations

import asyncio
import threading


def _put_all(items: list[tuple[asyncio.Queue, object]], done: threading.Event | None) -> None:
    for queue, item in items:
        queue.put_nowait(item)
    if done is not None:
        # set in the loop's next iteration, after the tasks these items woke have run and written their chunks (a task
        # woken through more futures on its way may still be writing then: as if the engine had not waited)
        asyncio.get_running_loop().call_soon(done.set)


class Outbox:
    def __init__(self):
        self._lock = threading.Lock()
        self._held: list[tuple[tuple[asyncio.AbstractEventLoop, asyncio.Queue], object]] = []
        self.holder: int | None = None  # the thread whose outputs wait for its hand_over (the engine's)

    @property
    def held(self) -> int:
        return len(self._held)

    def put(self, entry: tuple[asyncio.AbstractEventLoop, asyncio.Queue], item: object) -> None:
        """Queue `item` for `entry` (its request's loop and queue); at once unless the holder thread made it."""
        with self._lock:
            self._held.append((entry, item))
        if threading.get_ident() != self.holder:
            self.hand_over()

    def hand_over(self, wait: float = 0.0) -> None:
        """Hand every held item to its loop, one wake-up per loop, in the order they came (a loop that is gone, at
        shutdown, is skipped: nobody waits there); with `wait`, then wait up to that many seconds until each loop has
        run what the items woke."""
        reports = []
        with self._lock:  # held while handing over, so that two threads' hand-overs cannot overtake each other
            held, self._held = self._held, []
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            for (loop, queue), item in held:
                by_loop.setdefault(loop, []).append((queue, item))
            for loop, items in by_loop.items():
                done = threading.Event() if wait > 0 else None
                try:
                    loop.call_soon_threadsafe(_put_all, items, done)
                except RuntimeError:
                    continue
                if done is not None:
                    reports.append(done)
        for done in reports:
            done.wait(wait)
