"""Running an app under uvicorn: in the foreground (`leapdecode serve`) or in a background thread of this process
(tests, benchmarks), bound to 127.0.0.1 unless told otherwise.

Shutting down (SIGTERM, Ctrl-C, or leaving the `with` block) is graceful and bounded: the server stops accepting
connections and new requests (503 `shutting_down` on a kept-alive connection), lets the requests in flight finish for
up to the app's shutdown timeout, then cancels what is left and stops the engine thread."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _server_state(app):
    return getattr(getattr(app, "state", None), "server", None)


def check_runtime(loop: str, http: str) -> None:
    """A one-line error for an event loop or HTTP implementation that is not installed."""
    from importlib.util import find_spec

    from ..errors import require

    for name in (loop, http):
        require(
            name in ("asyncio", "h11") or find_spec(name) is not None, f"{name} is not installed: pip install {name}"
        )


def uvicorn_config(
    app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning", loop: str = "asyncio", http: str = "h11"
) -> uvicorn.Config:
    """uvicorn's settings for a leapdecode app. `loop` and `http` are uvicorn's; the default asyncio and h11 are the
    same everywhere, whatever optional speedups happen to be installed (uvloop and httptools measured no faster beside
    the engine on 2 cores: docs/serving.md)."""
    check_runtime(loop, http)
    state = _server_state(app)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop=loop,
        http=http,
        timeout_keep_alive=30,
        backlog=2048,
        timeout_graceful_shutdown=state.limits.shutdown_timeout if state is not None else None,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling a leapdecode app to stop admitting the moment shutdown begins (uvicorn itself only
    tells the app after the requests in flight are done)."""

    async def shutdown(self, sockets=None) -> None:
        state = _server_state(self.config.app)
        if state is not None:
            state.begin_drain()
        await super().shutdown(sockets)


class BackgroundServer:
    """`with BackgroundServer(app) as url:` serves `app` on a free port of 127.0.0.1 in a thread, for the block."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning", **config):
        self.host, self.port = host, port or free_port(host)
        self.server = DrainingServer(uvicorn_config(app, self.host, self.port, log_level, **config))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self, wait: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(wait)
