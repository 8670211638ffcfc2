"""The test suite's one wire client: a blocking peer that speaks lockmq's protocol.

Independent of :mod:`lockmq.client` on purpose: the broker is tested against the
protocol itself, and a test can send what a well-behaved client never would
(:meth:`Peer.send`, :meth:`Peer.raw`, :meth:`Peer.hello`). A well-behaved handshake
is driven by the protocol's :class:`~lockmq.protocol.ClientSession`, as every real
client's is.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from typing import Any, Callable, Sequence

from lockmq.protocol import (Ack, AuthMethod, Challenge, ClientSession, Connect, ConnectAck,
                             ErrorReply, Flag, FrameDecoder, Messages, Nack, Op, Publish,
                             PublishAck, Pull, Role, Subscribe, SubscribeAck, decode_body,
                             encode_frame, encode_json)

from .waiting import raises

TIMEOUT = 15.0


class Refused(Exception):
    """The broker answered ERROR (``code``, ``err``) or closed the connection (``code``
    is None)."""

    def __init__(self, err: ErrorReply | None) -> None:
        super().__init__(f"ERROR {err.code}: {err.message}" if err else "connection closed")
        self.err = err
        self.code = err.code if err else None


class Peer:
    """One connection to a broker on 127.0.0.1 (plain TCP, or TLS with ``tls``).

    The constructor only connects; log in with :meth:`auth_lock`, :meth:`auth_token`
    or :meth:`auth_off`, or use :func:`open_peer`. Frames that are not the answer
    being waited for are kept: answers by opaque in ``answers``, the rest (pushes) in
    ``unsolicited``.
    """

    def __init__(self, port: int, sn: str = "", tls: ssl.SSLContext | None = None,
                 server_hostname: str = "127.0.0.1", source: str | None = None,
                 timeout: float = TIMEOUT) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                       source_address=(source, 0) if source else None)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = tls.wrap_socket(raw, server_hostname=server_hostname) if tls else raw
        self.sn = sn
        self.timeout = timeout
        self.dec = FrameDecoder(16 * 1024 * 1024)
        self.opaque = 0
        self.answers: dict[int, Any] = {}
        self.unsolicited: list[Any] = []
        self.challenge: Challenge | None = None
        self.connect_ack: ConnectAck | None = None
        self.sent_auth: bytes = b""
        self.session: ClientSession | None = None
        self.early_opaques: list[int] = []

    # -- frames -----------------------------------------------------------------------
    def next_opaque(self) -> int:
        self.opaque += 1
        return self.opaque

    def send(self, opcode: int, body: bytes, opaque: int | None = None, flags: int = 0,
             sn: str | None = None) -> int:
        """Send one frame as given (no session rules applied); returns its opaque."""
        op = self.next_opaque() if opaque is None else opaque
        self.sock.sendall(encode_frame(opcode, self.sn if sn is None else sn, body, op, flags))
        return op

    def raw(self, data: bytes) -> None:
        """Send bytes as they are."""
        self.sock.sendall(data)

    def read(self, timeout: float | None = None) -> Any:
        """The next frame from the broker; None once the broker closed the connection."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
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

    read_frame = read

    def _keep(self, f: Any) -> None:
        if f.flags & Flag.RESPONSE:
            self.answers[f.opaque] = f
        else:
            self.unsolicited.append(f)

    def wait(self, opaque: int, timeout: float | None = None) -> Any:
        """The answer frame to ``opaque`` as it came (ERROR included);
        ``ConnectionError`` if the broker closes first."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while opaque not in self.answers:
            f = self.read(max(0.0, deadline - time.monotonic()))
            if f is None:
                raise ConnectionError("broker closed the connection")
            self._keep(f)
        return self.answers.pop(opaque)

    def answer_frame(self, opaque: int) -> Any:
        """The frame answering ``opaque``; :class:`Refused` on its ERROR, on an ERROR
        for the whole connection (opaque 0) or when the broker closes."""
        while True:
            f = self.answers.pop(opaque, None)
            if f is None:
                f = self.read()
            if f is None:
                raise Refused(None)
            if f.opcode == Op.ERROR and f.opaque in (opaque, 0):
                if f.opaque == 0:
                    self.unsolicited.append(f)
                raise Refused(decode_body(f.opcode, f.body))
            if f.flags & Flag.RESPONSE and f.opaque == opaque:
                return f
            self._keep(f)

    def answer(self, opaque: int) -> Any:
        """The decoded answer to ``opaque``; :class:`Refused` on ERROR or close."""
        f = self.answer_frame(opaque)
        return decode_body(f.opcode, f.body)

    def request(self, opcode: int, body: bytes, flags: int = 0, sn: str | None = None) -> Any:
        """Send and return the decoded answer; :class:`Refused` on ERROR or close."""
        return self.answer(self.send(opcode, body, flags=flags, sn=sn))

    def wait_unsolicited(self, opcode: int, timeout: float | None = None) -> Any:
        """The next pushed frame with ``opcode``, decoded."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            for i, f in enumerate(self.unsolicited):
                if f.opcode == opcode:
                    del self.unsolicited[i]
                    return decode_body(f.opcode, f.body)
            f = self.read(max(0.0, deadline - time.monotonic()))
            if f is None:
                raise ConnectionError("broker closed the connection")
            self._keep(f)

    def wait_closed(self, timeout: float | None = None) -> list[Any]:
        """Read until the broker closes; return the frames seen (ERRORs decoded)."""
        seen = []
        while True:
            f = self.read(timeout)
            if f is None:
                return seen
            seen.append(decode_body(f.opcode, f.body) if f.opcode == Op.ERROR else f)

    # -- the handshake ------------------------------------------------------------------
    def hello(self, role: int) -> Challenge:
        """Only a CONNECT (a test that breaks the handshake on purpose goes on by hand)."""
        self.challenge = self.request(Op.CONNECT, Connect(role, 30, "test").encode())
        return self.challenge

    def handshake(self, role: int, method: int, secret: bytes,
                  early: Sequence[tuple[int, ...]] = (), mac: bool = False) -> ConnectAck:
        """CONNECT, CHALLENGE, AUTH, CONNECT_ACK through the protocol's ClientSession.

        ``early``: requests ``(opcode, body[, flags])`` sent in the AUTH's write, before the
        CONNECT_ACK (SPEC 2, "Pipelined requests"); their opaques are kept in
        ``early_opaques``. ``mac``: ask for frame MACs; ``session`` then opens the
        answers (``session.receive(frame)`` checks and strips their tags)."""
        session = ClientSession(role, self.sn, method, secret, "test", mac=mac)
        self.session = session
        opaque = self.next_opaque()
        self.sock.sendall(session.connect_frame(opaque))
        challenge = self.answer_frame(opaque)
        self.challenge = decode_body(challenge.opcode, challenge.body)
        opaque = self.next_opaque()
        auth = session.receive(challenge, os.urandom(16), opaque)
        dec = FrameDecoder()
        dec.feed(auth)
        self.sent_auth = dec.next_frame().body   # kept for the replay tests
        self.early_opaques = [self.next_opaque() for _ in early]
        self.sock.sendall(auth + b"".join(session.seal(op, self.sn, body, o, *flags)
                                          for (op, body, *flags), o in zip(early, self.early_opaques)))
        session.receive(self.answer_frame(opaque))
        self.connect_ack = session.ack
        return session.ack

    def auth_lock(self, key: bytes, role: int = Role.LOCK,
                  early: Sequence[tuple[int, ...]] = (), mac: bool = False) -> ConnectAck:
        """Log in as the lock ``sn`` with its device key (``early``, ``mac``: as
        :meth:`handshake`)."""
        return self.handshake(role, AuthMethod.DEVICE_HMAC, key, early, mac)

    def auth_token(self, token: str) -> ConnectAck:
        """Log in as a service with a token."""
        return self.handshake(Role.SERVICE, AuthMethod.TOKEN, token.encode())

    def auth_off(self, role: int = Role.SERVICE) -> ConnectAck:
        """Log in to a broker with ``auth = "off"`` (any credentials pass)."""
        if role == Role.LOCK:
            return self.auth_lock(b"\x00" * 32, role)
        return self.handshake(role, AuthMethod.TOKEN, b"x")

    # -- producer / consumer requests ---------------------------------------------------
    def publish(self, topic: str, seq: int, payload: bytes = b"p" * 24,
                sn: str | None = None) -> PublishAck:
        return self.request(Op.PUBLISH, Publish(topic, seq, int(time.time() * 1000),
                                                payload).encode(), sn=sn)

    def subscribe(self, topic: str, cluster: str, ordered: bool = False,
                  max_inflight: int = 0, lease_ms: int = 0) -> SubscribeAck:
        return self.request(Op.SUBSCRIBE, Subscribe(
            topic, cluster, Subscribe.ORDERED if ordered else 0, max_inflight,
            lease_ms).encode())

    def pull(self, sub_id: int, n: int = 100, wait_ms: int = 0) -> Messages:
        return self.request(Op.PULL, Pull(sub_id, n, wait_ms).encode())

    def ack(self, sub_id: int, leases: list[tuple[int, int]]) -> Any:
        return self.request(Op.ACK, Ack(sub_id, leases).encode())

    def nack(self, sub_id: int, leases: list[tuple[int, int]], delay_ms: int = 0,
             reason: str = "") -> Any:
        return self.request(Op.NACK, Nack(sub_id, leases, delay_ms, reason).encode())

    def admin(self, op: str, **args: Any) -> dict[str, Any]:
        return self.request(Op.ADMIN_REQUEST, encode_json({"op": op, "args": args}))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_peer(port: int, sn: str = "svc", role: int = Role.SERVICE, **kw: Any) -> Peer:
    """A :class:`Peer` logged in to a broker with ``auth = "off"``."""
    p = Peer(port, sn, **kw)
    p.auth_off(role)
    return p


def refusal(fn: Callable[[], Any]) -> Refused:
    """Run ``fn``, which the broker must refuse; return the :class:`Refused`."""
    return raises(Refused, fn)


def drain(peer: Peer, sub_id: int, expect: int, batch: int = 100,
          timeout: float = 30.0) -> list[Any]:
    """Pull (long-poll) and ack until ``expect`` messages arrived; returns them."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < expect:
        assert time.monotonic() < deadline, f"only {len(got)} of {expect} messages arrived"
        m = peer.pull(sub_id, batch, wait_ms=500)
        if m.messages:
            peer.ack(sub_id, [x.lease for x in m.messages])
            got.extend(m.messages)
    return got


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
