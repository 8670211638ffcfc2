"""A scheduled command refused when it enters the command path at its time: the
refusal is kept as its result (the service that scheduled it may be gone)."""
from __future__ import annotations

import time

from lockmq.protocol import CommandKind, ErrorCode
from lockmq.testing import BrokerThread, open_peer, wait_for

from .helpers import command_at


def test_a_refusal_at_due_time_is_the_commands_result(tmp_path):
    with BrokerThread(str(tmp_path / "d"), scheduled={"max_sleep_ms": 50},
                      commands={"lock_max_frame_default": 256}) as b, \
            open_peer(b.port) as svc:
        too_big = b"x" * 400      # over the frame limit assumed for a lock never seen
        sid = command_at(svc, "GONE-1", CommandKind.CONFIG, too_big, time.time() * 1000 + 100)
        wait_for(lambda: svc.admin("scheduled.list")["recent_command_results"], "the refusal")
        [res] = svc.admin("scheduled.list")["recent_command_results"]
        assert res["id"] == sid and res["status"] == -int(ErrorCode.INVALID_ARGUMENT)
        assert "frame limit" in res["detail"]
