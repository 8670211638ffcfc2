"""SIGKILL a writer process at random moments; every acknowledged record must survive."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest

from lockmq.store import Store
from lockmq.store.inspect import check_dir

from .helpers import config
from .kill_writer import payload_for

CHILD = os.path.join(os.path.dirname(__file__), "kill_writer.py")


def _run_and_kill(data_dir: str, delay: float, writers: int,
                  flush: str) -> list[tuple[str, int]]:
    """Start the child, SIGKILL it ``delay`` s after READY, return the acks it printed."""
    proc = subprocess.Popen([sys.executable, CHILD, data_dir, str(writers), flush],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == b"READY\n", (line, proc.stderr.read() if proc.stderr else b"")
        chunks = []
        deadline = time.monotonic() + delay
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            r, _, _ = select.select([fd], [], [], left)
            if r:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                chunks.append(data)
        proc.send_signal(signal.SIGKILL)
        chunks.append(proc.stdout.read())  # acks printed before the kill, still in the pipe
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    acks = []
    for ln in b"".join(chunks).decode().splitlines():
        parts = ln.split()
        if len(parts) == 3 and parts[0] == "ACK":  # the last line may be cut by the kill
            acks.append((parts[1], int(parts[2])))
    return acks


@pytest.mark.parametrize("flush,kills", [("sync", 10), ("async", 5)])
def test_sigkill_at_random_moments_loses_no_acknowledged_record(data_dir, flush, kills):
    """In async mode an ack means "written": a killed process (not a power cut)
    must not lose those either."""
    rnd = random.Random(1234)
    acked: set[tuple[str, int]] = set()
    for i in range(kills):
        acked.update(_run_and_kill(str(data_dir), rnd.uniform(0.0, 0.35),
                                   rnd.choice([1, 8, 40]), flush))
        s = Store.open(config(data_dir, segment_bytes=16 * 1024))
        try:
            found: dict[tuple[str, int], int] = {}
            for topic in s.topics():
                got = s.read(topic, 0, 10**7)
                assert [g.queue_offset for g in got] == list(range(s.queue_end(topic)))
                for g in got:
                    assert g.topic == f"t{g.seq % 3}"
                    assert g.payload == payload_for(g.sn, g.seq), "garbage record"
                    assert g.headers == ({"w": int(g.sn[1:])} if g.seq % 5 == 0 else None)
                    assert (g.sn, g.seq) not in found, "stored twice"
                    found[(g.sn, g.seq)] = g.offset
            missing = acked - found.keys()
            assert not missing, f"after kill {i}: acknowledged but lost: {sorted(missing)[:5]}"
            by_sn: dict[str, list[int]] = {}
            for sn, seq in found:
                by_sn.setdefault(sn, []).append(seq)
            for sn, seqs in by_sn.items():
                assert sorted(seqs) == list(range(max(seqs) + 1)), f"hole in {sn}"
                assert s.last_seq(sn) == max(seqs)
        finally:
            s.close_sync()
        assert check_dir(str(data_dir)).ok
    assert len(acked) > 20  # the kills were not all before the first ack
