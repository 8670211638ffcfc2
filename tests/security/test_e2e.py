"""End to end over real TCP against a real ``lockmq broker`` process (auth required).

Each refusal of the issue's list is checked three ways: the ERROR code the peer
gets, the broker's log line, and the ``/metrics`` counter.
"""

from __future__ import annotations

import os
import struct
import time

import pytest

from lockmq.protocol import (Command, CommandKind, CommandResult, CommandStatus, ErrorCode,
                             ErrorReply, Heartbeat, Op, Publish, PublishAck, Role, Subscribe,
                             crc16, decode_body)
from lockmq.security import CommandRefused, CommandVerifier, Permissions
from lockmq.testing import Peer, SecureBroker, refusal, run_cli, wait_for


pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("secure"),
                       {"broker": {"handshake_timeout_s": 2.0, "max_frame": 65536}})
    keys = env.add_locks("LOCK-A", "LOCK-B", "LOCK-C", "LOCK-D", "LOCK-E", "LOCK-F")
    tok = {
        "reader": env.token("reader", Permissions(consume=("lock.*:billing",))),
        "opener": env.token("opener", Permissions(command=("LOCK-A",))),
        "ops": env.token("ops", Permissions(admin=True), ttl_s=3600),
        "expired": env.token("old", Permissions(admin=True), ttl_s=60,
                             now=time.time() - 3600),
    }
    yield env.start(), env.registry, keys, tok
    env.close()


def test_registered_lock_publishes(env):
    broker, _, keys, _ = env
    w = Peer(broker.port, "LOCK-A")
    try:
        ack = w.auth_lock(keys["LOCK-A"])
        assert ack.heartbeat_s > 0
        assert w.publish("lock.events", 1).status is not None
        assert w.publish("locks.LOCK-A.alarm", 2) is not None
    finally:
        w.close()


def test_unknown_sn_and_wrong_key_get_the_same_answer(env):
    broker, _, _, _ = env
    mark = broker.mark()
    errs = []
    for sn in ("NOBODY-1", "LOCK-B"):
        w = Peer(broker.port, sn)
        try:
            errs.append(refusal(lambda: w.auth_lock(os.urandom(32))))
            assert w.read(5) is None            # and the connection is closed
        finally:
            w.close()
    a, b = errs
    assert a.code == b.code == ErrorCode.AUTH_FAILED
    assert a.err.message == b.err.message
    broker.wait_log(r"auth_failed.*reason=unknown_sn.*NOBODY-1|auth_failed.*NOBODY-1.*"
                    r"reason=unknown_sn", start=mark)
    broker.wait_log(r"auth_failed.*LOCK-B.*reason=bad_proof|auth_failed.*reason=bad_proof"
                    r".*LOCK-B", start=mark)
    m = broker.metrics()
    assert m['lockmq_security_auth_failed_total{reason="unknown_sn"}'] >= 1
    assert m['lockmq_security_auth_failed_total{reason="bad_proof"}'] >= 1


def test_replayed_challenge_answer_is_refused(env):
    broker, _, keys, _ = env
    w = Peer(broker.port, "LOCK-C")
    w.auth_lock(keys["LOCK-C"])
    recorded = w.sent_auth
    w.close()
    mark = broker.mark()
    eve = Peer(broker.port, "LOCK-C")          # an eavesdropper replays the answer
    try:
        eve.hello(Role.LOCK)
        err = refusal(lambda: eve.request(Op.AUTH, recorded))
        assert err.code == ErrorCode.REPLAY
    finally:
        eve.close()
    broker.wait_log(r"auth_failed.*reason=replayed", start=mark)
    assert broker.metrics()['lockmq_security_auth_failed_total{reason="replayed"}'] >= 1


def test_frame_claiming_another_sn_is_refused(env):
    broker, _, keys, _ = env
    mark = broker.mark()
    w = Peer(broker.port, "LOCK-D")
    try:
        w.auth_lock(keys["LOCK-D"])
        err = refusal(lambda: w.publish("lock.events", 1, sn="LOCK-A"))
        assert err.code == ErrorCode.SN_MISMATCH
        assert w.read(5) is None
    finally:
        w.close()
    broker.wait_log(r"sn_mismatch", start=mark)
    assert broker.metrics()['lockmq_security_sn_mismatch_total{reason="sn_mismatch"}'] >= 1


