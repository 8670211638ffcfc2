"""Trust round 2, item 3: every right is checked when it takes effect (one admission
decision, ``lockmq.broker.admission``), over real TCP with the real firmware.

Seen live: a command token sent COMMAND_AT (unlock LOCK-1001 in 8 s), the operator
revoked the token (``lockmq tokens revoke``) -- and 8 s later the real lock logged
``cmd unlock id=1 ok``. Now the revocation ends the token's live session at once and
cancels what it left waiting; the admin's unlock scheduled for the same moment runs.
"""

from __future__ import annotations

import struct
import time

import pytest

from lockmq.protocol import Command, CommandKind, ErrorCode, ErrorReply, Op
from lockmq.protocol.schedule import CommandAt, CommandScheduled
from lockmq.security import Permissions
from lockmq.security.tokens import parse_token
from lockmq.testing import Lock, Peer, SecureBroker, require_micropython, run_cli, wait_for

pytestmark = pytest.mark.timeout(180)

SN = "LOCK-1001"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("admission"),
                       tokens={"opener": Permissions(command=("LOCK-*",)),
                               "ops": Permissions(admin=True)})
    yield env, env.start()
    env.close()


def command_at(peer: Peer, target: str, kind: int, args: bytes, not_before_ms: float,
               cmd_id: int) -> int:
    """Schedule one command; its schedule id."""
    ans = peer.request(Op.COMMAND_AT, CommandAt(target, cmd_id, 0, kind, args,
                                                int(not_before_ms)).encode())
    assert isinstance(ans, CommandScheduled), ans
    return ans.schedule_id


def _closed_with_error(w: Peer) -> None:
    seen = w.wait_closed(timeout=10)
    assert any(isinstance(f, ErrorReply) and f.code == ErrorCode.AUTH_FAILED for f in seen), seen


def _metric(broker, name: str) -> float:
    return sum(v for k, v in broker.metrics().items() if name in k)


def _board(env: SecureBroker, sn: str, key: bytes):
    from lockmq.firmware_tools.build import DeviceConfig, build_folder
    return build_folder(env.root / f"board-{sn}", DeviceConfig(
        sn=sn, key=key.hex(), brokers=[("127.0.0.1", env.broker.port)], hw="sim",
        extra={"backoff_min_ms": 100, "backoff_max_ms": 400}), cards=[])


def test_a_revoked_tokens_scheduled_unlock_never_runs_the_admins_does(env):
    require_micropython()
    secure, broker = env
    key = secure.add_locks(SN)[SN]
    lock = Lock(_board(secure, SN, key))
    opener = Peer(broker.port, "")
    admin = Peer(broker.port, "")
    try:
        lock.expect(r"I net connected", timeout=30)
        opener.auth_token(secure.tok["opener"])
        admin.auth_token(secure.tok["ops"])
        at = time.time() * 1000 + 4000
        unlock = struct.pack(">H", 2)
        mine = command_at(opener, SN, CommandKind.UNLOCK, unlock, at, cmd_id=1)
        ops = command_at(admin, SN, CommandKind.UNLOCK, unlock, at + 300, cmd_id=2)
        waiting = admin.admin("scheduled.list")
        assert {i["id"] for i in waiting["items"]} == {mine, ops}

        # The operator revokes the opener's token: its live session ends at once (not
        # at its next connect) and its waiting unlock is cancelled -- logged, counted,
        # shown to the admin.
        mark = broker.mark()
        tid = parse_token(secure.tok["opener"])[0]
        assert run_cli("tokens", "revoke", tid, "--data-dir", str(secure.data)) == 0
        _closed_with_error(opener)
        broker.wait_log(r"principal_revoked .*" + tid, start=mark)
        broker.wait_log(r"scheduled_cancelled id=%d .*why=revoked" % mine, start=mark)
        listed = wait_for(lambda: (lambda r: r if r["recent_cancelled"] else None)(
            admin.admin("scheduled.list")), "the cancellation written", timeout=10)
        assert [i["id"] for i in listed["items"]] == [ops]
        assert [c["id"] for c in listed["recent_cancelled"]] == [mine]
        assert _metric(broker, "sessions_closed_revoked") >= 1
        assert _metric(broker, "pending_cancelled_revoked") >= 1

        # At the time: only the admin's unlock runs on the real lock.
        lock.expect(r"I cmd unlock id=\d+ ok", timeout=30)
        time.sleep(1.5)
        assert len(lock.grep(r"cmd unlock id=\d+ ok")) == 1
        res = admin.admin("scheduled.result", id=ops)
        assert res["state"] in ("sent", "done")
        assert admin.admin("scheduled.result", id=mine)["state"] == "unknown"

        # And the revoked token cannot come back.
        with Peer(broker.port, "") as again:
            with pytest.raises(Exception):
                again.auth_token(secure.tok["opener"])
    finally:
        lock.close()
        opener.close()
        admin.close()


