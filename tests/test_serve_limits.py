"""The server's limits (issue 34, items 1 and 2): the admission bound (429 with Retry-After, counted), the queue and
request timeouts, /health and fail-fast when the engine thread is dead or failing, graceful and bounded shutdown,
and streams that keep flowing while a 4 MiB prompt is tokenized. Each test builds the small server it needs on the
tiny local model; engine steps are slowed down where a request must stay in flight, and nothing asserts a duration:
the checks are on order (what happened while what) and on counts."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.models import resolve_model
from leapdecode.serve import engine_thread
from leapdecode.serve.admission import Limits
from leapdecode.serve.app import create_app
from leapdecode.serve.server import BackgroundServer

LONG_RUNNER = "w1 w7"  # raw, greedy: no end of sequence for 150 tokens on this model (see test_serve.py)
BODY = {"model": "tiny", "prompt": LONG_RUNNER, "max_tokens": 150, "temperature": 0, "stop": ["never-there"]}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("limits") / "tiny", context=160)))


class Served:
    """A server on its own engine, with slowed steps; `with Served(target, ...) as s:` s.url, s.state, s.slow(x)."""

    def __init__(self, target, max_sequences=4, drafter="prompt-lookup", **limits):
        self.engine = Engine(target, drafter=drafter, max_sequences=max_sequences)
        self.app = create_app(
            self.engine, served_model_name="tiny", limits=Limits(**limits), max_body_bytes=8 * 1024 * 1024
        )
        self.state = self.app.state.server
        self.server = BackgroundServer(self.app)
        self._step = self.engine.step
        self.delay = 0.0

    def _slowed(self):
        time.sleep(self.delay)
        return self._step()

    def slow(self, seconds: float) -> None:
        self.delay = seconds
        self.engine.step = self._slowed if seconds else self._step

    def __enter__(self):
        self.url = self.server.__enter__()
        return self

    def __exit__(self, *exc):
        self.slow(0)
        self.server.__exit__(*exc)
        self.state.close()


def metric(url: str, name: str, **labels) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(condition, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def idle(state) -> bool:
    snap = state.thread.snapshot
    return snap["running"] == 0 and snap["waiting"] == 0 and state.thread.in_flight == 0 and state.admission.held == 0


def error_of(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["message"] and set(error) == {"message", "type", "param", "code"}
    return error


# ---- admission ------------------------------------------------------------------------------------------------------


def test_admission_bound_answers_429_with_retry_after_and_counts_it(target):
    with Served(target, max_sequences=1, max_waiting=1) as s:  # room for 2 sequences: 1 running, 1 waiting
        s.slow(0.05)

        async def scenario():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                amplified = await client.post("/v1/completions", json={**BODY, "prompt": ["w1", "w2"], "n": 2})
                held = [asyncio.ensure_future(client.post("/v1/completions", json=BODY)) for _ in range(2)]
                await asyncio.to_thread(wait_for, lambda: s.state.admission.held == 2, 30, "2 held")
                over = await client.post("/v1/completions", json={**BODY, "max_tokens": 2})
                for task in held:
                    task.cancel()
                await asyncio.gather(*held, return_exceptions=True)
                return over, amplified

        over, amplified = asyncio.run(scenario())
        error = error_of(over, 429, "queue_full")
        assert over.headers["retry-after"] == "1"
        assert "--max-waiting" in error["message"]
        # one body asking for more sequences than the server ever admits: a 400 naming n, not a 429 to retry
        assert error_of(amplified, 400, "too_many_sequences")["param"] == "n"
        wait_for(lambda: idle(s.state), what="idle")
        assert metric(s.url, "leapdecode:requests_rejected_total", reason="queue_full") == 1
        assert metric(s.url, "leapdecode:http_requests_total", endpoint="/v1/completions", status="429") == 1
        s.slow(0)
        ok = httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 3}, timeout=30)
        assert ok.status_code == 200


def test_queue_timeout_fails_a_waiting_request_and_cancels_it(target):
    with Served(target, max_sequences=1, queue_timeout=0.5) as s:
        s.slow(0.05)

        async def scenario():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                first = asyncio.ensure_future(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(wait_for, lambda: s.state.thread.snapshot["running"] == 1, 30, "running")
                second = await client.post("/v1/completions", json={**BODY, "stream": True})
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
                return second

        second = asyncio.run(scenario())
        error = error_of(second, 503, "queue_timeout")  # a real status: a stream's headers wait for its first token
        assert "--queue-timeout" in error["message"] and second.headers["retry-after"]
        wait_for(lambda: idle(s.state), what="idle")
        assert s.state.thread.snapshot["kv_tokens"] == 0
        assert metric(s.url, "leapdecode:requests_rejected_total", reason="queue_timeout") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_request_timeout_bounds_a_whole_request(target, stream):
    with Served(target, request_timeout=0.6) as s:
        s.slow(0.05)  # 150 tokens need more than 0.6 s at this pace, drafts or not
        if stream:
            with httpx.stream("POST", s.url + "/v1/completions", json={**BODY, "stream": True}, timeout=30) as r:
                assert r.status_code == 200
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and '"request_timeout"' in events[-2]
        else:
            error_of(httpx.post(s.url + "/v1/completions", json=BODY, timeout=30), 504, "request_timeout")
        wait_for(lambda: idle(s.state), what="idle")
        assert metric(s.url, "leapdecode:requests_rejected_total", reason="request_timeout") == 1


# ---- health and fail-fast -------------------------------------------------------------------------------------------


class _Crash(BaseException):
    """Not an Exception: the engine thread's step guard does not catch it, so the thread ends."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_thread_fails_requests_fast_and_health_says_503(target):
    with Served(target) as s:
        s.slow(0.05)

        async def scenario():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                pending = asyncio.ensure_future(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(wait_for, lambda: s.state.thread.in_flight == 1, 30, "in flight")

                def crash():
                    raise _Crash()

                s.engine.step = crash
                return await pending

        r = asyncio.run(scenario())
        error_of(r, 503, "engine_unavailable")  # the request in flight is answered, not left hanging
        wait_for(lambda: not s.state.thread.alive, what="thread end")
        health = httpx.get(s.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "engine thread stopped"
        r = httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 2}, timeout=30)
        assert error_of(r, 503, "engine_unavailable")
        assert r.headers["retry-after"]