def test_lock_may_not_publish_to_another_locks_topic(env):
    broker, _, keys, _ = env
    w = Peer(broker.port, "LOCK-B")
    try:
        w.auth_lock(keys["LOCK-B"])
        err = refusal(lambda: w.publish("locks.LOCK-A.events", 1))
        assert err.code == ErrorCode.FORBIDDEN
        assert w.publish("lock.events", 2) is not None      # the connection goes on
    finally:
        w.close()


def test_service_without_permission_is_refused(env):
    broker, _, _, tok = env
    mark = broker.mark()
    w = Peer(broker.port, "")
    try:
        w.auth_token(tok["reader"])
        assert w.request(Op.SUBSCRIBE, Subscribe("lock.events", "billing").encode())
        err = refusal(lambda: w.request(Op.SUBSCRIBE, Subscribe("lock.events", "audit").encode()))
        assert err.code == ErrorCode.FORBIDDEN
        err = refusal(lambda: w.request(Op.COMMAND, Command(
            "LOCK-A", 1, 0, CommandKind.UNLOCK, b"\x00\x05").encode()))
        assert err.code == ErrorCode.FORBIDDEN
        err = refusal(lambda: w.publish("lock.events", 1))
        assert err.code == ErrorCode.FORBIDDEN
    finally:
        w.close()
    m = broker.metrics()
    assert m['lockmq_security_permission_denied_total{reason="consume_denied"}'] >= 1
    assert m['lockmq_security_permission_denied_total{reason="command_denied"}'] >= 1
    assert m['lockmq_security_permission_denied_total{reason="publish_denied"}'] >= 1
    broker.wait_log(r"permission_denied.*reason=command_denied", start=mark)


def test_expired_token_is_refused(env):
    broker, _, _, tok = env
    mark = broker.mark()
    w = Peer(broker.port, "")
    try:
        err = refusal(lambda: w.auth_token(tok["expired"]))
        assert err.code == ErrorCode.TOKEN_EXPIRED
    finally:
        w.close()
    broker.wait_log(r"auth_failed.*reason=token_expired", start=mark)
    assert broker.metrics()['lockmq_security_auth_failed_total{reason="token_expired"}'] >= 1


def test_downlink_command_is_signed_and_a_replay_is_refused_by_the_lock(env):
    broker, _, keys, tok = env
    lock = Peer(broker.port, "LOCK-A")
    svc = Peer(broker.port, "")
    try:
        lock.auth_lock(keys["LOCK-A"])
        svc.auth_token(tok["opener"])
        verifier = CommandVerifier("LOCK-A", keys["LOCK-A"])
        got = []
        for i in range(2):
            op = svc.send(Op.COMMAND, Command("LOCK-A", 100 + i, 0, CommandKind.UNLOCK,
                                              b"\x00\x05").encode())
            f = lock.read()
            while f.opcode != Op.COMMAND:
                f = lock.read()
            cmd = decode_body(f.opcode, f.body)
            verifier.verify(cmd, int(time.time() * 1000))        # genuine: accepted
            got.append(cmd)
            lock.send(Op.COMMAND_RESULT, CommandResult("LOCK-A", cmd.cmd_id,
                                                       CommandStatus.OK).encode())
            res = svc.answer(op)
            assert (res.status, res.cmd_id) == (CommandStatus.OK, 100 + i)
        assert got[1].cmd_id > got[0].cmd_id and len(got[0].mac) == 32
        with pytest.raises(CommandRefused) as ei:                 # replayed frame
            verifier.verify(got[0], int(time.time() * 1000))
        assert ei.value.reason == "replayed"
        forged = Command("LOCK-A", got[1].cmd_id + 1, got[1].expires_ms, CommandKind.UNLOCK,
                         b"\x00\x05", bytes(32))
        with pytest.raises(CommandRefused):
            verifier.verify(forged, int(time.time() * 1000))
    finally:
        lock.close()
        svc.close()
    assert broker.metrics()['lockmq_security_command_signed_total'] >= 2


def test_silent_socket_is_closed_after_the_auth_timeout(env):
    broker, _, _, _ = env
    mark = broker.mark()
    w = Peer(broker.port, timeout=30)      # connected, and then silent
    s = w.sock
    try:
        seen = w.wait_closed(timeout=30)
        assert [e.code for e in seen if hasattr(e, "code")] == [ErrorCode.AUTH_TIMEOUT]
    finally:
        s.close()
    broker.wait_log(r"auth_timeout", start=mark)
    assert broker.metrics()['lockmq_security_auth_timeout_total{reason="auth_timeout"}'] >= 1


