"""The fault-injecting proxy's faults, on a plain TCP echo server (real sockets)."""

from __future__ import annotations

import socket
import socketserver
import threading
from typing import Iterator

import pytest

from lockmq.hil import FaultProxy

QUIET_S = 0.4  # how long "nothing arrives" is watched


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server.server_address  # type: ignore[misc]
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy(echo) as p:
        yield p


def connect(p: FaultProxy) -> socket.socket:
    s = socket.create_connection(p.address, timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def nothing_arrives(s: socket.socket) -> bool:
    s.settimeout(QUIET_S)
    try:
        data = s.recv(1)
    except socket.timeout:
        return True
    return False  # data (or a close) arrived


def test_pass_forwards_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        payload = bytes(range(256)) * 400
        s.sendall(payload)
        assert recv_exact(s, len(payload)) == payload
    assert proxy.stats.accepted == 1
    assert proxy.stats.up_bytes == len(payload)  # counted before the echo could come back


def test_drop_discards_silently_and_restore_resumes(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        s.sendall(b"before")
        assert recv_exact(s, 6) == b"before"
        proxy.drop()
        s.sendall(b"lost")
        assert nothing_arrives(s)  # no data, no FIN, no RST: only a timeout
        proxy.restore()
        s.sendall(b"after")
        assert recv_exact(s, 5) == b"after"  # "lost" never comes back
    assert proxy.stats.dropped_bytes >= 4


def test_stall_holds_traffic_and_delivers_it_on_restore(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        proxy.stall()
        s.sendall(b"held back")
        assert nothing_arrives(s)
        proxy.restore()
        assert recv_exact(s, 9) == b"held back"


def test_slow_delivers_everything_in_order(proxy: FaultProxy) -> None:
    proxy.slow(delay_s=0.01, rate_bps=200_000)
    with connect(proxy) as s:
        payload = bytes(i % 251 for i in range(50_000))
        s.sendall(payload)
        assert recv_exact(s, len(payload), timeout=20) == payload


def test_reset_aborts_open_connections_with_rst(proxy: FaultProxy) -> None:
    s = connect(proxy)
    s.sendall(b"x")
    assert recv_exact(s, 1) == b"x"
    proxy.reset()
    s.settimeout(5)
    with pytest.raises(ConnectionResetError):
        s.recv(1)
        s.recv(1)
    s.close()
    with connect(proxy) as s2:  # new connections still pass
        s2.sendall(b"y")
        assert recv_exact(s2, 1) == b"y"
    assert proxy.stats.resets >= 1


def test_cut_refuses_until_restored(proxy: FaultProxy) -> None:
    old = connect(proxy)
    proxy.cut()
    old.settimeout(5)
    with pytest.raises(ConnectionResetError):
        old.recv(1)
        old.recv(1)
    old.close()
    with pytest.raises(ConnectionResetError):
        s = connect(proxy)  # the kernel accepts; the proxy answers with RST
        try:
            s.settimeout(5)
            s.sendall(b"z")
            s.recv(1)
            s.recv(1)
        finally:
            s.close()
    assert proxy.stats.refused >= 1
    proxy.restore()
    with connect(proxy) as s3:
        s3.sendall(b"back")
        assert recv_exact(s3, 4) == b"back"


def test_upstream_down_looks_like_a_reset(echo: tuple[str, int]) -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead_port = free.getsockname()[1]
    free.close()  # nothing listens there now
    with FaultProxy(("127.0.0.1", dead_port)) as p:
        with pytest.raises(ConnectionError):  # reset at connect or at the first read
            with connect(p) as s:
                s.settimeout(5)
                if not s.recv(1):
                    raise ConnectionError("closed")
        assert p.stats.upstream_failures == 1
        p.set_upstream(*echo)  # the broker came back elsewhere
        with connect(p) as s2:
            s2.sendall(b"ok")
            assert recv_exact(s2, 2) == b"ok"
