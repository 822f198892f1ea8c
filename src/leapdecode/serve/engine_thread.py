"""The engine's own thread: it alone calls `engine.step()`, so the event loop never waits on a forward.

Requests go in from the event loop with `submit` (the Engine's add_request is thread-safe); each step's outputs come
back into the asyncio queue of their request through the outbox (serve/outbox.py): handed over once the step is done,
and written by the event loop before the next forward starts (bounded by that step's own duration). The thread sleeps
on an event while the engine is idle and wakes on a new request or a cancel. After every step it takes a snapshot of
`engine.metrics()`, so a /metrics scrape from the event loop never reads the engine's lists while a step changes
them. If a step raises (a bug), every request in flight gets the error (an id to quote; the details go to the log)
and is cancelled, and the thread goes on. Health: the thread is `unhealthy` when it has stopped, when its last
FAILING_AFTER steps all raised (until a step succeeds), or when one step has run for STALL_SECONDS; new requests then
fail fast (`refuse_reason`), except that FAILING_AFTER failures in a row close the door only for COOLDOWN_SECONDS,
after which requests probe the engine again. If the thread itself ends (not by `stop`), every request in flight gets
a failure at once rather than waiting forever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from ..host import release_openmp_threads
from .outbox import Outbox
from .security import error_id

FAILING_AFTER = 3  # steps in a row that raised: the engine is failing
COOLDOWN_SECONDS = 5.0  # ...and refuses new requests this long after the last failure (then lets them probe)
STALL_SECONDS = 120.0  # one step running this long: the engine is stuck
DEFAULT_STREAM_INTERVAL = 4  # tokens a streamed chunk carries at least (docs/serving.md: what it buys, measured)
DEFAULT_STREAM_MAX_DELAY = 0.05  # seconds: a held chunk goes out at the first step past this, whatever its size

log = logging.getLogger("leapdecode.serve")


@dataclass(frozen=True)
class Streaming:
    """How a server paces its streams (see Interval): `interval`, the tokens a chunk carries at least (a call may ask
    for more with vLLM's stream_interval); `max_delay`, the seconds after a request's previous chunk past which a
    held one goes out whatever its size (0: none, vLLM's rule)."""

    interval: int = DEFAULT_STREAM_INTERVAL
    max_delay: float = DEFAULT_STREAM_MAX_DELAY

    def __post_init__(self):
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1:
            raise ValueError(f"stream interval must be an integer >= 1, got {self.interval!r}")
        if isinstance(self.max_delay, bool) or not isinstance(self.max_delay, (int, float)) or self.max_delay < 0:
            raise ValueError(f"stream max delay must be a number >= 0, got {self.max_delay!r}")


class Interval:
    """One request's outputs paced by a Streaming: joined until they carry `interval` tokens, so that a held step
    costs the event loop nothing (no wake-up, no chunk to write, none for the client to read): on a few cores that
    Python runs beside the forward or delays the next one. Its first output with tokens and its last go out at once
    (the first token's latency and the end are as without it), and with a `max_delay` so does one that comes that
    long after the request's previous chunk: made text waits at most that long plus one step."""

    def __init__(self, pacing: Streaming):
        self.pacing = pacing
        self.held = None  # the output held
        self.sent: float | None = None  # when its last output with tokens went out

    def due(self, output):
        """The output to hand over now (`output` joined to what was held), or None while it is held."""
        tokens, max_delay = self.pacing.interval, self.pacing.max_delay
        if tokens <= 1:
            return output
        if self.held is not None:
            output = self.held.then(output)
        now = time.perf_counter()
        first = self.sent is None
        late = not first and max_delay > 0 and now - self.sent >= max_delay
        if output.finished or first or late or len(output.new_token_ids) >= tokens:
            self.held = None
            if output.new_token_ids:
                self.sent = now
            return output
        self.held = output
        return None


@dataclass
class StepFailure:
    """Put on a request's queue instead of a RequestOutput when the engine failed."""

    request_id: int
    message: str
    status: int = 500
    code: str = "engine_error"


class EngineThread:
    def __init__(self, engine, name: str = "leapdecode-engine"):
        self.engine = engine
        self._wake = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        self._queues: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._outbox = Outbox()
        self.handover_seconds = 0.0  # waited after steps for the event loops to write their outputs
        self.snapshot: dict = {**engine.metrics(), "handover_seconds": 0.0}
        self.failures = 0
        self.failures_in_a_row = 0
        self.last_failure = 0.0
        self.step_started: float | None = None
        self.ended: str | None = None  # why the thread ended, when it did by itself
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "EngineThread":
        if not self._thread.is_alive():
            release_openmp_threads()  # the engine was built in this thread: its OpenMP team would compete with ours
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

    def unhealthy(self) -> str | None:
        """Why the engine cannot serve now (for /health), or None."""
        if not self.alive:
            return "engine thread stopped"
        if self.failures_in_a_row >= FAILING_AFTER:
            return f"engine failing: its last {self.failures_in_a_row} steps raised"
        started = self.step_started
        if started is not None and time.monotonic() - started > STALL_SECONDS:
            return f"engine stalled: one step has run for {time.monotonic() - started:.0f} s"
        return None

    def refuse_reason(self) -> str | None:
        """Why a new request must fail fast now, or None (a failing engine is probed again after a cooldown)."""
        reason = self.unhealthy()
        if reason and reason.startswith("engine failing") and time.monotonic() - self.last_failure > COOLDOWN_SECONDS:
            return None
        return reason

    @property
    def in_flight(self) -> int:
        return len(self._queues)

    def submit(
        self,
        prompt,
        queue: asyncio.Queue | None = None,
        pacing: Streaming | None = None,
        **params,
    ) -> tuple[int, asyncio.Queue]:
        """Queue a request from the event loop; return its id and the queue its outputs arrive on (`queue`, to
        share one between the requests of one HTTP call). `pacing`: how its outputs are joined into chunks (see
        Interval; None: one per step). Bad input raises LeapDecodeError here, before anything is queued."""
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue() if queue is None else queue
        interval = Interval(pacing or Streaming(1, 0.0))

        def on_output(output):
            # called in the engine thread (or in cancel()'s caller): hand over to the request's loop
            with self._lock:  # submit holds it until the queue is registered
                entry = self._queues.get(output.request_id)
                if output.finished:
                    self._queues.pop(output.request_id, None)
                output = interval.due(output)
            if entry is not None and output is not None:
                self._outbox.put(entry, _failure(output) if output.error is not None else output)

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
        self._outbox.holder = threading.get_ident()
        try:
            while not self._stopping:
                if not self.engine.has_work:
                    self._take_snapshot()
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
                    continue
                self.step_started = started = time.monotonic()
                try:
                    failed_steps = self.engine.counters["step_failures"]
                    self.engine.step()
                    if self.engine.counters["step_failures"] > failed_steps:  # the engine ended that step's requests
                        self._note_failure()
                    else:
                        self.failures_in_a_row = 0
                except Exception as error:  # a bug outside the engine's own isolation: fail what is in flight
                    self._fail(error)
                finally:
                    self.step_started = None
                ended = time.monotonic()
                self._outbox.hand_over(wait=ended - started)
                self.handover_seconds += time.monotonic() - ended
                self._take_snapshot()
            self._take_snapshot()
        except BaseException as error:
            self.ended = type(error).__name__
            log.critical("the engine thread ended: %s", self.ended, exc_info=True)
            raise
        finally:
            self._outbox.holder = None  # from now on every output goes out at once
            self._outbox.hand_over()
            if not self._stopping:  # ended by itself: nobody may wait for it
                self._stopping = True
                self._fail_all("the engine thread stopped", 503, "engine_unavailable")

    def _take_snapshot(self) -> None:
        # a cancel() from another thread may free a request while metrics() reads it: keep the last snapshot then
        try:
            self.snapshot = {**self.engine.metrics(), "handover_seconds": self.handover_seconds}
        except Exception:
            log.debug("metrics snapshot skipped", exc_info=True)

    def _note_failure(self) -> None:
        self.failures += 1
        self.failures_in_a_row += 1
        self.last_failure = time.monotonic()

    def _fail(self, error: Exception) -> None:
        self._note_failure()
        eid = error_id()
        log.error("engine step failed (%s): %s: %s", eid, type(error).__name__, error, exc_info=error)
        self._fail_all(f"the engine failed on this request (error id {eid}; the server log has the details)")
        time.sleep(0.01)

    def _fail_all(self, message: str, status: int = 500, code: str = "engine_error") -> None:
        with self._lock:
            queues, self._queues = dict(self._queues), {}
        for rid, entry in queues.items():
            self._outbox.put(entry, StepFailure(rid, message, status, code))
        self._outbox.hand_over()
        for rid in queues:
            try:
                self.engine.cancel(rid)
            except Exception:
                log.exception("cancel after a failed step")


def _failure(output) -> StepFailure:
    """A request the engine ended with an error (its own fault, or a failed step): the client gets an id to quote, the
    reason goes to the log under it."""
    eid = error_id()
    log.error("request %d failed (%s): %s", output.request_id, eid, output.error)
    return StepFailure(
        output.request_id, f"the engine failed on this request (error id {eid}; the server log has the details)"
    )