def test_a_command_held_for_an_offline_lock_is_checked_when_it_is_sent(env):
    """A command waiting for an offline lock, its sender's token revoked: it is
    cancelled at the revocation, and never reaches the lock when it connects."""
    secure, broker = env
    sn = "LOCK-1002"
    key = secure.add_locks(sn)[sn]
    tok = secure.token("opener2", Permissions(command=("LOCK-*",)))
    svc = Peer(broker.port, "")
    svc.auth_token(tok)
    svc.send(Op.COMMAND, Command(sn, 5, 0, CommandKind.UNLOCK, b"\x00\x02").encode())
    time.sleep(0.3)   # queued: the lock is offline
    mark = broker.mark()
    assert run_cli("tokens", "revoke", "opener2", "--data-dir", str(secure.data)) == 0
    broker.wait_log(r"command_cancelled target=%s .*why=" % sn, start=mark)
    svc.close()
    with Peer(broker.port, sn) as lock:
        lock.auth_lock(key)
        with pytest.raises(TimeoutError):     # nothing comes down
            lock.read(timeout=1.5)
    # the legitimate path: a live token's command reaches the lock
    with Peer(broker.port, "") as admin, Peer(broker.port, sn) as lock:
        admin.auth_token(secure.tok["ops"])
        lock.auth_lock(key)
        admin.send(Op.COMMAND, Command(sn, 6, 0, CommandKind.UNLOCK, b"\x00\x02").encode())
        f = lock.read(timeout=10)
        assert f is not None and f.opcode == Op.COMMAND


def test_disabling_or_rekeying_a_lock_ends_its_session_at_once(env):
    secure, broker = env
    keys = secure.add_locks("LOCK-1003", "LOCK-1004", "LOCK-1005")
    for sn, argv in (("LOCK-1003", ("devices", "disable", "LOCK-1003")),
                     ("LOCK-1004", ("devices", "rekey", "LOCK-1004", "--out",
                                    str(secure.root / "LOCK-1004.json"))),
                     ("LOCK-1005", ("devices", "remove", "LOCK-1005"))):
        w = Peer(broker.port, sn)
        w.auth_lock(keys[sn])
        assert w.publish("lock.events", 1).status == 0
        mark = broker.mark()
        assert run_cli(*argv, "--data-dir", str(secure.data)) == 0
        _closed_with_error(w)
        broker.wait_log(r"principal_revoked who=%s" % sn, start=mark)
        w.close()
    # the re-keyed lock is in again with its new key; the disabled one is not
    import json
    new = bytes.fromhex(json.loads((secure.root / "LOCK-1004.json").read_text())["key"])
    with Peer(broker.port, "LOCK-1004") as w:
        w.auth_lock(new)
        assert w.publish("lock.events", 2).status == 0
    with Peer(broker.port, "LOCK-1003") as w:
        with pytest.raises(Exception) as ei:
            w.auth_lock(keys["LOCK-1003"])
        assert getattr(ei.value, "code", None) == ErrorCode.AUTH_FAILED
