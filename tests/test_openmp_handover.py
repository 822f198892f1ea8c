"""The server builds its engine (model load, kernel calibration) in one thread and steps it in another. Each thread
that runs torch's parallel work gets an OpenMP team of its own, and the builder's idle team competed with the engine
thread's for the cores (a decode step took ~1.5 times as long through HTTP as in process). EngineThread.start gives
the builder's workers back first."""

from __future__ import annotations

import threading

import torch

from leapdecode.host import release_openmp_threads
from leapdecode.serve import engine_thread


class IdleEngine:
    has_work = False
    counters = {"step_failures": 0}

    def metrics(self) -> dict:
        return {}

    def cancel(self, request_id: int) -> None:
        pass


def test_the_engine_thread_releases_the_builder_s_openmp_team_before_it_starts(monkeypatch):
    calls = []
    monkeypatch.setattr(engine_thread, "release_openmp_threads", lambda: calls.append(threading.current_thread()))
    thread = engine_thread.EngineThread(IdleEngine()).start()
    try:
        assert calls == [threading.current_thread()]  # in the builder's thread, once
        thread.start()  # already running: nothing more
        assert len(calls) == 1
    finally:
        thread.stop()


def test_torch_computes_the_same_after_the_release():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=gen)
    before = x @ x
    assert isinstance(release_openmp_threads(), bool)
    assert torch.equal(x @ x, before)
    done = []
    worker = threading.Thread(target=lambda: done.append(torch.equal(x @ x, before)))
    worker.start()
    worker.join()
    assert done == [True]
