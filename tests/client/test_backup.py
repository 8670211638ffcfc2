"""`lockmq store backup` of a running broker process under concurrent publishing, and
`lockmq store restore`: every record acknowledged before the backup began is readable
from a broker started on the restore; positions, devices and tokens come along."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from lockmq.client import AsyncConsumer, AsyncProducer
from lockmq.store import open_store
from lockmq.store.positions import parse

from lockmq.testing import LOCKMQ_COMMAND, BrokerProcess, wait_for_async

DEADLINE_S = 60


def _lockmq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LOCKMQ_COMMAND, *args], capture_output=True, text=True, timeout=120)


def _broker(data_dir: str, start: bool = True) -> BrokerProcess:
    # small segments: the backup runs while the log rolls from one to the next
    return BrokerProcess(data_dir, {"broker": {"auth": "off", "position_flush_ms": 20},
                                    "store": {"segment_bytes": 65536}}, start=start)


def _saved_position(data_dir: str, cluster: str, topic: str) -> int:
    try:
        with open(os.path.join(data_dir, f"consume-{cluster}.log"), "rb") as f:
            return parse(f.read())[1].get(topic, 0)
    except FileNotFoundError:
        return 0


def test_online_backup_restores_every_acknowledged_record(tmp_path):
    data, backup = str(tmp_path / "data"), str(tmp_path / "backup")
    (tmp_path / "second").mkdir()   # the restored broker's own folder (config, log)
    restored = str(tmp_path / "second" / "data")
    broker = _broker(data, start=False)
    config = broker.write_config()
    # the registry (security.db, master.key) lives in the data dir: it must come along
    r = _lockmq("devices", "add", "BK0001", "--out", str(tmp_path / "BK0001.json"),
                "--broker", "127.0.0.1:6800", "--data-dir", data)
    assert r.returncode == 0, r.stderr
    r = _lockmq("tokens", "create", "billing", "--consume", "doors", "--data-dir", data)
    assert r.returncode == 0, r.stderr
    broker.start()
    port = broker.port
    try:
        async def main():
            producer = AsyncProducer(f"127.0.0.1:{port}", producer_id="backup-test",
                                     send_timeout_s=60)
            await producer.connect()
            handled: list[str] = []
            consumer = AsyncConsumer(f"127.0.0.1:{port}", topic="doors", cluster="app",
                                     handler=lambda msg: handled.append(msg.id),
                                     max_workers=1)
            await consumer.start()
            acked: list[str] = []
            stop = asyncio.Event()

            async def publish(worker: int) -> None:
                i = 0
                while not stop.is_set():
                    res = await producer.send("doors", b"w%d-%d " % (worker, i) + b"x" * 80)
                    acked.append(res.message_id)
                    i += 1

            publishers = [asyncio.ensure_future(publish(w)) for w in range(8)]
            # several segments and a saved cluster position before the backup starts
            await wait_for_async(lambda: len(acked) >= 2000 and
                                 _saved_position(data, "app", "doors") > 0,
                                 "records and positions", DEADLINE_S)
            position_before = _saved_position(data, "app", "doors")
            backup_proc = await asyncio.create_subprocess_exec(
                *LOCKMQ_COMMAND, "store", "backup", backup, "--config", config,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # the records acknowledged when the backup has made its directory (after
            # it began, before it copies anything): a superset of those acknowledged
            # before it began, and the log's tail is being written meanwhile
            while not os.path.isdir(backup) and backup_proc.returncode is None:
                await asyncio.sleep(0.001)
            acked_before = set(acked)
            n_before = len(acked)
            out, err = await backup_proc.communicate()
            result = subprocess.CompletedProcess([], backup_proc.returncode, out.decode(),
                                                 err.decode())
            acked_during = len(acked) - n_before
            stop.set()
            await asyncio.gather(*publishers)
            await consumer.stop()
            await producer.close()
            return result, acked_before, acked_during, position_before

        result, acked_before, acked_during, position_before = asyncio.run(main())
    finally:
        broker.kill()   # the original is gone: only the backup is left
    assert result.returncode == 0, result.stderr
    assert acked_during > 0, "publishing did not go on while the backup ran"

    # restore refuses a non-empty target, and a directory that is not a backup
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("x")
    r = _lockmq("store", "restore", backup, str(tmp_path / "busy"))
    assert r.returncode == 1 and "not empty" in r.stderr
    assert sorted(os.listdir(tmp_path / "busy")) == ["keep.txt"]
    r = _lockmq("store", "restore", data, str(tmp_path / "other"))
    assert r.returncode == 1 and "not a complete lockmq backup" in r.stderr
    r = _lockmq("store", "restore", backup, restored)
    assert r.returncode == 0, r.stderr

    # the restore is a clean data directory: recovery has nothing to read or cut
    store = open_store(restored, min_free_bytes=0)
    try:
        rep = store.recovery
        assert (rep.full_scan, rep.scanned_records, rep.bytes_cut) == (False, 0, 0), rep
        assert store.queue_end("doors") >= len(acked_before)
    finally:
        store.close_sync()
    assert _saved_position(restored, "app", "doors") >= position_before
    r = _lockmq("devices", "list", "--data-dir", restored)
    assert r.returncode == 0 and "BK0001" in r.stdout, r.stdout + r.stderr
    r = _lockmq("tokens", "list", "--data-dir", restored)
    assert r.returncode == 0 and "billing" in r.stdout, r.stdout + r.stderr

    # a broker on the restore serves every record acknowledged before the backup
    second = _broker(restored)
    port2 = second.port
    try:
        async def read_all():
            seen: set[str] = set()
            consumer = AsyncConsumer(f"127.0.0.1:{port2}", topic="doors", cluster="verify",
                                     handler=lambda msg: seen.add(msg.id), max_workers=1,
                                     batch=256)
            await consumer.start()
            await wait_for_async(lambda: acked_before <= seen, "the acknowledged records",
                                 DEADLINE_S)
            await consumer.stop()
            return seen

        seen = asyncio.run(read_all())
    finally:
        second.stop()
    assert acked_before <= seen


def _stopped_data_dir(path: str, records: int) -> int:
    """A data directory with ``records`` records in two topics, store closed; returns
    the log end (the newest segment has preallocated zeros after it)."""
    from lockmq.store import NewRecord

    async def fill():
        store = open_store(path, min_free_bytes=0, segment_bytes=4096)
        await store.append([NewRecord("doors" if i % 2 else "alarms", "SN1", i,
                                      1_700_000_000_000, b"p%d" % i) for i in range(records)])
        await store.close()
        return store.log_end

    return asyncio.run(fill())


def test_backup_leaves_out_a_torn_tail_and_refuses_a_bad_destination(tmp_path):
    from lockmq.store.backup import BackupError, backup
    from lockmq.store.names import SEGMENT_DIR, list_segments, segment_name

    data = str(tmp_path / "data")
    log_end = _stopped_data_dir(data, 200)
    seg_dir = os.path.join(data, SEGMENT_DIR)
    base = list_segments(seg_dir)[-1]
    last = os.path.join(seg_dir, segment_name(base))
    assert os.path.getsize(last) > log_end - base   # the zeros ahead
    with open(last, "r+b") as f:   # a record being written when the backup reads it
        f.seek(log_end - base)
        f.write(b"\x40\x00\x00\x00torn")
    rep = backup(data, str(tmp_path / "bk"))
    assert rep.bytes_cut == 8
    assert rep.topics == {"alarms": [0, 100], "doors": [0, 100]}
    assert os.path.getsize(last) > 0   # the source is read, never changed

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for dest, why in ((tmp_path / "full", "not empty"), (tmp_path / "data" / "bk", "inside")):
        with pytest.raises(BackupError, match=why):
            backup(data, str(dest))
    with pytest.raises(BackupError, match="not a lockmq data directory"):
        backup(str(tmp_path / "full"), str(tmp_path / "bk2"))
