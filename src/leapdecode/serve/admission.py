"""Bounded admission: how much work the server takes on, how long a request may wait and run, and shutting down.

Capacity is counted in engine requests (sequences): one HTTP call holds one from the moment it arrives (before its
body is read, so a burst of large bodies is bounded too), then one per (prompt, choice) once its body is parsed. At
most `running + max_waiting` are held, where `running` is what the engine decodes at once (its max_sequences); past
that a call gets 429 with `Retry-After` (TGI and vLLM's router do the same), and a single call that alone asks for
more (a prompt list times `n`) gets 400, since waiting would never help. A request whose first token has not come
`queue_timeout` seconds after it arrived gets 503 `queue_timeout`; one still running `request_timeout` seconds after
it arrived gets 504 `request_timeout` (in a stream: an error event, then `[DONE]`). While shutting down, new calls get
503 `shutting_down` and those in flight finish (up to the shutdown timeout, after which they are cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import APIError

DEFAULT_MAX_WAITING = 256
DEFAULT_QUEUE_TIMEOUT = 120.0
DEFAULT_REQUEST_TIMEOUT = 600.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


@dataclass(frozen=True)
class Limits:
    """`max_waiting`: engine requests allowed to wait beyond those running; timeouts in seconds, 0 for none."""

    max_waiting: int = DEFAULT_MAX_WAITING
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    retry_after: int = 1  # seconds, in the Retry-After header of a 429/503

    def __post_init__(self):
        for name in ("max_waiting", "queue_timeout", "request_timeout", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def max_running(engine) -> int:
    """Requests the engine decodes at once."""
    return engine.max_sequences


class Admission:
    """The server's count of engine requests held (all on the event loop: no lock needed)."""

    def __init__(self, limits: Limits, running: int, metrics=None):
        self.limits, self.running, self.metrics = limits, running, metrics
        self.capacity = running + limits.max_waiting
        self.held = 0
        self.draining = False

    def _refuse(self, status: int, reason: str, message: str) -> APIError:
        if self.metrics is not None:
            self.metrics.rejected(reason)
        return APIError(
            status,
            message,
            code=reason,
            type="server_error" if status >= 500 else "rate_limit_error" if status == 429 else "invalid_request_error",
            headers={"retry-after": str(self.limits.retry_after)} if status in (429, 503) else None,
        )

    def enter(self, engine_problem: str | None = None) -> Ticket:
        """One unit for a call that just arrived; APIError (429, or 503 while shutting down or the engine is out)."""
        if self.draining:
            raise self._refuse(503, "shutting_down", "the server is shutting down; send the request elsewhere")
        if engine_problem:
            raise self._refuse(503, "engine_unavailable", f"the server cannot serve now ({engine_problem})")
        ticket = Ticket(self)
        ticket.resize(1)
        return ticket

    def timeout(self, kind: str) -> APIError:
        if kind == "queue":
            return self._refuse(
                503,
                "queue_timeout",
                f"the request waited more than {self.limits.queue_timeout:g} s for its first token (--queue-timeout)",
            )
        return self._refuse(
            504,
            "request_timeout",
            f"the request ran longer than {self.limits.request_timeout:g} s (--request-timeout)",
        )


class Ticket:
    """The units one HTTP call holds; `close()` gives them back (idempotent)."""

    def __init__(self, admission: Admission):
        self.admission, self.units = admission, 0

    def resize(self, units: int, param: str | None = None) -> None:
        a = self.admission
        if units > a.capacity:
            raise APIError(
                400,
                f"the request asks for {units} sequences (prompts x n); this server admits at most {a.capacity} "
                "at once",
                param=param,
                code="too_many_sequences",
            )
        if a.held - self.units + units > a.capacity:
            waiting = max(0, a.held - a.running)
            raise a._refuse(
                429,
                "queue_full",
                f"the server is at capacity ({a.held} sequences held, {waiting} of them waiting; --max-waiting "
                f"{a.limits.max_waiting}); retry after {a.limits.retry_after} s",
            )
        a.held += units - self.units
        self.units = units

    def close(self) -> None:
        self.admission.held -= self.units
        self.units = 0
