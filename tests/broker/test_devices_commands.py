"""Devices ($devices events, heartbeats, eviction) and downlink commands."""

from __future__ import annotations

import json
import time

from lockmq.protocol import (Command, CommandKind, CommandResult, CommandStatus, ErrorCode, Flag,
                             Heartbeat, Op, Role, decode_body)
from lockmq.testing import Peer, drain, open_peer


def _events(cons: Peer, sub: int, n: int) -> list[dict]:
    return [json.loads(m.payload) for m in drain(cons, sub, n)]


def test_connect_disconnect_and_replace_are_published(broker):
    watch = open_peer(broker.port)
    sub = watch.subscribe("$devices", "ops").sub_id
    lock = open_peer(broker.port, sn="LOCK-9", role=Role.LOCK)
    assert watch.admin("devices")["devices"][0]["sn"] == "LOCK-9"
    lock2 = open_peer(broker.port, sn="LOCK-9", role=Role.LOCK)      # same SN again
    assert lock.read_frame().opcode == Op.DISCONNECT             # the old one is told
    lock2.close()
    ev = _events(watch, sub, 5)
    assert ev[0]["event"] == "broker_start" and "sn" not in ev[0]
    ev = ev[1:]
    assert [(e["sn"], e["event"], e.get("reason")) for e in ev] == [
        ("LOCK-9", "online", None), ("LOCK-9", "offline", "replaced"),
        ("LOCK-9", "online", None), ("LOCK-9", "offline", "disconnected")]
    assert all(e["ts_ms"] > 0 and e["peer"].startswith("127.0.0.1:") for e in ev)
    assert watch.admin("devices")["count"] == 0


def test_heartbeat_is_answered_and_silent_lock_is_evicted(make_broker):
    broker = make_broker(devices={"heartbeat_s": 0.5, "evict_after_s": 2.0,
                                  "sweep_interval_s": 0.1})
    watch = open_peer(broker.port)
    sub = watch.subscribe("$devices", "ops").sub_id
    lock = open_peer(broker.port, sn="LOCK-H", role=Role.LOCK)
    hb = lock.request(Op.HEARTBEAT, Heartbeat(int(time.time() * 1000), 5, 0, 0, 80, 1000).encode())
    assert isinstance(hb, Heartbeat)
    d = watch.admin("devices")["devices"][0]
    assert d["battery_pct"] == 80 and d["uptime_s"] == 5
    hsub = watch.subscribe("$heartbeats", "health").sub_id
    [h] = [json.loads(m.payload) for m in drain(watch, hsub, 1)]
    assert h["sn"] == "LOCK-H" and h["battery_pct"] == 80 and h["uptime_s"] == 5
    # the watcher keeps itself alive with heartbeats; the lock goes silent
    events = []
    deadline = time.monotonic() + 20
    while len(events) < 3 and time.monotonic() < deadline:
        watch.send(Op.HEARTBEAT, b"", flags=Flag.ONEWAY)
        got = watch.pull(sub, 10, wait_ms=150).messages
        if got:
            watch.ack(sub, [m.lease for m in got])
            events += [json.loads(m.payload) for m in got]
    assert [e["event"] for e in events] == ["broker_start", "online", "evicted"]
    assert lock.read_frame().opcode == Op.DISCONNECT
    assert lock.read_frame() is None


def test_command_waits_for_offline_lock_and_result_reaches_sender(broker):
    svc = open_peer(broker.port, sn="door-service")
    op = svc.send(Op.COMMAND, Command("LOCK-7", 42, 0, CommandKind.UNLOCK,
                                      b"\x00\x05").encode())
    assert svc.admin("commands")["queued"] == {"LOCK-7": 1}
    lock = open_peer(broker.port, sn="LOCK-7", role=Role.LOCK)
    f = lock.wait_unsolicited(Op.COMMAND)
    assert f.target == "LOCK-7" and f.kind == CommandKind.UNLOCK and f.args == b"\x00\x05"
    lock.send(Op.COMMAND_RESULT, CommandResult("LOCK-7", f.cmd_id, CommandStatus.OK,
                                               "opened").encode())
    res = decode_body(*(lambda fr: (fr.opcode, fr.body))(svc.wait(op)))
    assert isinstance(res, CommandResult)
    assert (res.cmd_id, res.status, res.detail) == (42, CommandStatus.OK, "opened")


