"""The engine's own thread: it alone calls `engine.step()`, so the event loop never waits on a forward.

Requests go in from the event loop with `submit` (the Engine's add_request is thread-safe); each step's outputs come
back through `loop.call_soon_threadsafe` into the asyncio queue of their request. The thread sleeps on an event while
the engine is idle and wakes on a new request or a cancel. After every step it takes a snapshot of
`engine.metrics()`, so a /metrics scrape from the event loop never reads the engine's lists while a step changes
them. If a step raises (a bug), every request in flight gets the error and is cancelled, and the thread goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("leapdecode.serve")


@dataclass
class StepFailure:
    """Put on a request's queue instead of a RequestOutput when the engine failed."""

    request_id: int
    message: str


class EngineThread:
    def __init__(self, engine, name: str = "leapdecode-engine"):
        self.engine = engine
        self._wake = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        self._queues: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.snapshot: dict = engine.metrics()
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "EngineThread":
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is in flight and end the thread."""
        self._stopping = True
        for rid in list(self._queues):
            self.engine.cancel(rid)
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def in_flight(self) -> int:
        return len(self._queues)

    def submit(self, prompt, queue: asyncio.Queue | None = None, **params) -> tuple[int, asyncio.Queue]:
        """Queue a request from the event loop; return its id and the queue its outputs arrive on (`queue`, to
        share one between the requests of one HTTP call). Bad input raises LeapDecodeError here, before anything
        is queued."""
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue() if queue is None else queue

        def on_output(output):
            # called in the engine thread (or in cancel()'s caller): hand over to the request's loop
            with self._lock:  # submit holds it until the queue is registered
                entry = self._queues.get(output.request_id)
                if output.finished:
                    self._queues.pop(output.request_id, None)
            if entry is not None:
                entry[0].call_soon_threadsafe(entry[1].put_nowait, output)

        with self._lock:
            rid = self.engine.add_request(prompt, on_output=on_output, **params)
            self._queues[rid] = (loop, queue)
        self._wake.set()
        return rid, queue

    def cancel(self, request_id: int) -> None:
        """Stop a request (its KV is freed at the next step, or at once if none runs); safe from any thread."""
        if request_id in self._queues:
            self.engine.cancel(request_id)
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            if not self.engine.has_work:
                self._take_snapshot()
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                self.engine.step()
            except Exception as error:  # a bug in a step: fail the requests in flight, keep serving
                self._fail(error)
            self._take_snapshot()
        self._take_snapshot()

    def _take_snapshot(self) -> None:
        # a cancel() from another thread may free a request while metrics() reads it: keep the last snapshot then
        try:
            self.snapshot = self.engine.metrics()
        except Exception:
            log.debug("metrics snapshot skipped", exc_info=True)

    def _fail(self, error: Exception) -> None:
        self.failures += 1
        log.exception("engine step failed")
        message = f"the engine failed: {type(error).__name__}: {' '.join(str(error).split())}"
        with self._lock:
            queues, self._queues = dict(self._queues), {}
        for rid, (loop, queue) in queues.items():
            loop.call_soon_threadsafe(queue.put_nowait, StepFailure(rid, message))
            try:
                self.engine.cancel(rid)
            except Exception:
                log.exception("cancel after a failed step")
        time.sleep(0.01)
