"""A fault-injecting TCP proxy between boards and the broker.

Boards are configured with the proxy's address; the proxy forwards to the
broker. The test then breaks the network on demand:

=============  ==============================================================
``drop()``     every byte in both directions is silently discarded; the
               connections stay open (the board sees only timeouts)
``stall()``    nothing is forwarded but nothing is lost: bytes pile up and are
               delivered on ``restore()``
``slow()``     each chunk is delayed ``delay_s`` and the rate capped
``reset()``    every open connection is aborted with a TCP RST, once
``cut()``      open connections are reset and new ones refused (RST) until
               ``restore()``: the broker is unreachable
``restore()``  back to faithful forwarding
=============  ==============================================================

It runs its own asyncio loop in a daemon thread; every method is thread-safe and
can be called from a test. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

PASS, DROP, STALL, SLOW, CUT = "pass", "drop", "stall", "slow", "cut"


@dataclass
class ProxyStats:
    """Counters since the proxy started."""

    accepted: int = 0
    refused: int = 0
    resets: int = 0
    up_bytes: int = 0  # board -> broker, forwarded
    down_bytes: int = 0  # broker -> board, forwarded
    dropped_bytes: int = 0
    upstream_failures: int = 0
    open: set[Any] = field(default_factory=set)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (linger 0), not FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class FaultProxy:
    """Forward 127.0.0.1:<port> to ``upstream`` and inject faults on demand."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self._want_port = port
        self.port = 0
        self.mode = PASS
        self.delay_s = 0.0
        self.rate_bps: float | None = None
        self.stats = ProxyStats()
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Event | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    # -- life cycle ---------------------------------------------------------------
    def start(self) -> "FaultProxy":
        """Start listening; returns self (``port`` is then set)."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self._want_port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> tuple[str, int]:
        """Where boards should connect."""
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        """Abort every connection and stop."""
        if not self._thread.is_alive():
            return

        async def _close() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self.stats.open):
                _abort(w)
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(_close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults -------------------------------------------------------------------
    def _set(self, mode: str, abort_open: bool = False) -> None:
        def apply() -> None:
            self.mode = mode
            if abort_open:
                for w in list(self.stats.open):
                    _abort(w)
                    self.stats.resets += 1
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()

        fut: "asyncio.Future[None]" = asyncio.run_coroutine_threadsafe(_call(apply), self._loop)
        fut.result(10)

    def drop(self) -> None:
        """Silently discard all traffic; connections stay open."""
        self._set(DROP)

    def stall(self) -> None:
        """Hold all traffic (delivered on restore)."""
        self._set(STALL)

    def slow(self, delay_s: float = 0.2, rate_bps: float | None = None) -> None:
        """Delay every chunk by ``delay_s`` and cap each direction at ``rate_bps`` bytes/s."""
        self.delay_s, self.rate_bps = delay_s, rate_bps
        self._set(SLOW)

    def reset(self) -> None:
        """Abort every open connection with a TCP RST (new ones still pass)."""
        self._set(self.mode if self.mode != CUT else PASS, abort_open=True)

    def cut(self) -> None:
        """Reset open connections and refuse new ones until ``restore()``."""
        self._set(CUT, abort_open=True)

    def restore(self) -> None:
        """Forward faithfully again."""
        self._set(PASS)

    def set_upstream(self, host: str, port: int) -> None:
        """Point new connections at another broker address."""
        self.upstream = (host, port)

    @property
    def open_connections(self) -> int:
        """Connections currently proxied."""
        return len(self.stats.open) // 2

    # -- the data path ------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == CUT:
            self.stats.refused += 1
            _abort(writer)
            return
        self.stats.accepted += 1
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5)
        except (OSError, asyncio.TimeoutError):
            self.stats.upstream_failures += 1
            _abort(writer)  # the broker is down: the board sees a reset, as if refused
            return
        if self.mode == CUT:  # cut while we were connecting upstream
            self.stats.refused += 1
            _abort(up_w)
            _abort(writer)
            return
        self.stats.open.update((writer, up_w))
        try:
            pair = (writer, up_w)
            await asyncio.gather(self._pump(reader, up_w, True, pair), self._pump(up_r, writer, False, pair))
        finally:
            self.stats.open.discard(writer)
            self.stats.open.discard(up_w)
            for w in (writer, up_w):
                if not w.transport.is_closing():
                    w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up: bool,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while True:
                while self.mode == STALL:
                    assert self._changed is not None
                    await self._changed.wait()
                data = await reader.read(65536)
                if not data:  # one side closed: close the other (no half-open links)
                    for w in pair:
                        if not w.transport.is_closing():
                            w.close()
                    return
                while self.mode == STALL:  # stalled while this chunk was in flight
                    assert self._changed is not None
                    await self._changed.wait()
                if self.mode in (DROP, CUT):
                    self.stats.dropped_bytes += len(data)
                    continue
                if self.mode == SLOW:
                    pause = self.delay_s + (len(data) / self.rate_bps if self.rate_bps else 0.0)
                    if pause > 0:
                        await asyncio.sleep(pause)
                writer.write(data)
                await writer.drain()
                if up:
                    self.stats.up_bytes += len(data)
                else:
                    self.stats.down_bytes += len(data)
        except (ConnectionError, OSError):
            for w in pair:
                _abort(w)


async def _call(fn: Any) -> None:
    fn()
