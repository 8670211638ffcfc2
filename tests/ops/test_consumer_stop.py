"""``Consumer.stop()`` from another thread returns in every run (docs/consumers.md).

It once hung in about one run of three: ``run()``'s own ``finally`` and the caller
both stopped the consumer; the first stopped the event loop while the second still
waited, with no timeout, for a coroutine on it. The runs vary where the stop lands:
before the consumer connected, while it connects, while idle and while handling.
"""

from __future__ import annotations

import threading

from lockmq.client import Consumer, Producer
from lockmq.client.errors import ClientClosed

RUNS = 200
#: a hang guard only (a healthy stop takes milliseconds), not a speed check
HANG_S = 30.0


def test_stop_from_another_thread_returns_every_time(broker_process):
    handled = []
    with Producer(broker_process.address, producer_id="stop-test") as p:
        for i in range(RUNS):
            p.send_sync("stop.topic", b"m%d" % i)

    for i in range(RUNS):
        c = Consumer(broker_process.address, topic="stop.topic", cluster="stoppers",
                     handler=handled.append, backlog_poll_s=0, long_poll_ms=50)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                c.run()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        # Where the stop lands varies with i: at once (before or during connect),
        # or after the consumer had time to join and take a message.
        if i % 4 == 1:
            c.consumer  # noqa: B018 - a touch of the object, no wait
        elif i % 4 == 2:
            threading.Event().wait(0.002)
        elif i % 4 == 3:
            threading.Event().wait(0.02)
        stopper = threading.Thread(target=c.stop, daemon=True)
        stopper.start()
        stopper.join(HANG_S)
        assert not stopper.is_alive(), f"run {i}: stop() hung"
        t.join(HANG_S)
        assert not t.is_alive(), f"run {i}: run() did not return after stop()"
        assert not errors, f"run {i}: run() raised {errors[0]!r}"
    assert handled, "no run consumed anything"


def test_stop_twice_and_start_after_stop(broker_process):
    c = Consumer(broker_process.address, topic="stop.topic", cluster="again",
                 handler=lambda m: None, backlog_poll_s=0)
    c.start()
    c.stop()
    c.stop()   # a second stop is a no-op
    try:
        c.start()
    except ClientClosed:
        pass
    else:
        raise AssertionError("start() after stop() should refuse")


def test_stop_from_an_async_handler_on_the_loop(broker_process):
    """An async handler runs on the consumer's own loop: stop() from there starts
    the stop and returns instead of waiting on itself."""
    done = threading.Event()
    box: list[Consumer] = []

    async def handler(msg) -> None:
        box[0].stop()
        done.set()

    with Producer(broker_process.address, producer_id="stop-self") as p:
        p.send_sync("stop.self", b"x")
    c = Consumer(broker_process.address, topic="stop.self", cluster="self",
                 handler=handler, backlog_poll_s=0)
    box.append(c)
    t = threading.Thread(target=c.run, daemon=True)
    t.start()
    assert done.wait(HANG_S)
    t.join(HANG_S)
    assert not t.is_alive()
