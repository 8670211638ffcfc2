"""Scheduled commands over real TCP, to the real firmware: rights are checked when the
command is scheduled; at its not-before time it enters the command path and the lock
runs it (never earlier)."""
from __future__ import annotations

import struct
import time

from lockmq.protocol import CommandKind, ErrorCode
from lockmq.security import Permissions
from lockmq.testing import Lock, Peer, SecureBroker, refusal, require_micropython, wait_for
from lockmq.testing.lock import build_flash, set_config

from .helpers import cancel, command_at

SN = "SC-1"


def test_scheduled_unlock_reaches_the_lock_at_its_time(tmp_path):
    require_micropython()
    env = SecureBroker(tmp_path, {"scheduled": {"max_sleep_ms": 50}}, locks=[SN], tokens={
        "ops": Permissions(command=(f"unlock:{SN}",)), "nobody": Permissions(),
        "root": Permissions(admin=True)})
    broker = env.start()
    lock = None
    svc, stranger, admin = Peer(broker.port, ""), Peer(broker.port, ""), Peer(broker.port, "")
    try:
        svc.auth_token(env.tok["ops"])
        stranger.auth_token(env.tok["nobody"])
        admin.auth_token(env.tok["root"])
        not_before = time.time() * 1000 + 1500
        args = struct.pack(">H", 3)
        assert refusal(lambda: command_at(stranger, SN, CommandKind.UNLOCK, args,
                                          not_before)).code == ErrorCode.FORBIDDEN
        sid = command_at(svc, SN, CommandKind.UNLOCK, args, not_before, cmd_id=5)
        assert refusal(lambda: cancel(stranger, sid)).code == ErrorCode.INVALID_ARGUMENT
        listed = admin.admin("scheduled.list")
        assert [i["id"] for i in listed["items"]] == [sid] and listed["items"][0]["target"] == SN
        folder = build_flash(tmp_path / "board", SN, env.keys[SN],
                             [("127.0.0.1", broker.port)], cards=[])
        set_config(folder, backoff_min_ms=100, backoff_max_ms=500)
        lock = Lock(folder)
        lock.expect(r"I cmd unlock id=\d+ ok", timeout=60)
        assert time.time() * 1000 >= not_before        # the broker held it until then
        wait_for(lambda: admin.admin("scheduled.list")["recent_command_results"],
                 "the lock's result")
        [res] = admin.admin("scheduled.list")["recent_command_results"]
        assert res["id"] == sid and res["status"] == 0 and res["target"] == SN
    finally:
        for p in (svc, stranger, admin):
            p.close()
        if lock is not None:
            lock.close()
        env.close()
