"""A small blocking lockmq client for the security tests: locks and services.

Independent of ``lockmq.client`` on purpose: the tests speak the protocol itself
(and can send what a well-behaved client never would). A well-behaved handshake
(:meth:`Wire.auth_lock`, :meth:`Wire.auth_token`) is driven by the protocol's
``ClientSession``, as every real client's is; :meth:`Wire.hello` and :meth:`Wire.send`
let a test break the rules on purpose.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from typing import Any, Callable

import pytest

from lockmq.protocol import (AuthMethod, Challenge, ClientSession, Connect, ErrorReply, Flag,
                             FrameDecoder, Op, Publish, Role, decode_body, encode_frame)

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

    def answer_frame(self, opaque: int) -> Any:
        """The frame answering ``opaque``; :class:`Refused` on ERROR or close."""
        while True:
            f = self.read()
            if f is None:
                raise Refused(None)
            if f.opcode == Op.ERROR and (f.opaque in (opaque, 0)):
                raise Refused(decode_body(f.opcode, f.body))
            if f.flags & Flag.RESPONSE and f.opaque == opaque:
                return f
            self.pending.append(f)

    def answer(self, opaque: int) -> Any:
        """The decoded answer to ``opaque``; :class:`Refused` on ERROR or close."""
        f = self.answer_frame(opaque)
        return decode_body(f.opcode, f.body)

    def request(self, opcode: int, body: bytes, sn: str | None = None) -> Any:
        return self.answer(self.send(opcode, body, sn=sn))

    def hello(self, role: int) -> Challenge:
        self.challenge = self.request(Op.CONNECT, Connect(role, 30, "sectest").encode())
        return self.challenge

    def _handshake(self, role: int, method: int, secret: bytes) -> Any:
        """CONNECT, CHALLENGE, AUTH, CONNECT_ACK through the protocol's ClientSession."""
        session = ClientSession(role, self.sn, method, secret, "sectest")
        self.opaque += 1
        self.sock.sendall(session.connect_frame(self.opaque))
        challenge = self.answer_frame(self.opaque)
        self.challenge = decode_body(challenge.opcode, challenge.body)
        self.opaque += 1
        auth = session.receive(challenge, os.urandom(16), self.opaque)
        dec = FrameDecoder()
        dec.feed(auth)
        self.sent_auth = dec.next_frame().body   # kept for the replay tests
        self.sock.sendall(auth)
        ack = self.answer_frame(self.opaque)
        session.receive(ack)
        return session.ack

    def auth_lock(self, key: bytes, role: int = Role.LOCK) -> Any:
        return self._handshake(role, AuthMethod.DEVICE_HMAC, key)

    def auth_token(self, token: str) -> Any:
        return self._handshake(Role.SERVICE, AuthMethod.TOKEN, token.encode())

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


def refusal(fn: Callable[[], Any]) -> Refused:
    """Run ``fn``, which must be refused by the broker; return the :class:`Refused`."""
    with pytest.raises(Refused) as ei:
        fn()
    return ei.value


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``cond`` until it returns something true and return it (a bounded wait for
    a condition, never a timing assert)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the broker sends on ``sock`` until it closes it (EOF or reset); fails
    if it is still open after ``timeout`` seconds."""
    sock.settimeout(timeout)
    got = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return got
        except socket.timeout:
            raise AssertionError(f"still open after {timeout} s; received {len(got)} bytes")
        if not data:
            return got
        got += data
