"""Trust round 2, item 5: a lock that trusts no number it is given. A hostile broker on
127.0.0.1 -- one that even knows the lock's key, so its frames pass every tag --
answers the real firmware (unix port) with random and boundary-valued frames at every
stage of the session. The lock never hangs, crashes or stays away longer than its own
``backoff_max_ms``.

Seen live: one ERROR(BUSY, retry_after_ms = 2^32-1) before the handshake made the
firmware log ``net backoff ms=4294967769`` and stop trying for 49.7 days.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import threading

import pytest

from lockmq.protocol import (ConnectAck, ErrorCode, ErrorReply, Flag, FrameDecoder, Op,
                             ProtocolError, ServerSession, encode_frame, session_key)
from lockmq.protocol import auth_proof  # noqa: F401  (the proof the lock sends)
from lockmq.testing import Lock, require_micropython, wait_for
from lockmq.testing.lock import build_flash, set_config

pytestmark = pytest.mark.timeout(170)

SN = "LOCK0001"
KEY = bytes(range(32))
MAX_MS = 400
U32 = 0xFFFFFFFF


class HostileBroker:
    """Accepts the lock again and again; connection ``i`` runs stage ``i % STAGES``."""

    STAGES = 7

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.connections = 0
        self.stage_errors: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            stage = self.connections % self.STAGES
            self.connections += 1
            threading.Thread(target=self._serve, args=(c, stage), daemon=True).start()

    def _frames(self, c: socket.socket, dec: FrameDecoder):
        while True:
            f = dec.next_frame()
            if f is not None:
                yield f
                continue
            data = c.recv(65536)
            if not data:
                return
            dec.feed(data)

    def _random_body(self) -> bytes:
        r = self.rng
        pick = r.randrange(4)
        if pick == 0:
            return b""
        if pick == 1:
            return bytes([r.choice((0, 0xFF))]) * r.randrange(1, 40)
        return os.urandom(r.randrange(1, 300))

    def _serve(self, c: socket.socket, stage: int) -> None:
        r = self.rng
        c.settimeout(15)
        dec = FrameDecoder(1 << 20)
        s = ServerSession()
        try:
            frames = self._frames(c, dec)
            connect = next(frames)
            s.receive(connect)
            if stage == 0:    # an ERROR before the handshake with the largest hint
                c.sendall(encode_frame(Op.ERROR, "", ErrorReply(ErrorCode.BUSY, "busy",
                                                                 U32).encode()))
                return
            if stage == 1:    # a CHALLENGE that is garbage
                c.sendall(encode_frame(Op.CHALLENGE, "", self._random_body(), 1, Flag.RESPONSE))
                return
            if stage == 2:    # random bytes
                c.sendall(os.urandom(r.randrange(1, 2000)))
                return
            c.sendall(s.challenge(os.urandom(16), r.choice((0, U32 << 32 | U32, 1)), 1))
            auth = next(frames)
            s.receive(auth)
            if stage == 3:    # refused after AUTH, largest hint, every retry code
                code = r.choice((ErrorCode.BUSY, ErrorCode.RATE_LIMITED,
                                 ErrorCode.STORAGE_FULL, ErrorCode.SHUTTING_DOWN))
                c.sendall(encode_frame(Op.ERROR, "", ErrorReply(code, "x", U32).encode(),
                                       auth.opaque, Flag.RESPONSE))
                return
            key = session_key(KEY, s.nonce, s.cnonce, SN, s.transcript) if s.mac_wanted else None
            ack = ConnectAck(r.choice((0xFFFF, 0, 1)), r.choice((1, U32, 0)),
                             r.choice((0, 1 << 63, (1 << 64) - 1)),
                             r.choice((0xFFFFFFFE, 0, U32 - 1)), U32)
            c.sendall(s.accept(1, SN, ack, auth.opaque, mac_key=key))
            if stage == 4:    # publishes answered BUSY with the largest hint, then silence
                busy = 0
                for f in frames:
                    if f.opcode == Op.PUBLISH and busy < 3:
                        busy += 1
                        c.sendall(s.seal(Op.ERROR, "", ErrorReply(ErrorCode.BUSY, "busy",
                                                                   U32).encode(),
                                         f.opaque, Flag.RESPONSE))
                return
            if stage == 5:    # random tagged frames of every opcode
                for _ in range(30):
                    op = r.choice((Op.COMMAND, Op.PUBLISH_ACK, Op.ERROR, Op.HEARTBEAT, Op.NOTIFY,
                                   Op.CONNECT_ACK, Op.DISCONNECT, Op.MESSAGES, 0x7777))
                    c.sendall(s.seal(op, "", self._random_body(), r.choice((0, 1, U32)),
                                     r.choice((0, Flag.RESPONSE))))
                return
            # stage 6: a broker that accepts and then says nothing at all
            for _ in frames:
                pass
        except (OSError, StopIteration, ProtocolError) as exc:
            self.stage_errors.append(f"{stage}: {exc!r}")
        finally:
            c.close()

    def close(self) -> None:
        self.srv.close()


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])  # seed 2: the slow tier
def test_a_hostile_broker_never_silences_the_lock_beyond_its_own_backoff(tmp_path, seed):
    require_micropython()
    hostile = HostileBroker(seed)
    folder = build_flash(tmp_path / "board", SN, KEY, [("127.0.0.1", hostile.port)], cards=[])
    set_config(folder, backoff_min_ms=50, backoff_max_ms=MAX_MS, heartbeat_s=2,
               io_timeout_ms=2000)
    lock = Lock(folder)
    try:
        lock.expect(r"I sys ready", timeout=30)
        lock.send("event tamper")
        # Every stage (each seed draws other values): each time the lock comes back.
        for round_ in range(HostileBroker.STAGES + 1):
            lock.expect(r"I net connecting", timeout=60)
            assert lock.proc is not None and lock.proc.poll() is None, lock.log()
        backoffs = [int(m.group(1)) for m in lock.grep(r"net backoff ms=(\d+)")]
        assert backoffs and max(backoffs) <= MAX_MS, backoffs
        busy = [int(m.group(1)) for m in lock.grep(r"evt busy retry_ms=(\d+)")]
        assert all(ms <= MAX_MS for ms in busy), busy
        assert not lock.grep(r"Traceback|MemoryError"), lock.log()
        wait_for(lambda: hostile.connections >= HostileBroker.STAGES + 1,
                 "every stage at the hostile broker", timeout=30)
    finally:
        lock.close()
        hostile.close()
