"""Trust round 2, item 2: sequence numbers that cannot be poisoned or wrapped into loss
(SPEC 2, "Sequence numbers"), over real TCP with the real firmware.

Seen live: a hijacked session stored seq 0xFFFFFFFE for LOCK-0001; when the real lock
later connected, its numbers wrapped past 2^32 to 0, the broker acked every following
event as a duplicate and the lock deleted them: two tamper events gone. The hijack is
closed by the session transcript (test_transcript.py); here the store already holds a
far-ahead seq for the lock (written by hand with its key, standing in for any way a
wrong number gets there), and the real lock's events are still stored, once each.
"""

from __future__ import annotations

import pytest

from lockmq.protocol import NO_SEQ
from lockmq.security import Permissions
from lockmq.testing import Lock, Peer, SecureBroker, require_micropython
from lockmq.testing.wire import drain

pytestmark = pytest.mark.timeout(180)

SN = "LOCK-0001"
POISON = 0xFFFFFFFE


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("seq"),
                       tokens={"reader": Permissions(consume=("lock.*",))})
    yield env, env.start()
    env.close()


def _board(env: SecureBroker, key: bytes):
    from lockmq.firmware_tools.build import DeviceConfig, build_folder
    return build_folder(env.root / "board", DeviceConfig(
        sn=SN, key=key.hex(), brokers=[("127.0.0.1", env.broker.port)], hw="sim",
        extra={"backoff_min_ms": 100, "backoff_max_ms": 400}), cards=[])


def test_a_far_ahead_seq_never_turns_a_locks_events_into_duplicates(env):
    require_micropython()
    secure, broker = env
    key = secure.add_locks(SN)[SN]
    # A record far ahead of anything the lock will number, under its SN.
    with Peer(broker.port, SN) as w:
        assert w.auth_lock(key).last_seq == NO_SEQ
        assert w.publish("lock.events", POISON).status == 0
    with Peer(broker.port, "") as reader:
        reader.auth_token(secure.tok["reader"])
        sub = reader.subscribe("lock.events", "audit").sub_id
        lock = Lock(_board(secure, key))
        try:
            # The lock's numbers are provisional (fresh flash): the broker's last_seq is
            # far past the ceiling, so the lock keeps its own and says so.
            lock.expect(r"W seq floor_ignored broker_last=%d" % POISON, timeout=30)
            lock.expect(r"I net connected", timeout=30)
            for _ in range(2):
                lock.send("event tamper")
            lock.expect(r"I evt acked seq=\d+$", timeout=30)
            lock.wait_drained()
            # Restarted (numbering now trusted): the broker's number is still refused,
            # the next event still stored.
            lock.restart()
            lock.expect(r"I net connected", timeout=30)
            lock.send("event tamper")
            lock.wait_drained()
            acks = lock.grep(r"I evt acked seq=(\d+)( dup)?$")
            assert len(acks) == 3 and not any(m.group(2) for m in acks), lock.log()
            seqs = sorted(int(m.group(1)) for m in acks)
            assert seqs[-1] < POISON and len(set(seqs)) == 3
            assert len(lock.grep(r"W seq floor_ignored")) >= 2
        finally:
            lock.close()
        # Every one of them stored, once: the consumer sees the poison and the three.
        got = drain(reader, sub, 4)
        ids = sorted(m.seq for m in got if m.sn == SN)
        assert ids == seqs + [POISON]
