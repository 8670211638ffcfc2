"""Downlink commands attacked over real TCP against a real ``lockmq broker`` process
(``auth = "required"``), with the real firmware (MicroPython unix port) where a lock
is involved. Issue 10, items 2, 3, 4 and the command side of 12.

Each test shows the attack refused with its error code, visible in the broker's
log and in ``/metrics`` (or the admin ``commands`` op), and the legitimate path
still working: the lock stays connected to its own broker and its events are
acked, the admin's unlock is accepted and delivered.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import pytest

from lockmq.protocol import (VERSION, Auth, AuthMethod, Command, CommandKind, CommandResult,
                             CommandStatus, Connect, ErrorCode, ErrorReply, Flag, Op, Role,
                             auth_proof, decode_body, encode_json, transcript_hash)
from lockmq.security import Permissions
from lockmq.testing import Lock, Peer, Refused, SecureBroker, set_config, wait_for
from lockmq.testing.lock import build_flash


pytestmark = pytest.mark.timeout(240)

UNLOCK = CommandKind.UNLOCK
CARDS = CommandKind.CARDS_SET
CONFIG = CommandKind.CONFIG
REBOOT = CommandKind.REBOOT


# -- one broker per test, with its own registry, tokens and settings ------------------

class Env(SecureBroker):
    """A broker (auth required) with registered locks and tokens."""

    def __init__(self, root: Path, sns: list[str], tokens: dict[str, Permissions],
                 commands: dict[str, Any] | None = None) -> None:
        super().__init__(root, {"commands": commands or {}})
        self.keys = self.add_locks(*sns)
        self.tok = {name: self.token(name, perms, ttl_s=3600) for name, perms in tokens.items()}
        self.port = self.start().port
        self.wires: list[Peer] = []
        self.locks: list[Any] = []

    def service(self, token: str) -> Peer:
        """A service (or admin) connection authenticated with a token."""
        w = Peer(self.port, "")
        self.wires.append(w)
        w.auth_token(self.tok[token])
        return w

    def wire_lock(self, sn: str, max_frame: int = 0) -> Peer:
        """A lock speaking the protocol by hand, stating ``max_frame`` in CONNECT."""
        w = Peer(self.port, sn)
        self.wires.append(w)
        connect = Connect(Role.LOCK, 30, "advtest", VERSION, max_frame).encode()
        ch = w.request(Op.CONNECT, connect)
        cnonce = os.urandom(16)
        th = transcript_hash(sn, 0, connect, ch.encode())
        w.request(Op.AUTH, Auth(AuthMethod.DEVICE_HMAC, cnonce,
                                auth_proof(self.keys[sn], ch.nonce, cnonce, sn, th)).encode())
        return w

    def firmware_lock(self, sn: str) -> Any:
        """The real firmware for ``sn``, pointed at this broker, connected."""
        folder = build_flash(self.root / f"board-{sn}", sn, self.keys[sn],
                             [("127.0.0.1", self.port)], cards=[])
        set_config(folder, backoff_min_ms=100, backoff_max_ms=500)
        lock = Lock(folder)
        self.locks.append(lock)
        lock.expect(rf"^I net connected broker=127.0.0.1:{self.port} mac=1$", timeout=60)
        return lock

    def metric(self, name: str) -> float:
        return self.broker.metrics().get(name, 0.0)

    def close(self) -> None:
        for w in self.wires:
            w.close()
        for lk in self.locks:
            lk.close()
        super().close()


@pytest.fixture
def make_env(tmp_path) -> Callable[..., Env]:
    """``make_env(sns, tokens, commands)``: an :class:`Env`; all are closed after the test."""
    with ExitStack() as stack:
        def make(*args: Any, **kwargs: Any) -> Env:
            env = Env(tmp_path, *args, **kwargs)
            stack.callback(env.close)
            return env

        yield make


# -- small protocol helpers -----------------------------------------------------------

def send_command(svc: Peer, sn: str, kind: int, args: bytes = b"\x00\x02") -> int:
    return svc.send(Op.COMMAND, Command(sn, 1, 0, kind, args).encode())


def sync(w: Peer) -> None:
    """Wait until the broker has handled every frame sent so far on ``w`` (accepted
    commands get no immediate answer; a HEARTBEAT round trip orders after them)."""
    assert w.request(Op.HEARTBEAT, b"") is not None


def refusal(svc: Peer, opaque: int) -> ErrorReply:
    with pytest.raises(Refused) as ei:
        svc.answer(opaque)
    assert ei.value.err is not None, "the broker closed the connection instead of answering"
    return ei.value.err


def admin_op(svc: Peer, op: str) -> dict[str, Any]:
    reply = svc.request(Op.ADMIN_REQUEST, encode_json({"op": op, "args": {}}))
    assert reply["ok"], reply
    return reply


def next_command(lock: Peer) -> Command:
    """The next COMMAND the broker sends this lock (other frames are skipped)."""
    while True:
        f = lock.read()
        assert f is not None, "the broker closed the lock's connection"
        if f.opcode == Op.COMMAND:
            return decode_body(f.opcode, f.body)


def answer_ok(lock: Peer, c: Command) -> None:
    lock.send(Op.COMMAND_RESULT, CommandResult(lock.sn, c.cmd_id, CommandStatus.OK, "done").encode(),
              flags=Flag.RESPONSE)


def cards_args(n: int) -> bytes:
    """A CARDS_SET of ``n`` 8-byte card UIDs: 2 + 9 n bytes."""
    return struct.pack(">H", n) + b"".join(b"\x08" + struct.pack(">Q", i) for i in range(n))


def event_acked(lock: Any) -> None:
    """The lock queues an event and the broker acks it."""
    lock.send("event tamper")
    seq = lock.expect(r"^I evt queued seq=(\d+) type=tamper$", timeout=30).group(1)
    lock.expect(rf"^I evt acked seq={seq}$", timeout=30)


# -- item 2: rights per command kind; repointing a lock needs config.network -------------

def test_item2_command_rights_per_kind_and_repointing_needs_config_network(make_env):
    env = make_env(["DOOR-1"], {
        "tuner": Permissions(command=("config:DOOR-*",)),
        "opener": Permissions(command=("unlock,cards:DOOR-*",)),
        "legacy": Permissions(command=("DOOR-*",)),          # a token from before kinds
        "netops": Permissions(command=("config.network:DOOR-1",)),
        "ops": Permissions(admin=True),
    })
    evil = socket.create_server(("127.0.0.1", 0))          # where an attacker would send it
    evil.setblocking(False)
    lock = env.firmware_lock("DOOR-1")
    mark = env.broker.mark()
    repoint = {"brokers": [["127.0.0.1", evil.getsockname()[1]]]}
    marked = json.dumps({"network": True, **repoint}).encode()
    unmarked = json.dumps(repoint).encode()
    tls_off = json.dumps({"network": True, "tls": {"enabled": False}}).encode()

    # the attack: a token with the plain config right tries to repoint the lock
    tuner = env.service("tuner")
    for args in (marked, unmarked, tls_off):
        err = refusal(tuner, send_command(tuner, "DOOR-1", CONFIG, args))
        assert err.code == ErrorCode.FORBIDDEN, err
        assert "needs the command right config.network" in err.message
    # ... and rights are per kind: no reboot with config, no config with unlock+cards
    err = refusal(tuner, send_command(tuner, "DOOR-1", REBOOT, b""))
    assert (err.code, err.message) == (ErrorCode.FORBIDDEN, "not permitted: this token may "
                                       "not send reboot commands to lock 'DOOR-1'")
    opener = env.service("opener")
    err = refusal(opener, send_command(opener, "DOOR-1", CONFIG, b'{"heartbeat_s": 20}'))
    assert err.code == ErrorCode.FORBIDDEN and "config commands" in err.message
    # an old plain `command` right now means unlock + cards only, and says how to reissue
    legacy = env.service("legacy")
    for kind, args in ((CONFIG, marked), (REBOOT, b"")):
        err = refusal(legacy, send_command(legacy, "DOOR-1", kind, args))
        assert err.code == ErrorCode.FORBIDDEN and "reissue it" in err.message, err

    # visible: a warning line naming the principal, and the counters
    env.broker.wait_log(r"level=warning event=security_permission_denied "
                        r"reason=command_network_denied name=tuner .*target=DOOR-1", start=mark)
    env.broker.wait_log(r"event=security_permission_denied reason=command_kind_denied "
                        r"name=legacy", start=mark)
    m = env.broker.metrics()
    assert m['lockmq_security_permission_denied_total{reason="command_network_denied"}'] == 4
    assert m['lockmq_security_permission_denied_total{reason="command_kind_denied"}'] == 3
    assert not lock.grep(r"I cmd config")                 # nothing reached the lock

    # the legitimate paths: each right does what it grants, on the real firmware
    assert tuner.answer(send_command(tuner, "DOOR-1", CONFIG, b'{"heartbeat_s": 20}')).status \
        == CommandStatus.OK
    lock.expect(r"^I cmd config id=\d+ ok$", timeout=30)
    assert legacy.answer(send_command(legacy, "DOOR-1", UNLOCK)).status == CommandStatus.OK
    lock.expect(r"^I cmd unlock id=\d+ ok$", timeout=30)
    netops = env.service("netops")
    same_broker = json.dumps({"network": True,
                              "brokers": [["127.0.0.1", env.port], ["127.0.0.1", env.port]]})
    assert netops.answer(send_command(netops, "DOOR-1", CONFIG, same_broker.encode())).status \
        == CommandStatus.OK
    lock.expect(r"^I cmd config id=\d+ ok$", timeout=30)
    # an authorised network change is logged at warning level with who did it
    line = env.broker.wait_log(r"event=security_command_network_change", start=mark)
    assert "level=warning" in line and "name=netops" in line and "target=DOOR-1" in line
    assert "keys=brokers,network" in line and re.search(r"token=[0-9a-f]{16}", line)
    assert env.metric('lockmq_security_command_network_change_total{reason="config.network"}') == 1

    # the lock never left its own broker, and its events are still acked
    event_acked(lock)
    assert not lock.grep(r"W net down")
    with pytest.raises(BlockingIOError):
        evil.accept()
    cfg = json.loads((lock.folder / "config.json").read_text())
    assert cfg["brokers"] == [["127.0.0.1", env.port]] * 2 and cfg["heartbeat_s"] == 20
    assert [d["sn"] for d in admin_op(env.service("ops"), "devices")["devices"]] == ["DOOR-1"]
    evil.close()


# -- item 3: a command larger than the lock can take; a command that breaks the link ---

def test_item3_oversized_command_refused_at_submit_and_link_breakers_not_resent(make_env):
    env = make_env(["DOOR-2", "DOOR-3", "DOOR-4"], {
        "opener": Permissions(command=("unlock,cards:DOOR-*",)),
        "ops": Permissions(admin=True),
    }, commands={"max_delivery_attempts": 3})
    lock = env.firmware_lock("DOOR-2")
    # the firmware stated its frame limit in CONNECT (what its heap can take, at most
    # its decoder's 4 KiB); the broker remembers it per SN
    limit = int(lock.grep(r"^I net frame limit=(\d+)$")[-1].group(1))
    assert 512 <= limit <= 4096
    ops = env.service("ops")
    assert admin_op(ops, "commands")["lock_max_frame"] == {"DOOR-2": limit}
    opener = env.service("opener")
    mark = env.broker.mark()

    # the attack: a 4.7 KB card list, over what the lock can take
    big = cards_args(520)                                   # 4,682 bytes of args
    err = refusal(opener, send_command(opener, "DOOR-2", CARDS, big))
    assert err.code == ErrorCode.INVALID_ARGUMENT, err
    assert f"4752 bytes, over the {limit}-byte frame limit the lock stated" in err.message
    assert f"arguments may be at most {limit - 70} bytes" in err.message
    env.broker.wait_log(rf"level=warning event=command_refused reason=too_large .*"
                        rf"target=DOOR-2 size=4752 limit={limit}", start=mark)
    assert env.metric("lockmq_commands_refused_too_large_total") == 1
    assert admin_op(ops, "commands")["held"] == 0           # nothing held, nothing resent
    # one byte over the limit is refused too; exactly at the limit is delivered
    fits = (limit - 70 - 2) // 9
    err = refusal(opener, send_command(opener, "DOOR-2", CARDS,
                                       cards_args(fits) + b"\x00" * (limit - 70 - 2 - 9 * fits + 1)))
    assert err.code == ErrorCode.INVALID_ARGUMENT and f"{limit + 1} bytes" in err.message

    # legitimate: the largest card list that fits is delivered and run; the lock stays
    # connected to its own broker and its events are acked
    res = opener.answer(send_command(opener, "DOOR-2", CARDS, cards_args(fits)))
    assert (res.status, res.detail) == (CommandStatus.OK, f"{fits} cards"), lock.log()
    lock.expect(r"^I cmd cards id=\d+ ok$", timeout=30)
    event_acked(lock)
    assert not lock.grep(r"W net down")

    # offline: the limit it stated last still applies; a lock never seen gets 4096
    lock.kill()
    wait_for(lambda: not admin_op(ops, "devices")["devices"], "DOOR-2 to go offline")
    err = refusal(opener, send_command(opener, "DOOR-2", CARDS, big))
    assert err.code == ErrorCode.INVALID_ARGUMENT and "limit the lock stated" in err.message
    err = refusal(opener, send_command(opener, "DOOR-4", CARDS, big))
    assert err.code == ErrorCode.INVALID_ARGUMENT and "is assumed to have" in err.message

    # a command that breaks the lock's link every time it arrives is not resent forever:
    # this lock states a large limit, then drops the link whenever the command comes
    w = env.wire_lock("DOOR-3", max_frame=65536)
    op = send_command(opener, "DOOR-3", UNLOCK)
    seen = []
    for attempt in range(3):
        seen.append(next_command(w).cmd_id)
        w.close()                                            # link failure, no answer
        if attempt < 2:
            w = env.wire_lock("DOOR-3", max_frame=65536)
    res = opener.answer(op)
    assert res.status == CommandStatus.FAILED and "dropped its link 3 times" in res.detail
    assert len(set(seen)) == 1                               # the same command each time
    env.broker.wait_log(r"level=warning event=command_undeliverable target=DOOR-3 .*attempts=3",
                        start=mark)
    assert env.metric("lockmq_commands_undeliverable_total") == 1
    # legitimate: the lock comes back; only new commands reach it, and they work
    w = env.wire_lock("DOOR-3", max_frame=65536)
    op = send_command(opener, "DOOR-3", UNLOCK)
    c = next_command(w)
    assert c.cmd_id > seen[0]
    answer_ok(w, c)
    assert opener.answer(op).status == CommandStatus.OK


# -- item 4: one token cannot fill the command queue --------------------------------------

def test_item4_per_token_and_per_lock_caps_keep_room_for_the_admin(make_env):
    flood = Permissions(command=("unlock:DOOR-*",))
    env = make_env(["DOOR-5", "DOOR-6", "DOOR-7"], {
        "flood1": flood, "flood2": flood, "flood3": flood, "late": flood,
        "ops": Permissions(admin=True),
    }, commands={"max_pending_per_sender": 20, "max_pending_per_lock": 30,
                 "max_pending_total": 60, "admin_reserve_pct": 10})
    # services share 27 per lock and 54 in all; admins the full 30 and 60
    ops = env.service("ops")
    mark = env.broker.mark()

    f1 = env.service("flood1")
    # commands to unregistered SNs are refused outright: nothing is held for them
    for op in [send_command(f1, f"DOOR-{i}", UNLOCK) for i in range(100, 150)]:
        assert refusal(f1, op).code == ErrorCode.FORBIDDEN
    assert admin_op(ops, "commands")["held"] == 0

    # one token fills its own cap ...
    ops1 = [send_command(f1, "DOOR-5", UNLOCK) for _ in range(21)]
    err = refusal(f1, ops1[-1])
    assert err.code == ErrorCode.BUSY and err.retry_after_ms > 0
    assert "this sender (token) has 20 commands waiting (commands.max_pending_per_sender)" in err.message
    # ... a second one fills the services' share of a lock ...
    f2 = env.service("flood2")
    ops2 = [send_command(f2, "DOOR-5", UNLOCK) for _ in range(8)]
    err = refusal(f2, ops2[-1])
    assert err.code == ErrorCode.BUSY and "(commands.max_pending_per_lock)" in err.message
    for _ in range(13):
        send_command(f2, "DOOR-6", UNLOCK)
    sync(f2)
    # ... and a third the services' share of the broker
    f3 = env.service("flood3")
    ops3 = [send_command(f3, "DOOR-7", UNLOCK) for _ in range(15)]
    err = refusal(f3, ops3[-1])
    assert err.code == ErrorCode.BUSY and "(commands.max_pending_total)" in err.message
    info = admin_op(ops, "commands")
    assert (info["held"], info["queued"]) == (54, {"DOOR-5": 27, "DOOR-6": 13, "DOOR-7": 14})
    assert sorted(v["count"] for v in info["by_sender"].values()) == [14, 20, 20]
    for w in (f1, f2, f3):                                   # the attackers leave
        w.close()

    # visible: one warning line per cap, and the counters
    for cap in ("max_pending_per_sender", "max_pending_per_lock", "max_pending_total"):
        env.broker.wait_log(rf"level=warning event=command_refused reason=cap .*cap={cap}",
                            start=mark)
    assert env.metric("lockmq_commands_refused_cap_total") == 3
    assert env.metric('lockmq_security_permission_denied_total{reason="unknown_lock"}') == 50

    # another service gets BUSY too (the rest is the admins' reserve) ...
    late = env.service("late")
    err = refusal(late, send_command(late, "DOOR-6", UNLOCK))
    assert err.code == ErrorCode.BUSY and "(commands.max_pending_total)" in err.message
    # ... but the admin's unlock is accepted, for the full lock as for any other
    send_command(ops, "DOOR-5", UNLOCK)
    assert admin_op(ops, "commands")["queued"]["DOOR-5"] == 28
    lock6 = env.wire_lock("DOOR-6")                          # DOOR-6 comes online
    answered = 0
    op = send_command(ops, "DOOR-6", UNLOCK, b"\x00\x05")
    while True:                                              # the 13 queued ones first
        c = next_command(lock6)
        answer_ok(lock6, c)
        answered += 1
        if c.args == b"\x00\x05":
            break
    assert answered == 14
    res = ops.answer(op)
    assert res.status == CommandStatus.OK


# -- item 12 (command side): no telling registered SNs from unregistered ones -------------

def test_item12_unregistered_and_out_of_scope_locks_get_the_same_answer(make_env):
    env = make_env(["DOOR-8", "DOOR-9", "VAULT-1"], {
        "opener": Permissions(command=("unlock:DOOR-*",)),
    })
    env.registry.set_enabled("DOOR-9", False)
    mark = env.broker.mark()
    svc = env.service("opener")
    targets = {
        "VAULT-1": "command_denied",      # registered, outside the token's scope
        "VAULT-2": "command_denied",      # unregistered, outside the scope
        "DOOR-99": "unknown_lock",        # unregistered, inside the scope
        "door-8": "command_denied",       # lookalikes of a registered lock: outside
        "DOOR-8\n": "unknown_lock",       # the (case-sensitive) scope, or unregistered
        "DOOR-8 ": "unknown_lock",
        "DOOR-9": "disabled_lock",        # registered but disabled
    }
    answers = {}
    for sn in targets:
        err = refusal(svc, send_command(svc, sn, UNLOCK))
        answers[sn] = (err.code, err.message, err.retry_after_ms)
    # byte for byte the same answer for every one of them
    assert set(answers.values()) == {
        (ErrorCode.FORBIDDEN, "not permitted: no right to command this lock, or no such lock", 0)}
    # the log and the counters say which it was (for the operator, not the peer)
    for sn, reason in targets.items():
        shown = sn.replace("\n", "\\n")          # the log escapes it
        env.broker.wait_log(rf"event=security_permission_denied reason={reason} name=opener "
                            rf".*target=\"?{re.escape(shown)}", start=mark)
    m = env.broker.metrics()
    assert m['lockmq_security_permission_denied_total{reason="command_denied"}'] == 3
    assert m['lockmq_security_permission_denied_total{reason="unknown_lock"}'] == 3
    assert m['lockmq_security_permission_denied_total{reason="disabled_lock"}'] == 1

    # the legitimate path: the registered lock in scope gets its unlock
    lock = env.wire_lock("DOOR-8")
    op = send_command(svc, "DOOR-8", UNLOCK)
    c = next_command(lock)
    assert (c.target, c.kind) == ("DOOR-8", UNLOCK)
    answer_ok(lock, c)
    assert svc.answer(op).status == CommandStatus.OK
