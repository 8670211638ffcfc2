"""A broker running inside this process, on its own event-loop thread.

For ``lockmq demo`` and the end-to-end tests (``lockmq.testing.BrokerThread``): start
a real :class:`lockmq.broker.server.Broker` on a background thread (uvloop when
installed), talk to it over real TCP on 127.0.0.1, stop it, start it again on the
same port and data directory (a broker restart). It lives with the broker, not in
the client library: a client never needs the broker's code.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from lockmq.client.sync import new_event_loop
from lockmq.clock import SYSTEM_CLOCK, Clock
from lockmq.config import load_config



class EmbeddedBroker:
    """A real broker on a background thread.

    Args:
        data_dir: where the broker keeps its files.
        port: TCP port (0 = any free port; read :attr:`port` after :meth:`start`).
        auth: ``"off"`` (default here: tests and demos) or ``"required"``.
        overrides: extra config tables, e.g. ``{"consumers": {"time_scale": 0.01}}``.
        log_level: the broker's log level.
        uvloop: run the broker on uvloop when installed (else the asyncio loop).
        clock: the broker's :mod:`lockmq.clock` (a ``ManualClock`` for time-scale tests).
    """

    def __init__(self, data_dir: str, port: int = 0, auth: str = "off",
                 overrides: dict[str, dict[str, Any]] | None = None,
                 log_level: str = "WARNING", uvloop: bool = True,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.port = port
        self.auth = auth
        self.overrides = overrides or {}
        self.log_level = log_level
        self.uvloop = uvloop
        self.broker: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def config(self) -> Any:
        """The broker :class:`lockmq.config.Config` this instance runs with."""
        tables: dict[str, dict[str, Any]] = {
            "broker": {"host": "127.0.0.1", "port": self.port, "data_dir": self.data_dir,
                       "auth": self.auth, "status_port": 0, "log_level": self.log_level},
            "store": {"min_free_bytes": 0},
        }
        for name, table in self.overrides.items():
            tables.setdefault(name, {}).update(table)
        return load_config(None, tables)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "EmbeddedBroker":
        """Start the broker and return once it listens."""
        # (imported here, not at the top: the test harness -- and lockmq.hil through
        # it -- must import where the broker's own dependency, prometheus_client, is
        # not installed; tests/packaging installs the bare wheel to hold that)
        from .server import Broker

        cfg = self.config()
        loop = new_event_loop() if self.uvloop else asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            asyncio.set_event_loop(loop)

            async def boot() -> None:
                try:
                    self.broker = Broker(cfg, clock=self.clock)
                    await self.broker.start()
                    self.port = self.broker.port
                except BaseException as exc:  # noqa: BLE001 - reported to start()
                    errors.append(exc)
                finally:
                    ready.set()

            loop.run_until_complete(boot())
            if not errors:
                loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="lockmq-broker", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("broker did not start in time")
        if errors:
            self._thread.join(5)
            raise errors[0]
        return self

    def run(self, coro: Any, timeout: float | None = 30.0) -> Any:
        """Run a coroutine on the broker's loop (e.g. to read its state)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (as on SIGTERM), then end the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.broker.stop(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            self._loop = None
            self._thread = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
