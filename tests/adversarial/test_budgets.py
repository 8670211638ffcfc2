"""Trust round 2, item 6: per-principal budgets and an admin reserve on every broker-wide
cap (``Admission.share``), over real TCP against ``lockmq broker`` (auth required).

Seen live: a publish token filled the whole scheduled-bytes cap; an admin's scheduled
unlock then got LIMIT_EXCEEDED.
"""

from __future__ import annotations

import struct
import time

import pytest

from lockmq.protocol import CommandKind, ErrorCode, Op, PublishAck
from lockmq.protocol.schedule import CommandAt, CommandScheduled, PublishAt
from lockmq.protocol.txn import TxnPublish
from lockmq.security import Permissions
from lockmq.testing import Peer, Refused, SecureBroker

pytestmark = pytest.mark.timeout(120)

CHUNK = 10_000


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("budgets"), {
        "scheduled": {"max_bytes_total": 100_000, "max_bytes_per_principal": 100_000},
        "transactions": {"max_pending_total": 10, "max_pending_per_principal": 100},
    }, tokens={"flood": Permissions(publish=("orders.*",)),
               "flood2": Permissions(publish=("orders.*",)),
               "ops": Permissions(admin=True)})
    env.add_locks("LOCK-1001")
    yield env, env.start()
    env.close()


def _schedule(peer: Peer, seq: int) -> PublishAck:
    at = int(time.time() * 1000) + 3_600_000
    return peer.request(Op.PUBLISH_AT, PublishAt("orders.later", seq, 0, at,
                                                 b"x" * CHUNK).encode())


def test_one_token_cannot_take_the_scheduled_bytes_an_admins_unlock_needs(env):
    secure, broker = env
    mark = broker.mark()
    with Peer(broker.port, "") as flood, Peer(broker.port, "") as admin:
        flood.auth_token(secure.tok["flood"])
        admin.auth_token(secure.tok["ops"])
        stored = 0
        with pytest.raises(Refused) as ei:
            for seq in range(1, 100):
                assert _schedule(flood, seq).status == PublishAck.STORED
                stored += 1
        assert ei.value.code == ErrorCode.LIMIT_EXCEEDED
        assert "admins reserve" in ei.value.err.message
        assert stored * CHUNK <= 90_000           # never more than all but the reserve
        broker.wait_log(r"scheduled_refused", start=mark)
        # legitimate: the admin's unlock still fits
        at = int(time.time() * 1000) + 3_600_000
        ans = admin.request(Op.COMMAND_AT, CommandAt("LOCK-1001", 1, 0, CommandKind.UNLOCK,
                                                     struct.pack(">H", 3), at).encode())
        assert isinstance(ans, CommandScheduled)
        # another token finds the services' shared part full too: only admins have room
        with Peer(broker.port, "") as other:
            other.auth_token(secure.tok["flood2"])
            with pytest.raises(Refused):
                _schedule(other, 1)


def test_one_token_cannot_take_every_transaction_slot(env):
    secure, broker = env
    with Peer(broker.port, "") as flood, Peer(broker.port, "") as admin:
        flood.auth_token(secure.tok["flood2"])
        admin.auth_token(secure.tok["ops"])
        n = 0
        with pytest.raises(Refused) as ei:
            for seq in range(1, 20):
                flood.request(Op.TXN_PUBLISH, TxnPublish("g", "orders.txn", seq, 0, b"p").encode())
                n += 1
        assert ei.value.code == ErrorCode.LIMIT_EXCEEDED and n == 9      # 10 less the reserve
        ack = admin.request(Op.TXN_PUBLISH, TxnPublish("g", "orders.txn", 1, 0, b"p").encode())
        assert ack.status == PublishAck.STORED
