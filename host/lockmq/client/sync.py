"""Blocking flavour of the client: the asyncio clients on a background loop thread.

:class:`Producer` and :class:`Consumer` own one event-loop thread each (uvloop when
installed). Calls from any thread are handed to that loop; blocking calls wait for
the answer, ``send_async`` returns a :class:`concurrent.futures.Future`. A consumer
with a plain-function handler runs it in a thread pool sized by its autoscaler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Callable, Coroutine, TypeVar

from .consumer import AsyncConsumer, Handler
from .errors import ClientClosed
from .producer import AsyncProducer, CommandOutcome, SendResult
from .session import Endpoint

T = TypeVar("T")

#: what Consumer.stop() allows beyond its drain timeout (unsubscribe, close)
_STOP_GRACE_S = 5.0
#: how often a blocking call waiting on the loop checks that the loop still runs
_POLL_S = 0.5


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - depends on the install
        return asyncio.new_event_loop()


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future:
        """Schedule ``coro`` on the loop; return a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (up to ``timeout``).

        Raises :class:`ClientClosed` when the loop stops before ``coro`` finished (a
        future left on a stopped loop never resolves: waiting on it would hang).
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking client call from its own event-loop thread "
                               "would wait forever")
        try:
            fut = self.submit(coro)
        except RuntimeError:   # the loop is closed
            coro.close()
            raise ClientClosed("client is closed") from None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _POLL_S if deadline is None else deadline - time.monotonic()
            wait = min(_POLL_S, max(0.0, left))
            try:
                return fut.result(wait)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive() or not self.loop.is_running():
                    fut.cancel()
                    raise ClientClosed("client is closed (its event loop stopped)") from None
                if deadline is not None and time.monotonic() >= deadline:
                    fut.cancel()
                    raise

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run a plain function on the loop thread and return its result."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout)

    def stop(self) -> None:
        """Stop the loop and join the thread (idempotent, from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:   # already closed
            return
        if threading.current_thread() is self._thread:
            return   # the loop stops after this callback; nobody joins its own thread
        self._thread.join(10)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class Producer:
    """Blocking producer with RocketMQ's three send modes.

    Takes the same keyword arguments as :class:`AsyncProducer`; connects at once.

    * :meth:`send_sync` waits for the broker's ack and returns a :class:`SendResult`;
    * :meth:`send_async` returns a ``concurrent.futures.Future`` (optional callback);
    * :meth:`send_oneway` asks for no ack.
    """

    def __init__(self, endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800",
                 **kwargs: Any) -> None:
        self._lt = _LoopThread("lockmq-producer")

        async def make() -> AsyncProducer:
            p = AsyncProducer(endpoint, **kwargs)
            await p.connect()
            return p

        try:
            self._p: AsyncProducer = self._lt.run(make())
        except BaseException:
            self._lt.stop()
            raise

    @property
    def producer_id(self) -> str:
        """The SN field of this producer's messages."""
        return self._p.producer_id

    @property
    def stats(self) -> dict[str, int]:
        """Counters: sent, acked, duplicates, busy_retries, retransmits, failed, oneway."""
        return dict(self._p.stats)

    def send_sync(self, topic: str, payload: bytes, lock_ts_ms: int = 0,
                  timeout: float | None = None, **when: Any) -> SendResult:
        """Publish and wait for the ack; ``deliver_at=`` / ``delay=`` / ``level=``
        schedule it (``AsyncProducer.send_async``)."""
        return self._lt.run(self._p.send(topic, payload, lock_ts_ms, **when), timeout)

    def schedule_command(self, target: str, kind: int, args: bytes = b"", **when: Any) -> int:
        """A command for ``target`` at ``not_before=`` (``AsyncProducer.schedule_command``);
        returns its schedule id."""
        return self._lt.run(self._p.schedule_command(target, kind, args, **when))

    def cancel_scheduled(self, schedule_id: int) -> None:
        """Cancel a waiting scheduled message or command."""
        self._lt.run(self._p.cancel_scheduled(schedule_id))

    def send_async(
        self,
        topic: str,
        payload: bytes,
        lock_ts_ms: int = 0,
        callback: Callable[[concurrent.futures.Future], None] | None = None,
    ) -> concurrent.futures.Future:
        """Publish without waiting; the future resolves with the :class:`SendResult`."""
        cf: concurrent.futures.Future = concurrent.futures.Future()
        if callback is not None:
            cf.add_done_callback(callback)

        def start() -> None:
            try:
                fut = self._p.send_async(topic, payload, lock_ts_ms)
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                cf.set_exception(exc)
                return

            def done(f: asyncio.Future) -> None:
                if f.cancelled():
                    cf.cancel()
                elif f.exception() is not None:
                    cf.set_exception(f.exception())  # type: ignore[arg-type]
                else:
                    cf.set_result(f.result())

            fut.add_done_callback(done)

        self._lt.loop.call_soon_threadsafe(start)
        return cf

    def send_oneway(self, topic: str, payload: bytes, lock_ts_ms: int = 0) -> None:
        """Publish without an ack (lost if the link drops first)."""
        self._lt.call(lambda: self._p.send_oneway(topic, payload, lock_ts_ms))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is acknowledged or failed."""
        self._lt.run(self._p.flush(timeout))

    def command(self, target: str, kind: int, args: bytes = b"", expires_in_s: float = 60.0,
                timeout_s: float | None = None) -> CommandOutcome:
        """Send a downlink command to a lock and wait for its answer."""
        return self._lt.run(self._p.command(target, kind, args, expires_in_s, timeout_s))

    def close(self, flush_timeout: float | None = 10.0) -> None:
        """Wait for in-flight acks (up to ``flush_timeout``), then disconnect."""
        try:
            self._lt.run(self._p.close(flush_timeout))
        finally:
            self._lt.stop()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """Blocking consumer-cluster member; takes the keyword arguments of
    :class:`AsyncConsumer` (``topic``, ``cluster``, ``handler``, ...).

    ``handler(msg)`` runs in a worker thread; return = ack, raise = nack.
    :meth:`run` blocks until :meth:`stop` (from another thread or a signal handler)
    or ``duration_s``; :meth:`start` returns at once.
    """

    def __init__(self, endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800", *,
                 handler: Handler,
                 **kwargs: Any) -> None:
        self._setup("lockmq-consumer", lambda: AsyncConsumer(endpoint, handler=handler, **kwargs))

    def _setup(self, thread_name: str, make: Callable[[], Any]) -> None:
        """Start the loop thread and build the asyncio consumer ``make()`` on it (what
        ``CampusConsumer`` shares)."""
        self._lt = _LoopThread(thread_name)
        self._stop = threading.Event()
        self._started = False
        # stop() may come from several threads at once (run()'s own finally and the
        # caller's): one of them stops the consumer and the loop, the others wait
        # for that. Two stops racing once left one waiting on a stopped loop forever.
        self._stop_lock = threading.Lock()
        self._stopping = False
        self._stopped = threading.Event()

        async def build() -> Any:
            return make()

        try:
            self._c: AsyncConsumer = self._lt.run(build())
        except BaseException:   # a bad argument: no loop thread left behind
            self._lt.stop()
            raise

    @property
    def stats(self) -> dict[str, int]:
        """Counters: received, acked, nacked, dropped_leases, ack_errors, pulls, notifies."""
        return dict(self._c.stats)

    @property
    def workers(self) -> int:
        """Worker count right now."""
        return self._c.workers

    @property
    def consumer(self) -> AsyncConsumer:
        """The underlying asyncio consumer."""
        return self._c

    def start(self) -> None:
        """Connect, join the cluster, start consuming in the background.

        Raises :class:`ClientClosed` when :meth:`stop` was called first (or while
        connecting)."""
        if self._stop.is_set():
            raise ClientClosed("consumer is stopped")
        try:
            self._lt.run(self._c.start())
        except concurrent.futures.CancelledError:
            raise ClientClosed("consumer stopped while connecting") from None
        self._started = True

    def run(self, duration_s: float | None = None) -> None:
        """Start and block until :meth:`stop` or ``duration_s`` seconds."""
        try:
            if not self._started:
                self.start()
            self._stop.wait(duration_s)
        except ClientClosed:
            if not self._stop.is_set():
                raise   # closed by something else than stop()
        finally:
            self.stop()

    def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Finish the messages being handled (up to ``drain_timeout_s``), leave the
        cluster, stop the loop. Safe from any thread and more than once: a second
        caller waits for the first to finish. From a handler running on the loop
        (an async handler) it starts the stop and returns."""
        self._stop.set()
        with self._stop_lock:
            first, self._stopping = not self._stopping, True
        if not first:
            self._stopped.wait(drain_timeout_s + _STOP_GRACE_S)
            return
        if threading.current_thread() is self._lt._thread:
            # Blocking here would stop the loop under our own feet: let it run the stop.
            task = self._lt.loop.create_task(self._c.stop(drain_timeout_s))
            task.add_done_callback(lambda _t: (self._lt.stop(), self._stopped.set()))
            return
        try:
            self._lt.run(self._c.stop(drain_timeout_s), drain_timeout_s + _STOP_GRACE_S)
        except (ClientClosed, concurrent.futures.TimeoutError):
            pass   # the loop is gone or the stop hung: stop the loop regardless
        finally:
            self._lt.stop()
            self._stopped.set()

    def __enter__(self) -> "Consumer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
