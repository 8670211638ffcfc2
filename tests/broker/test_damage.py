"""A damaged record never stalls a consumer (issue 34): a real ``lockmq broker``
process restarted on a data directory with a flipped byte in a closed segment. The
clusters pass over the damaged record (log line, counter, a dead-letter entry naming
its queue offset) and get every intact acknowledged record; ``clusters reset
--to-offset`` takes the queue offsets the broker names."""

from __future__ import annotations

import os

import pytest

from lockmq.store.inspect import iter_records
from lockmq.store.names import list_segments, segment_name
from lockmq.testing import BrokerProcess, open_peer
from lockmq.testing.cli import run_cli

TOPIC = "ev"
N = 1200


def _drain(port: int, cluster: str, limit: int = 10 * N) -> list[str]:
    ids: list[str] = []
    with open_peer(port) as cons:
        sub = cons.subscribe(TOPIC, cluster).sub_id
        empty = 0
        while empty < 2 and len(ids) < limit:
            got = cons.pull(sub, 200, wait_ms=300).messages
            empty = 0 if got else empty + 1
            if got:
                cons.ack(sub, [m.lease for m in got])
                ids.extend(m.message_id for m in got)
    return ids


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_damaged_record_is_skipped_by_every_cluster(tmp_path, checkpoint):
    data = tmp_path / "data"
    b = BrokerProcess(str(data), {"broker": {"auth": "off"},
                                  "store": {"segment_bytes": 16384}})
    try:
        acked = []
        with open_peer(b.port, sn="LOCK-1") as p:
            for seq in range(N):
                p.publish(TOPIC, seq, b"r" * 24)
                acked.append(f"LOCK-1:{seq}")
        first = _drain(b.port, "early", limit=100)   # a cluster with a saved position
        assert first == acked[:len(first)]
        assert b.stop() == 0
        seg_dir = os.path.join(data, "message.log")
        bases = list_segments(seg_dir)
        assert len(bases) >= 4
        mid = bases[len(bases) // 2]
        victim = next(r for r in iter_records(str(data), mid)
                      if r.topic == TOPIC and r.offset > mid)
        with open(os.path.join(seg_dir, segment_name(mid)), "r+b") as f:
            f.seek(victim.offset - mid + 60)
            c = f.read(1)[0]
            f.seek(victim.offset - mid + 60)
            f.write(bytes([c ^ 0x01]))
        if not checkpoint:
            os.unlink(os.path.join(data, "checkpoint"))
        mark = b.mark()
        b.start()
        lost = f"{victim.sn}:{victim.seq}"
        want = [m for m in acked if m != lost]
        fresh = _drain(b.port, "fresh")
        assert fresh == want
        line = b.wait_log("cluster_skipped_damaged", start=mark)
        assert "cluster=fresh" in line or "cluster=early" in line
        early = _drain(b.port, "early")
        assert first + early == want
        with open_peer(b.port) as admin:
            dlq = admin.admin("dlq.list", cluster="fresh")
            [entry] = dlq["messages"]
            assert entry["reason"] == "damaged record skipped" and entry["payload_len"] == 0
            stats = admin.admin("clusters")
            fresh_info = next(c for c in stats["clusters"] if c["name"] == "fresh")
            assert fresh_info["stats"]["damaged_skipped"] == 1
        # the damaged record's queue offset is the one the CLI takes
        q = int(victim.seq)   # one producer, one topic: queue offset == seq
        assert f"queue_offset={q}" in line
        assert run_cli("clusters", "--broker", b.address, "reset", "fresh",
                       "--to-offset", str(q)) == 0
        again = _drain(b.port, "fresh")
        assert again == want[q:]
        assert b.stop() == 0
    finally:
        b.kill()


def test_a_lost_positions_file_is_restored_not_replayed(tmp_path):
    data = tmp_path / "data"
    b = BrokerProcess(str(data), {"broker": {"auth": "off"}})
    try:
        with open_peer(b.port, sn="LOCK-1") as p:
            for seq in range(300):
                p.publish(TOPIC, seq, b"r" * 24)
        assert len(_drain(b.port, "c1")) == 300
        assert b.stop() == 0
        os.unlink(os.path.join(data, "consume-c1.log"))
        mark = b.mark()
        b.start()
        line = b.wait_log("event=positions_restored", start=mark)
        assert "c1" in line and "missing" in line
        assert _drain(b.port, "c1") == []           # nothing acknowledged comes again
        assert b.stop() == 0
    finally:
        b.kill()


def test_subscribe_on_a_full_disk_answers_storage_full_and_leaves_nothing(tmp_path):
    import subprocess

    from lockmq.protocol import ErrorCode
    from lockmq.testing import Refused, refusal

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        data = mnt / "data"
        b = BrokerProcess(str(data), {"broker": {"auth": "off"},
                                      "store": {"segment_bytes": 256 * 1024,
                                                "preallocate_bytes": 0}})
        try:
            full = 0
            with open_peer(b.port, sn="LOCK-1") as p:
                for seq in range(100_000):
                    try:
                        p.publish(TOPIC, seq, b"r" * 500)
                    except Refused as exc:
                        assert exc.code == int(ErrorCode.STORAGE_FULL), exc
                        full += 1
                        if full >= 3:
                            break
            assert full >= 3, "the disk never filled"
            with open_peer(b.port) as cons:
                got = refusal(lambda: cons.subscribe(TOPIC, "newcomer"))
            assert got.code == int(ErrorCode.STORAGE_FULL), got
            assert not [n for n in os.listdir(data) if n.endswith(".tmp")]
            assert not os.path.exists(os.path.join(data, "consume-newcomer.log"))
        finally:
            b.kill()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
