"""One TCP connection to a broker, driving the sans-IO frame codec.

:class:`FrameConnection` is an :class:`asyncio.Protocol`: bytes go into a
:class:`~lockmq.protocol.FrameDecoder`, every whole frame in a read is handled
before the next read, answers (the RESPONSE flag, or an ERROR carrying a pending
request's opaque) resolve that request's future, and everything else (NOTIFY,
COMMAND, ...) goes to ``on_frame``. Outgoing frames are gathered and written once
per event-loop turn, so a burst of sends costs one ``send()`` system call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from lockmq.protocol import Flag, FrameDecoder, Op, encode_frame
from lockmq.protocol import ProtocolError

from .errors import ConnectionLost

log = logging.getLogger("lockmq.client")

FrameHandler = Callable[["object"], None]


class FrameConnection(asyncio.Protocol):
    """The frame layer of one connection.

    Args:
        sn: the SN field put on every outgoing frame (lock SN or producer id).
        max_frame: largest frame accepted from the broker.
        on_frame: called with every frame that answers no pending request.
        on_lost: called once with the exception (or None) when the connection ends.
    """

    def __init__(
        self,
        sn: str,
        max_frame: int,
        on_frame: Callable[[object], None] | None = None,
        on_lost: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self.sn = sn
        self.sn_bytes = sn.encode()
        self.decoder = FrameDecoder(max_frame)
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self._next_opaque = 0
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost_called = False
        #: frames received after CONNECT_ACK, held until dispatch_early() (open_session)
        self.early_frames: list = []
        self.holding = False
        self.closed = asyncio.get_running_loop().create_future()
        self.loop = asyncio.get_running_loop()

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        try:
            decoder.feed(data)
        except ProtocolError as exc:
            self._abort(exc)
            return
        while True:
            try:
                frame = decoder.next_frame()
            except ProtocolError as exc:
                if getattr(exc, "fatal", True):
                    self._abort(exc)
                    return
                log.warning("skipped a frame: %s", exc)
                continue
            if frame is None:
                return
            opaque = frame.opaque
            if opaque and (frame.flags & Flag.RESPONSE or frame.opcode == Op.ERROR):
                fut = self.pending.pop(opaque, None)
                if fut is not None:
                    if not fut.done():
                        fut.set_result(frame)
                    continue
            if self.holding:
                self.early_frames.append(frame)
            elif self.on_frame is not None:
                try:
                    self.on_frame(frame)
                except Exception:  # noqa: BLE001 - a handler bug must not kill the link
                    log.exception("frame handler failed on %r", frame)

    def dispatch_early(self) -> None:
        """Stop holding frames; hand those that arrived since CONNECT_ACK to
        ``on_frame`` (the caller is now ready for them)."""
        self.holding = False
        early, self.early_frames = self.early_frames, []
        for frame in early:
            if self.on_frame is not None:
                try:
                    self.on_frame(frame)
                except Exception:  # noqa: BLE001 - a handler bug must not kill the link
                    log.exception("frame handler failed on %r", frame)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        err = ConnectionLost(f"connection lost: {exc}" if exc else "connection closed")
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # an abandoned request (e.g. a parked PULL) is not an error
        self._writable.set()
        if not self.closed.done():
            self.closed.set_result(exc)
        if not self._lost_called:
            self._lost_called = True
            if self.on_lost is not None:
                self.on_lost(exc)

    # -- sending -----------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """Whether the transport is still open."""
        return self.transport is not None and not self.transport.is_closing()

    def new_opaque(self) -> int:
        """A fresh non-zero request id (wraps at 2**32)."""
        self._next_opaque = (self._next_opaque % 0xFFFFFFFF) + 1
        return self._next_opaque

    def send(self, opcode: int, body: bytes = b"", opaque: int = 0, flags: int = 0) -> None:
        """Queue one frame; it is written at the end of this event-loop turn."""
        if self.transport is None:
            raise ConnectionLost("not connected")
        self._out.append(encode_frame(opcode, self.sn_bytes, body, opaque, flags))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def send_bytes(self, data: bytes) -> None:
        """Queue bytes already encoded as frames (the session's handshake frames)."""
        if self.transport is None:
            raise ConnectionLost("not connected")
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def request(
        self, opcode: int, body: bytes = b"", flags: int = 0, opaque: int = 0
    ) -> asyncio.Future:
        """Send a request; the future resolves with the answering frame.

        The answer may be an ERROR frame: callers turn it into an exception.
        """
        opaque = opaque or self.new_opaque()
        fut = self.loop.create_future()
        self.pending[opaque] = fut
        try:
            self.send(opcode, body, opaque, flags)
        except BaseException:
            self.pending.pop(opaque, None)
            raise
        return fut

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        await self._writable.wait()

    def close(self) -> None:
        """Flush what is queued and close the socket."""
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def _abort(self, exc: BaseException) -> None:
        log.warning("closing connection: %s", exc)
        if self.transport is not None:
            self.transport.abort()