def test_a_failing_engine_turns_health_503_refuses_then_recovers(target, monkeypatch):
    with Served(target) as s:
        step = s.engine.step

        def broken():
            raise RuntimeError("planted")

        s.engine.step = broken
        for _ in range(engine_thread.FAILING_AFTER):
            error_of(
                httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 2}, timeout=30), 500, "engine_error"
            )
        health = httpx.get(s.url + "/health")
        assert health.status_code == 503 and health.json()["status"].startswith("engine failing")
        # within the cooldown: refused at once, nothing queued
        error_of(
            httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 2}, timeout=30), 503, "engine_unavailable"
        )
        assert s.state.thread.in_flight == 0
        # after it, a request probes the engine; one good step makes it healthy again
        s.engine.step = step
        monkeypatch.setattr(engine_thread, "COOLDOWN_SECONDS", 0.0)
        assert httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 2}, timeout=30).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200


# ---- shutdown -------------------------------------------------------------------------------------------------------


def test_graceful_shutdown_drains_then_stops(target):
    ref = generate(target, LONG_RUNNER, drafter="none", max_new_tokens=40, raw=True).text
    s = Served(target, shutdown_timeout=30).__enter__()
    try:
        s.slow(0.03)
        lines: list[str] = []
        reading = threading.Event()

        def stream():
            body = {**BODY, "max_tokens": 40, "stream": True}
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    reading.set()
                    lines.append(line)

        reader = threading.Thread(target=stream)
        reader.start()
        assert reading.wait(30)
        s.state.begin_drain()  # what SIGTERM does first; uvicorn then waits for the stream
        refused = httpx.post(s.url + "/v1/completions", json={**BODY, "max_tokens": 2}, timeout=30)
        error_of(refused, 503, "shutting_down")
        assert httpx.get(s.url + "/health").status_code == 503
        s.server.shutdown()
        reader.join(60)
        assert not s.server.thread.is_alive()
        import json

        chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks) == ref  # the stream in flight finished whole
        assert lines[-1] == "" or "[DONE]" in "".join(lines[-2:])
    finally:
        s.slow(0)
        s.state.close()


def test_shutdown_timeout_cancels_what_is_left(target):
    s = Served(target, shutdown_timeout=0.3).__enter__()
    try:
        s.slow(0.05)
        reading = threading.Event()
        done = []

        def stream():
            try:
                with httpx.stream("POST", s.url + "/v1/completions", json={**BODY, "stream": True}, timeout=60) as r:
                    for _ in r.iter_lines():
                        reading.set()
            except httpx.HTTPError:
                pass
            done.append(True)

        reader = threading.Thread(target=stream)
        reader.start()
        assert reading.wait(30)
        s.server.shutdown()
        assert not s.server.thread.is_alive()  # it did not wait for the 150 tokens
        reader.join(30)
        assert done
        wait_for(lambda: not s.state.thread.alive, what="engine thread stop")
        assert s.state.thread.in_flight == 0
    finally:
        s.slow(0)
        s.state.close()


# ---- tokenizing off the event loop ----------------------------------------------------------------------------------


def test_streams_keep_flowing_while_a_4mib_prompt_is_tokenized(target):
    with Served(target, drafter="none") as s:
        pool = s.state.tokenizers
        assert pool.copies and all(tok is not s.engine.tokenizer for tok in pool.copies)  # its own tokenizers
        spans: list[tuple[float, float]] = []
        call = pool._call

        def timed(fn, args):
            start = time.perf_counter()
            try:
                return call(fn, args)
            finally:
                spans.append((start, time.perf_counter()))

        pool._call = timed
        s.slow(0.02)
        arrivals: list[float] = []
        done: list[bool] = []
        reading = threading.Event()

        def stream():
            body = {**BODY, "stream": True}
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.perf_counter())
                        reading.set()
                    done.append(line == "data: [DONE]")

        reader = threading.Thread(target=stream)
        reader.start()
        assert reading.wait(30)
        spans.clear()
        huge = "w1 w2 hello " * (4 * 1024 * 1024 // 12)  # 4 MiB, about a million tokens
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": huge}, timeout=120)
        error_of(r, 400, "context_length_exceeded")
        reader.join(120)
        start, end = max(spans, key=lambda span: span[1] - span[0])
        during = [t for t in arrivals if start < t < end]
        # the stream's chunks kept arriving while the prompt was being tokenized (liveness: order, not speed)
        assert len(during) >= 3, (len(during), end - start, len(arrivals))
        assert any(done)  # and the stream ran to its end