def test_oversized_frame_is_refused_before_buffering(env):
    broker, _, _, _ = env
    w = Peer(broker.port, timeout=30)
    s = w.sock
    try:
        # version 1, length 100 MB, opcode PUBLISH, empty SN: refused from the header
        s.sendall(struct.pack(">BIHB", 1, 100_000_000, Op.PUBLISH, 0))
        seen = w.wait_closed(timeout=30)
        assert [e.code for e in seen if hasattr(e, "code")] == [ErrorCode.FRAME_TOO_LARGE]
    finally:
        s.close()
    assert broker.metrics()['lockmq_security_bad_frame_total{reason="FrameTooLarge"}'] >= 1


def test_disabled_lock_is_refused_at_its_next_connect(env):
    broker, reg, keys, _ = env
    reg.add("LOCK-X", mac=False)
    key = reg.rekey("LOCK-X")
    w = Peer(broker.port, "LOCK-X")
    w.auth_lock(key)
    w.close()
    reg.set_enabled("LOCK-X", False)
    w = Peer(broker.port, "LOCK-X")
    try:
        assert refusal(lambda: w.auth_lock(key)).code == ErrorCode.AUTH_FAILED
    finally:
        w.close()


def test_devices_online_lists_connected_locks(env, capsys):
    broker, _, keys, tok = env
    w = Peer(broker.port, "LOCK-C")
    try:
        w.auth_lock(keys["LOCK-C"])
        assert run_cli("devices", "online", "--broker", f"127.0.0.1:{broker.port}",
                   "--token", tok["ops"], "--json") == 0
        import json
        sns = [d["sn"] for d in json.loads(capsys.readouterr().out)]
        assert "LOCK-C" in sns
        for bad in ("expired", "reader"):       # expired token; token without admin
            assert run_cli("devices", "online", "--broker", f"127.0.0.1:{broker.port}",
                       "--token", tok[bad]) == 1
    finally:
        w.close()


def test_unauthenticated_peers_get_only_small_frames(env):
    """Before AUTH a frame may be at most preauth_max_frame_bytes (4 KiB): an
    unauthenticated socket cannot make the broker buffer max_frame bytes."""
    broker, _, keys, _ = env
    w = Peer(broker.port, timeout=30)
    s = w.sock
    try:
        s.sendall(struct.pack(">BIHB", 1, 8192, Op.CONNECT, 0))   # within max_frame (64 KiB)
        seen = w.wait_closed(timeout=30)
        assert [e.code for e in seen if hasattr(e, "code")] == [ErrorCode.FRAME_TOO_LARGE]
    finally:
        s.close()
    w = Peer(broker.port, "LOCK-B")                                # after AUTH: full limit
    try:
        w.auth_lock(keys["LOCK-B"])
        assert w.publish("lock.events", 99, payload=b"z" * 20000) is not None
    finally:
        w.close()


def test_challenges_of_closed_connections_are_forgotten(env):
    broker, _, _, _ = env
    for _ in range(20):
        w = Peer(broker.port, "LOCK-A")
        w.hello(1)
        w.close()
    deadline = time.monotonic() + 30
    while broker.metrics()["lockmq_security_challenges_outstanding"] > 0:
        assert time.monotonic() < deadline, "challenges of closed connections kept"
        time.sleep(0.05)


def _stored(broker, token: str, topic: str) -> int:
    admin = Peer(broker.port, "")
    try:
        admin.auth_token(token)
        topics = {t["topic"]: t for t in admin.admin("topics")["topics"]}
    finally:
        admin.close()
    return topics[topic]["queue_end"] if topic in topics else 0


def test_publishes_pipelined_behind_a_refused_auth_are_never_stored(env):
    """SPEC 2, "Pipelined requests": what follows a refused AUTH is never read."""
    broker, _, _, tok = env
    w = Peer(broker.port, "LOCK-A")
    try:
        early = [(Op.PUBLISH, Publish("lock.pipelined", s, 0, b"x" * 24).encode())
                 for s in (1, 2)]
        err = refusal(lambda: w.auth_lock(os.urandom(32), early=early))
        assert err.code == ErrorCode.AUTH_FAILED
        assert w.read(5) is None                # closed, the publishes unanswered
    finally:
        w.close()
    assert _stored(broker, tok["ops"], "lock.pipelined") == 0


