"""Running an app under uvicorn: in the foreground (`leapdecode serve`) or in a background thread of this process
(tests, benchmarks), bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> uvicorn.Config:
    # the asyncio loop and h11: the same everywhere, whatever optional speedups happen to be installed
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, loop="asyncio", http="h11", timeout_keep_alive=30, backlog=2048
    )


class BackgroundServer:
    """`with BackgroundServer(app) as url:` serves `app` on a free port of 127.0.0.1 in a thread, for the block."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"):
        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(uvicorn_config(app, self.host, self.port, log_level))
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
        self.server.should_exit = True
        self.thread.join(30)
