"""A small blocking lockmq client for the security tests: locks and services.

Independent of ``lockmq.client`` on purpose: the tests speak the protocol itself
(and can send what a well-behaved client never would).
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from typing import Any

from lockmq.protocol import (Auth, AuthMethod, Challenge, Connect, ErrorReply, Flag,
                             FrameDecoder, Op, Publish, Role, auth_proof, decode_body,
                             encode_frame)

TIMEOUT = 15.0


class Refused(Exception):
    """The broker answered ERROR (``code``, ``message``) or closed the connection."""

    def __init__(self, err: ErrorReply | None) -> None:
        super().__init__(f"ERROR {err.code}: {err.message}" if err else "connection closed")
        self.err = err
        self.code = err.code if err else None


class Wire:
    """One connection to a broker on 127.0.0.1."""

    def __init__(self, port: int, sn: str = "", tls: ssl.SSLContext | None = None,
                 server_hostname: str = "127.0.0.1", source: str | None = None) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT,
                                       source_address=(source, 0) if source else None)
        self.sock = tls.wrap_socket(raw, server_hostname=server_hostname) if tls else raw
        self.sn = sn
        self.dec = FrameDecoder(16 * 1024 * 1024)
        self.opaque = 0
        self.pending: list[Any] = []
        self.challenge: Challenge | None = None
        self.sent_auth: bytes = b""

    def send(self, opcode: int, body: bytes, sn: str | None = None, flags: int = 0) -> int:
        self.opaque += 1
        self.sock.sendall(encode_frame(opcode, self.sn if sn is None else sn, body,
                                       self.opaque, flags))
        return self.opaque

    def read(self, timeout: float = TIMEOUT) -> Any:
        """Next frame, or None once the broker closed the connection."""
        deadline = time.monotonic() + timeout
        while True:
            f = self.dec.next_frame()
            if f is not None:
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the broker")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                return None
            if not data:
                return None
            self.dec.feed(data)

    def answer(self, opaque: int) -> Any:
        """The decoded answer to ``opaque``; :class:`Refused` on ERROR or close."""
        while True:
            f = self.read()
            if f is None:
                raise Refused(None)
            if f.opcode == Op.ERROR and (f.opaque in (opaque, 0)):
                raise Refused(decode_body(f.opcode, f.body))
            if f.flags & Flag.RESPONSE and f.opaque == opaque:
                return decode_body(f.opcode, f.body)
            self.pending.append(f)

    def request(self, opcode: int, body: bytes, sn: str | None = None) -> Any:
        return self.answer(self.send(opcode, body, sn=sn))

    def hello(self, role: int) -> Challenge:
        self.challenge = self.request(Op.CONNECT, Connect(role, 30, "sectest").encode())
        return self.challenge

    def auth_lock(self, key: bytes, role: int = Role.LOCK) -> Any:
        ch = self.hello(role)
        cnonce = os.urandom(16)
        self.sent_auth = Auth(AuthMethod.DEVICE_HMAC, cnonce,
                              auth_proof(key, ch.nonce, cnonce, self.sn)).encode()
        return self.request(Op.AUTH, self.sent_auth)

    def auth_token(self, token: str) -> Any:
        self.hello(Role.SERVICE)
        return self.request(Op.AUTH, Auth(AuthMethod.TOKEN, os.urandom(16),
                                          token.encode()).encode())

    def publish(self, topic: str, seq: int, payload: bytes = b"p" * 24,
                sn: str | None = None) -> Any:
        return self.request(Op.PUBLISH, Publish(topic, seq, int(time.time() * 1000),
                                                payload).encode(), sn=sn)

    def wait_closed(self, timeout: float = TIMEOUT) -> list[Any]:
        """Read until the broker closes; return the frames seen (decoded ERRORs)."""
        seen = []
        while True:
            f = self.read(timeout)
            if f is None:
                return seen
            seen.append(decode_body(f.opcode, f.body) if f.opcode == Op.ERROR else f)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