def test_publishes_pipelined_behind_auth_with_frame_macs(env):
    """The session key is known when the AUTH is sent: pipelined frames are sealed
    (counter 0 onwards), the CONNECT_ACK is the broker's first tagged frame."""
    broker, _, keys, tok = env
    w = Peer(broker.port, "LOCK-C")
    try:
        early = [(Op.PUBLISH, Publish("lock.pipelined-mac", s, 0, b"x" * 24).encode())
                 for s in (1, 2, 3)]
        w.auth_lock(keys["LOCK-C"], early=early, mac=True)
        assert w.session.mac_key is not None
        for o in w.early_opaques:
            f = w.answer_frame(o)
            w.session.receive(f)               # its tag checked and stripped
            assert decode_body(f.opcode, f.body).status == PublishAck.STORED
    finally:
        w.close()
    assert _stored(broker, tok["ops"], "lock.pipelined-mac") == 3


def _sealed_publishes(w: Peer, topic: str, seqs: range) -> list[bytes]:
    return [w.session.seal(Op.PUBLISH, w.sn, Publish(topic, s, 0, b"x" * 24).encode(),
                           w.next_opaque()) for s in seqs]


def test_sealed_publishes_read_in_one_write_are_stored_and_acked_in_order(env):
    """A run of sealed PUBLISH frames is opened frame by frame and stored as one run;
    a HEARTBEAT in the middle of the write ends the run and is answered in its place.
    The lock's session opens every answer in the order it came: each tag carries the
    broker's frame counter, so an answer out of its place would fail."""
    broker, _, keys, tok = env
    w = Peer(broker.port, "LOCK-E")
    try:
        w.auth_lock(keys["LOCK-E"], mac=True)
        first = _sealed_publishes(w, "lock.sealed-run", range(1, 6))
        heartbeat = w.session.seal(Op.HEARTBEAT, w.sn, Heartbeat(0, 5).encode(),
                                   w.next_opaque())
        last = _sealed_publishes(w, "lock.sealed-run", range(6, 9))
        w.raw(b"".join(first + [heartbeat] + last))
        got = []
        while sum(1 for op, _ in got if op == Op.PUBLISH_ACK) < 8:
            f = w.read()
            assert f is not None, got
            w.session.receive(f)                # its tag checked, in order
            got.append((f.opcode, f.opaque))
        acks = [o for op, o in got if op == Op.PUBLISH_ACK]
        assert acks == sorted(acks) and len(set(acks)) == 8
    finally:
        w.close()
    assert _stored(broker, tok["ops"], "lock.sealed-run") == 8


def test_an_altered_frame_in_a_sealed_run_stores_the_frames_before_it_only(env):
    """The frames before the altered one were good: stored (their acks go down with the
    connection, closed at once on BAD_MAC). The lock sends its events again on its next
    session: those are acknowledged as duplicates, the rest stored, none twice."""
    broker, _, keys, tok = env
    w = Peer(broker.port, "LOCK-F")
    try:
        w.auth_lock(keys["LOCK-F"], mac=True)
        frames = _sealed_publishes(w, "lock.sealed-cut", range(1, 7))
        bad = bytearray(frames[3])
        bad[-5] ^= 1                             # inside the tag
        body = bytes(bad[:-2])
        frames[3] = body + crc16(body).to_bytes(2, "big")   # the CRC made right again
        w.raw(b"".join(frames))
        got = []
        while (f := w.read()) is not None:       # until the broker closes
            got.append(f)
        assert [f.opcode for f in got] == [Op.ERROR]
        w.session._open(got[0])                  # sealed: the broker's next frame
        assert ErrorReply.decode(got[0].body).code == ErrorCode.BAD_MAC
    finally:
        w.close()
    wait_for(lambda: _stored(broker, tok["ops"], "lock.sealed-cut") == 3,
             "the three good records stored")
    w = Peer(broker.port, "LOCK-F")
    try:
        w.auth_lock(keys["LOCK-F"], mac=True)
        w.raw(b"".join(_sealed_publishes(w, "lock.sealed-cut", range(1, 7))))
        statuses = []
        for _ in range(6):
            f = w.read()
            w.session.receive(f)
            statuses.append(PublishAck.decode(f.body).status)
        assert statuses == [PublishAck.DUPLICATE] * 3 + [PublishAck.STORED] * 3
    finally:
        w.close()
    assert _stored(broker, tok["ops"], "lock.sealed-cut") == 6