def test_command_to_lock_that_stays_offline_expires(broker):
    svc = open_peer(broker.port, sn="door-service")
    op = svc.send(Op.COMMAND, Command("LOCK-X", 7, int(time.time() * 1000) + 300,
                                      CommandKind.REBOOT).encode())
    f = svc.wait(op, timeout=10)
    res = decode_body(f.opcode, f.body)
    assert res.status == CommandStatus.OFFLINE and res.cmd_id == 7


def test_command_resent_after_lock_reconnects_without_answering(broker):
    svc = open_peer(broker.port, sn="door-service")
    lock = open_peer(broker.port, sn="LOCK-R", role=Role.LOCK)
    op = svc.send(Op.COMMAND, Command("LOCK-R", 1, 0, CommandKind.UNLOCK, b"\x00\x01").encode())
    first = lock.wait_unsolicited(Op.COMMAND)
    lock.close()                                        # gone before answering
    lock2 = open_peer(broker.port, sn="LOCK-R", role=Role.LOCK)
    again = lock2.wait_unsolicited(Op.COMMAND)
    assert again.cmd_id == first.cmd_id
    lock2.send(Op.COMMAND_RESULT, CommandResult("LOCK-R", again.cmd_id, CommandStatus.OK).encode())
    f = svc.wait(op)
    assert decode_body(f.opcode, f.body).status == CommandStatus.OK


def test_a_lock_leaving_takes_back_only_its_own_commands(broker):
    """Commands sent to two locks: the one that drops its link gets its command again
    on reconnect; the other lock's command stays sent (answered once, never resent)."""
    svc = open_peer(broker.port, sn="door-service")
    stay = open_peer(broker.port, sn="LOCK-S", role=Role.LOCK)
    leave = open_peer(broker.port, sn="LOCK-L", role=Role.LOCK)
    op_stay = svc.send(Op.COMMAND, Command("LOCK-S", 1, 0, CommandKind.UNLOCK, b"\x00\x01").encode())
    op_leave = svc.send(Op.COMMAND, Command("LOCK-L", 2, 0, CommandKind.UNLOCK, b"\x00\x01").encode())
    to_stay = stay.wait_unsolicited(Op.COMMAND)
    to_leave = leave.wait_unsolicited(Op.COMMAND)
    assert svc.admin("commands")["awaiting_result"] == 2
    leave.close()                                       # gone before answering
    back = open_peer(broker.port, sn="LOCK-L", role=Role.LOCK)
    assert back.wait_unsolicited(Op.COMMAND).cmd_id == to_leave.cmd_id
    stay.send(Op.COMMAND_RESULT, CommandResult("LOCK-S", to_stay.cmd_id, CommandStatus.OK).encode())
    back.send(Op.COMMAND_RESULT, CommandResult("LOCK-L", to_leave.cmd_id, CommandStatus.OK).encode())
    for op in (op_stay, op_leave):
        f = svc.wait(op)
        assert decode_body(f.opcode, f.body).status == CommandStatus.OK
    assert svc.admin("commands")["awaiting_result"] == 0
    # a round trip after all of it: nothing was resent to the lock that stayed
    stay.request(Op.HEARTBEAT, Heartbeat(int(time.time() * 1000), 5, 0, 0, 80, 1000).encode())
    assert not [f for f in stay.unsolicited if f.opcode == Op.COMMAND]


