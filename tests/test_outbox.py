"""serve/outbox.py: outputs made on the engine thread wait for its hand-over, then reach their event loop in the order
they were made, one wake-up per loop, and the hand-over can wait until the loop has run what they woke; outputs made on
another thread go out at once, after what was held."""

from __future__ import annotations

import asyncio
import threading
import time

from leapdecode.engine.request import RequestOutput
from leapdecode.serve import engine_thread
from leapdecode.serve.engine_thread import Interval, Streaming
from leapdecode.serve.outbox import Outbox


def drain(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> list:
    loop.run_until_complete(asyncio.sleep(0))  # run the callbacks handed over
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def test_the_holder_threads_outputs_wait_for_hand_over():
    loop = asyncio.new_event_loop()
    try:
        queue = asyncio.Queue()
        outbox = Outbox()
        outbox.holder = threading.get_ident()
        for i in range(3):
            outbox.put((loop, queue), i)
        assert outbox.held == 3 and drain(loop, queue) == []
        outbox.hand_over()
        assert outbox.held == 0
        assert drain(loop, queue) == [0, 1, 2]
    finally:
        loop.close()


def test_another_threads_output_goes_out_at_once_after_what_was_held():
    loop = asyncio.new_event_loop()
    try:
        first, second = asyncio.Queue(), asyncio.Queue()
        outbox = Outbox()
        outbox.holder = threading.get_ident()
        outbox.put((loop, first), "token")
        outbox.put((loop, second), "other")
        worker = threading.Thread(target=outbox.put, args=((loop, first), "cancelled"))
        worker.start()
        worker.join()
        assert outbox.held == 0
        assert drain(loop, first) == ["token", "cancelled"] and drain(loop, second) == ["other"]
    finally:
        loop.close()


def test_a_closed_loop_is_skipped():
    gone, live = asyncio.new_event_loop(), asyncio.new_event_loop()
    gone.close()
    try:
        queue = asyncio.Queue()
        outbox = Outbox()
        outbox.put((gone, asyncio.Queue()), "nobody waits")  # not the holder: handed over at once, and skipped
        outbox.put((live, queue), "kept")
        assert drain(live, queue) == ["kept"]
    finally:
        live.close()


def test_a_hand_over_can_wait_until_the_loop_ran_the_tasks_it_woke():
    loop = asyncio.new_event_loop()
    written = []

    async def consumer(queue):  # a stream: takes an output, writes its chunk, waits for the next
        while True:
            written.append(await queue.get())

    def run_loop():
        asyncio.set_event_loop(loop)
        loop.run_forever()

    queue = asyncio.Queue()
    task = loop.create_task(consumer(queue))
    runner = threading.Thread(target=run_loop)
    runner.start()
    try:
        outbox = Outbox()
        outbox.holder = threading.get_ident()
        outbox.put((loop, queue), "chunk")
        start = time.monotonic()
        outbox.hand_over(wait=60.0)
        assert written == ["chunk"]  # written before hand_over returned
        assert time.monotonic() - start < 30  # because the loop said so, not because the bound ran out
    finally:
        loop.call_soon_threadsafe(task.cancel)
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def test_an_interval_joins_outputs_until_enough_tokens_or_too_late(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(engine_thread.time, "perf_counter", lambda: clock[0])

    def out(ids, finished=False):
        text = "".join(f"<{t}>" for t in ids)
        return RequestOutput(7, ids, text, finished, "stop" if finished else None, 5, logprobs=[f"lp{t}" for t in ids])

    def step(seconds, ids, pace, finished=False):
        clock[0] += seconds
        return pace.due(out(ids, finished))

    pace = Interval(Streaming(3, max_delay=0.05))
    assert step(0, [1], pace).new_token_ids == [1]  # the first token at once
    assert step(0.01, [2], pace) is None
    joined = step(0.01, [3, 4], pace)  # three tokens held: out
    assert (joined.new_token_ids, joined.text, joined.logprobs) == ([2, 3, 4], "<2><3><4>", ["lp2", "lp3", "lp4"])
    assert step(0.01, [5], pace) is None
    assert step(0.05, [6], pace).new_token_ids == [5, 6]  # 60 ms after the last chunk: out, however small
    assert step(0.001, [7], pace) is None
    last = step(0.001, [], pace, finished=True)  # the end at once, with what was held
    assert last.new_token_ids == [7] and last.finished and last.finish_reason == "stop"
    strict = Interval(Streaming(3, max_delay=0.0))  # vLLM's rule: no time bound
    assert step(0, [1], strict) is not None and step(10.0, [2], strict) is None and step(10.0, [3, 4], strict)
    every = Interval(Streaming(1))
    assert step(0, [1], every).new_token_ids == [1] and step(0, [2], every).new_token_ids == [2]
