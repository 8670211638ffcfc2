"""Fixtures for the broker's end-to-end tests: a real broker on 127.0.0.1.

``broker`` runs :class:`lockmq.broker.Broker` in a background thread with its own
event loop (real TCP, real files with fsync, auth off); ``Peer`` is a tiny blocking
client speaking frames with ``lockmq.protocol`` -- deliberately independent of
``lockmq.client`` so the broker is tested against the protocol itself.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from lockmq.config import config_from_dict
from lockmq.protocol import (Ack, Auth, AuthMethod, Connect, ConnectAck, ErrorReply, Flag,
                             FrameDecoder, Messages, Nack, Op, Publish, PublishAck, Pull,
                             Role, Subscribe, SubscribeAck, decode_body, decode_json,
                             encode_frame, encode_json)

TIMEOUT = 10.0


class BrokerThread:
    """A broker in a thread; ``port`` is its protocol port."""

    def __init__(self, data_dir: str, settings: dict[str, dict[str, Any]],
                 clock: Any = None) -> None:
        self.clock = clock   # a lockmq.clock.ManualClock for time-scale tests
        tables: dict[str, dict[str, Any]] = {
            "broker": {"port": 0, "status_port": 0, "host": "127.0.0.1",
                       "data_dir": data_dir, "auth": "off", "log_level": "WARNING",
                       "position_flush_ms": 20},
            "consumers": {"lease_sweep_ms": 20},
            "store": {"min_free_bytes": 0},
        }
        for k, v in settings.items():
            tables.setdefault(k, {}).update(v)
        self.config = config_from_dict(tables)
        try:   # the loop the broker uses in production
            import uvloop
            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.broker: Any = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        from lockmq.broker import Broker

        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.broker = Broker(self.config) if self.clock is None else \
                Broker(self.config, clock=self.clock)
            await self.broker.start()
            self.port = self.broker.port

        try:
            self.loop.run_until_complete(main())
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    def start(self) -> "BrokerThread":
        self._thread.start()
        assert self._started.wait(TIMEOUT), "broker did not start"
        if self._error:
            raise self._error
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the broker's loop and return its result."""
        async def wrap() -> Any:
            r = fn()
            if asyncio.iscoroutine(r):
                r = await r
            return r
        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(TIMEOUT)

    def status_page(self) -> str:
        """Start the broker's status page on a free port; its base URL."""
        port = self.call(lambda: self.broker.status.start("127.0.0.1", 0))
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.broker is not None and self._thread.is_alive():
            try:
                self.call(self.broker.stop)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(TIMEOUT)


class BrokerError(Exception):
    """The broker answered ERROR."""

    def __init__(self, err: ErrorReply) -> None:
        super().__init__(f"ERROR {err.code}: {err.message}")
        self.err = err
        self.code = err.code


class Peer:
    """A blocking protocol client for tests (one socket, opaque-matched answers)."""

    def __init__(self, port: int, sn: str = "svc", role: int = Role.SERVICE,
                 handshake: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sn = sn
        self.dec = FrameDecoder(16 * 1024 * 1024)
        self.opaque = 0
        self.unsolicited: list[Any] = []
        self.answers: dict[int, Any] = {}
        self.connect_ack: ConnectAck | None = None
        if handshake:
            self.handshake(role)

    def next_opaque(self) -> int:
        self.opaque += 1
        return self.opaque

    def send(self, opcode: int, body: bytes, opaque: int | None = None, flags: int = 0,
             sn: str | None = None) -> int:
        op = self.next_opaque() if opaque is None else opaque
        self.sock.sendall(encode_frame(opcode, self.sn if sn is None else sn, body, op, flags))
        return op

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self, timeout: float = TIMEOUT) -> Any:
        """The next frame from the broker (None when the broker closed the socket)."""
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
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.dec.feed(data)

    def _store(self, f: Any) -> None:
        if f.flags & Flag.RESPONSE:
            self.answers[f.opaque] = f
        else:
            self.unsolicited.append(f)

    def wait(self, opaque: int, timeout: float = TIMEOUT) -> Any:
        """The answer frame to ``opaque``."""
        deadline = time.monotonic() + timeout
        while opaque not in self.answers:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if f is None:
                raise ConnectionError("broker closed the connection")
            self._store(f)
        return self.answers.pop(opaque)

    def request(self, opcode: int, body: bytes, flags: int = 0) -> Any:
        """Send and wait; returns the decoded body; raises BrokerError on ERROR."""
        f = self.wait(self.send(opcode, body, flags=flags))
        b = decode_body(f.opcode, f.body)
        if f.opcode == Op.ERROR:
            raise BrokerError(b)
        return b

    def wait_unsolicited(self, opcode: int, timeout: float = TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for i, f in enumerate(self.unsolicited):
                if f.opcode == opcode:
                    del self.unsolicited[i]
                    return decode_body(f.opcode, f.body)
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if f is None:
                raise ConnectionError("broker closed the connection")
            self._store(f)

    def handshake(self, role: int = Role.SERVICE) -> ConnectAck:
        self.request(Op.CONNECT, Connect(role, 30, "test").encode())
        method = AuthMethod.DEVICE_HMAC if role == Role.LOCK else AuthMethod.TOKEN
        self.connect_ack = self.request(Op.AUTH, Auth(method, os.urandom(16), b"x").encode())
        return self.connect_ack

    # -- producer / consumer helpers --------------------------------------------------

    def publish(self, topic: str, seq: int, payload: bytes = b"p" * 24) -> PublishAck:
        return self.request(Op.PUBLISH, Publish(topic, seq, int(time.time() * 1000),
                                                payload).encode())

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


@pytest.fixture
def make_broker(tmp_path: Any) -> Iterator[Callable[..., BrokerThread]]:
    """Start brokers with settings: ``make_broker(consumers={...})``."""
    started: list[BrokerThread] = []

    def make(data_dir: str | None = None, clock: Any = None,
             **settings: dict[str, Any]) -> BrokerThread:
        b = BrokerThread(data_dir or str(tmp_path / "data"), settings, clock).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(make_broker: Callable[..., BrokerThread]) -> BrokerThread:
    """A broker on defaults (auth off, fast timers)."""
    return make_broker()


__all__ = ["Peer", "BrokerError", "drain", "decode_json"]