def test_command_on_a_replaced_connection_goes_to_the_new_one(broker):
    svc = open_peer(broker.port, sn="door-service")
    old = open_peer(broker.port, sn="LOCK-N", role=Role.LOCK)
    op = svc.send(Op.COMMAND, Command("LOCK-N", 3, 0, CommandKind.UNLOCK, b"\x00\x02").encode())
    first = old.wait_unsolicited(Op.COMMAND)
    new = open_peer(broker.port, sn="LOCK-N", role=Role.LOCK)   # the lock reconnected
    again = new.wait_unsolicited(Op.COMMAND)
    assert again.cmd_id == first.cmd_id
    new.send(Op.COMMAND_RESULT, CommandResult("LOCK-N", again.cmd_id, CommandStatus.OK).encode())
    f = svc.wait(op)
    assert decode_body(f.opcode, f.body).status == CommandStatus.OK


def test_waiting_commands_are_capped_in_bytes_per_sender_and_per_lock(make_broker):
    """Caps on waiting commands count bytes as well as commands, per sender and per
    lock; an answered command gives its room back; a command larger than a cap on
    its own is INVALID_ARGUMENT (waiting would never help), not BUSY."""
    broker = make_broker(commands={"max_pending_bytes_per_sender": 3000,
                                   "max_pending_bytes_per_lock": 2500,
                                   "lock_max_frame_default": 65536})
    svc = open_peer(broker.port, sn="door-service")
    other = open_peer(broker.port, sn="card-sync")

    def cmd(peer: Peer, sn: str, nbytes: int) -> int:
        return peer.send(Op.COMMAND, Command(sn, 1, 0, CommandKind.CARDS_SET,
                                             b"\x00" * nbytes).encode())

    def err(peer: Peer, op: int) -> tuple[int, str]:
        f = peer.wait(op)
        assert f.opcode == Op.ERROR
        e = decode_body(f.opcode, f.body)
        return e.code, e.message

    cmd(svc, "LOCK-B1", 1000)
    cmd(svc, "LOCK-B2", 1000)                           # frames ~1070 bytes each
    code, msg = err(svc, cmd(svc, "LOCK-B3", 1000))
    assert code == ErrorCode.BUSY and "max_pending_bytes_per_sender" in msg
    cmd(other, "LOCK-B1", 1000)                         # the lock's bytes: ~2140 of 2500
    code, msg = err(other, cmd(other, "LOCK-B1", 1000))
    assert code == ErrorCode.BUSY and "max_pending_bytes_per_lock" in msg
    code, msg = err(other, cmd(other, "LOCK-B4", 2600))
    assert code == ErrorCode.INVALID_ARGUMENT and "larger than commands.max_pending_bytes" in msg
    info = svc.admin("commands")
    assert info["held"] == 3 and info["by_sender"]["admin:door-service"]["count"] == 2
    # LOCK-B1 comes online and answers: the room is given back
    lock = open_peer(broker.port, sn="LOCK-B1", role=Role.LOCK)
    for _ in range(2):
        f = lock.wait_unsolicited(Op.COMMAND)
        lock.send(Op.COMMAND_RESULT, CommandResult("LOCK-B1", f.cmd_id, CommandStatus.OK).encode())
    info = svc.admin("commands")
    while info["held"] != 1:                            # results travel asynchronously
        time.sleep(0.02)
        info = svc.admin("commands")
    op = cmd(svc, "LOCK-B3", 1000)
    assert svc.admin("commands")["queued"].get("LOCK-B3") == 1, op


def test_the_connections_admin_op_lists_each_connection_with_its_subscriptions(broker):
    """(The op's name was shadowed by the Admin attribute of the same name: every
    call answered INTERNAL.)"""
    watch = open_peer(broker.port)
    watch.subscribe("$devices", "ops")
    lock = open_peer(broker.port, sn="LOCK-C", role=Role.LOCK)   # (held: a dropped peer closes)
    got = watch.admin("connections")
    assert got["ok"] and got["count"] == 2
    by_name = {c["name"]: c for c in got["connections"]}
    assert by_name["LOCK-C"]["kind"] == "lock" and by_name["LOCK-C"]["subscriptions"] == 0
    assert [c["subscriptions"] for c in got["connections"] if c["name"] != "LOCK-C"] == [1]
    lock.close()
