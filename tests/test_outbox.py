"""serve/outbox.py: outputs made on the engine thread wait for the next forward, then reach their event loop in the
order they were made, one wake-up per loop; outputs made on another thread go out at once, after what was held."""

from __future__ import annotations

import asyncio
import threading

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
        assert outbox.held == 0 and outbox.handed
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
