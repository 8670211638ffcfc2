"""The session's rules (protocol/session_vectors.json), checked by CPython and by the
real MicroPython from the same file, plus a client/server pair driven end to end."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from lockmq.protocol import (AuthMethod, ClientSession, ConnectAck, FrameDecoder, Role,
                             ServerSession, verify_auth_proof)
from lockmq.testing.micropython import PROTOCOL, build_mpy_lib, run_micropython

from . import session_checks

HERE = Path(__file__).resolve().parent
VECTORS = PROTOCOL / "session_vectors.json"


def test_session_vectors_pass_under_cpython() -> None:
    passed, failures = session_checks.run(str(VECTORS))
    assert failures == []
    assert passed > 60


def test_session_vectors_pass_under_micropython_as_shipped_mpy(tmp_path: Path) -> None:
    lib = build_mpy_lib(tmp_path, compile_mpy=True)
    for name in ("session_checks.py", "mpy_session.py"):
        shutil.copy(HERE / name, tmp_path / name)
    proc = run_micropython(tmp_path / "mpy_session.py", [str(VECTORS)], tmp_path,
                           [lib, tmp_path], "256K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(" 0 failed")


def _pipe(data: bytes):
    dec = FrameDecoder()
    dec.feed(data)
    return dec.next_frame()


def test_a_client_and_a_server_session_complete_the_handshake() -> None:
    key = os.urandom(32)
    client = ClientSession(Role.LOCK, "LOCK-0001", AuthMethod.DEVICE_HMAC, key, "test")
    server = ServerSession()
    connect = _pipe(client.connect_frame(1))
    server.receive(connect)
    assert server.connect.role == Role.LOCK and server.name == "LOCK-0001"
    auth = _pipe(client.receive(_pipe(server.challenge(os.urandom(16), 5, connect.opaque)),
                                os.urandom(16), 2))
    server.receive(auth)
    assert server.transcript == client.transcript and len(server.transcript) == 32
    assert verify_auth_proof(key, server.nonce, server.auth.cnonce, "LOCK-0001",
                             server.transcript, server.auth.proof)
    ack = ConnectAck(30, 4096, 5, 41, 7)
    assert client.receive(_pipe(server.accept(Role.LOCK, "LOCK-0001", ack, auth.opaque))) is None
    assert client.ack == ack
    assert client.state == server.state == 2   # ESTABLISHED on both sides
