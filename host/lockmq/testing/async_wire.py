"""The wire peer for asyncio: many connections at once (a connection storm) without a
thread each. Like :class:`~lockmq.testing.Peer`, it is independent of
:mod:`lockmq.client` and its handshake runs the protocol's ``ClientSession``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from lockmq.protocol import (AuthMethod, ClientSession, ConnectAck, Flag, FrameDecoder, Op,
                             Publish, PublishAck, Role, decode_body, encode_frame)

from .wire import TIMEOUT, Refused


class AsyncPeer:
    """One connection to a broker on 127.0.0.1; open with :meth:`open`, then log in
    (:meth:`handshake`, :meth:`auth_off`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 sn: str, timeout: float) -> None:
        self.reader = reader
        self.writer = writer
        self.sn = sn
        self.timeout = timeout
        self.dec = FrameDecoder(16 * 1024 * 1024)
        self.opaque = 0
        self.unsolicited: list[Any] = []

    @classmethod
    async def open(cls, port: int, sn: str = "", timeout: float = TIMEOUT,
                   source: str | None = None) -> "AsyncPeer":
        """Connect (no login yet), from the local address ``source`` if given."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=(source, 0) if source else None)
        return cls(reader, writer, sn, timeout)

    def next_opaque(self) -> int:
        self.opaque += 1
        return self.opaque

    async def read(self) -> Any:
        """The next frame from the broker; :class:`Refused` (code None) once it closed."""
        while True:
            f = self.dec.next_frame()
            if f is not None:
                return f
            data = await asyncio.wait_for(self.reader.read(65536), self.timeout)
            if not data:
                raise Refused(None)
            self.dec.feed(data)

    async def answer_frame(self, opaque: int) -> Any:
        """The frame answering ``opaque`` (pushes are kept in ``unsolicited``);
        :class:`Refused` on its ERROR or a close."""
        while True:
            f = await self.read()
            if f.opcode == Op.ERROR and f.opaque in (opaque, 0):
                raise Refused(decode_body(f.opcode, f.body))
            if f.flags & Flag.RESPONSE and f.opaque == opaque:
                return f
            self.unsolicited.append(f)

    async def request(self, opcode: int, body: bytes) -> Any:
        """Send one frame and return the decoded answer."""
        opaque = self.next_opaque()
        self.writer.write(encode_frame(opcode, self.sn, body, opaque))
        f = await self.answer_frame(opaque)
        return decode_body(f.opcode, f.body)

    async def handshake(self, role: int, method: int, secret: bytes) -> ConnectAck:
        """CONNECT, CHALLENGE, AUTH, CONNECT_ACK through the protocol's ClientSession."""
        session = ClientSession(role, self.sn, method, secret, "test")
        opaque = self.next_opaque()
        self.writer.write(session.connect_frame(opaque))
        challenge = await self.answer_frame(opaque)
        opaque = self.next_opaque()
        self.writer.write(session.receive(challenge, os.urandom(16), opaque))
        session.receive(await self.answer_frame(opaque))
        return session.ack

    async def auth_off(self, role: int = Role.SERVICE) -> ConnectAck:
        """Log in to a broker with ``auth = "off"`` (any credentials pass)."""
        if role == Role.LOCK:
            return await self.handshake(role, AuthMethod.DEVICE_HMAC, b"\x00" * 32)
        return await self.handshake(role, AuthMethod.TOKEN, b"x")

    async def publish(self, topic: str, seq: int, payload: bytes = b"p" * 24) -> PublishAck:
        return await self.request(Op.PUBLISH, Publish(topic, seq, int(time.time() * 1000),
                                                      payload).encode())

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


async def open_async_peer(port: int, sn: str = "svc", role: int = Role.SERVICE,
                          **kw: Any) -> AsyncPeer:
    """An :class:`AsyncPeer` logged in to a broker with ``auth = "off"``."""
    peer = await AsyncPeer.open(port, sn, **kw)
    await peer.auth_off(role)
    return peer
