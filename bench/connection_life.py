"""The Python time of one lock's connection life in the broker, without the kernel.

A storm's per-lock CPU is half kernel (accept, reads, writes, close) and half the
loop thread's Python; this measures the connection-life half of the Python alone:
``Connection()`` + ``connection_made``, the CONNECT read (CHALLENGE queued), the AUTH
read (CONNECT_ACK, ``$devices`` online), the DISCONNECT read and ``connection_lost``
(``$devices`` offline), run on a real broker's loop (``BrokerThread``, auth off, or
with ``--auth required`` every lock registered and its AUTH a real proof over the
CHALLENGE the broker sent) against a transport stub that only counts the bytes
written -- no socket, no store answer. Best of ``--rounds`` rounds of ``--locks``
locks, µs per lock per stage. Compare two trees in one sitting (pinned to one core)::

    taskset -c 1 .venv/bin/python bench/connection_life.py [--auth required]
    PYTHONPATH=/tmp/base/host taskset -c 1 .venv/bin/python bench/connection_life.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from lockmq.broker.connection import Connection
from lockmq.protocol import Auth, AuthMethod, Connect, Disconnect, FrameDecoder, Op, Role, \
    encode_frame, transcript_hash
from lockmq.security import DeviceRegistry, SecurityConfig
from lockmq.security.keys import device_proof
from lockmq.testing import BrokerThread

STAGES = ("init+made", "CONNECT", "AUTH", "DISCONNECT", "lost")


class CountingTransport:
    """The transport calls a connection makes, answered at once; writes counted."""

    __slots__ = ("closing", "written", "last")

    def __init__(self) -> None:
        self.closing = False
        self.written = 0
        self.last = b""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.last = data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def get_write_buffer_size(self) -> int:
        return 0

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


#: the CONNECT body of every lock here
CONNECT = Connect(Role.LOCK, 30, "bench").encode()


def lock_sn(i: int) -> str:
    return "BENCH-%06d" % i


def lock_frames(i: int) -> tuple[bytes, bytes, bytes]:
    """CONNECT, AUTH (device method: any proof passes with auth off), DISCONNECT."""
    sn = lock_sn(i)
    return (encode_frame(Op.CONNECT, sn, CONNECT, 1),
            encode_frame(Op.AUTH, sn, Auth(AuthMethod.DEVICE_HMAC, b"c" * 16,
                                           b"p" * 32).encode(), 2),
            encode_frame(Op.DISCONNECT, sn, Disconnect(0, "").encode(), 3))


def proof_frame(sn: str, key: bytes, challenge: bytes) -> bytes:
    """The AUTH a lock holding ``key`` answers the CHALLENGE frame ``challenge`` with."""
    dec = FrameDecoder(1 << 16)
    dec.feed(challenge)
    body = next(dec.frames()).body
    cnonce = b"c" * 16
    proof = device_proof(key, body[:16], cnonce, sn.encode(),
                         transcript_hash(sn.encode(), 0, CONNECT, body))
    return encode_frame(Op.AUTH, sn, Auth(AuthMethod.DEVICE_HMAC, cnonce, proof).encode(), 2)


def one_round(services: Any, first: int, locks: int,
              keys: dict[str, bytes] | None = None) -> list[float]:
    """µs per lock of each stage over ``locks`` connection lives (on the broker's loop);
    ``keys``: the registered locks' keys (auth required), whose AUTH is made from the
    broker's CHALLENGE (outside the timed stages)."""
    frames = [lock_frames(first + i) for i in range(locks)]
    spent = [0.0] * len(STAGES)
    now = time.perf_counter
    for i, (connect, auth, disconnect) in enumerate(frames):
        t0 = now()
        conn = Connection(services, False)
        transport = CountingTransport()
        conn.connection_made(transport)   # type: ignore[arg-type]
        t1 = now()
        conn.data_received(connect)
        t2 = now()
        if keys is not None:
            sn = lock_sn(first + i)
            auth = proof_frame(sn, keys[sn], transport.last)
        t2b = now()   # (making the lock's proof is not the broker's time)
        conn.data_received(auth)
        t3 = now()
        conn.data_received(disconnect)
        t4 = now()
        conn.connection_lost(None)
        t5 = now()
        for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2b, t3), (t3, t4), (t4, t5))):
            spent[k] += b - a
    return [s / locks * 1e6 for s in spent]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--locks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--auth", choices=("off", "required"), default="off",
                    help="required: every lock registered (without a MAC policy, as the "
                    "storm's), its AUTH a real proof")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        keys = None
        if a.auth == "required":
            reg = DeviceRegistry.open(SecurityConfig(data_dir=d))
            keys = reg.add_many([lock_sn(i) for i in range(a.rounds * a.locks)], mac=False)
            reg.close()
        broker = BrokerThread(d, auth=a.auth)
        broker.start()
        try:
            best: list[float] | None = None
            for r in range(a.rounds):
                got = broker.call(lambda r=r: one_round(broker.broker.services,
                                                        r * a.locks, a.locks, keys))
                best = got if best is None else [min(x, y) for x, y in zip(best, got)]
        finally:
            broker.stop()
    assert best is not None
    print("  ".join(f"{n} {v:.2f}" for n, v in zip(STAGES, best)),
          f" total {sum(best):.2f} µs per lock (auth {a.auth}, best of {a.rounds} rounds of "
          f"{a.locks})")


if __name__ == "__main__":
    main()
