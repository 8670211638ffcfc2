"""Soak at time-scale: a simulated month of a 500-lock building in a few minutes.

A real broker runs in a thread on a :class:`lockmq.clock.ManualClock`; real TCP, real
files with fsync. Every simulated hour: the clock moves one hour, the broker's
retention sweep runs (it closes the hour's segment -- ``segment_ms`` -- expires
unused clusters, applies retention, moves clusters that fell behind), the closed
segments are exported (``lockmq export``), every lock sends a heartbeat record and
some events, and three clusters read ``lock.events``: ``live`` reads everything,
``lagging`` reads a little each hour, ``abandoned`` stops on day 3 and never returns.

It ends with the checks of issue 12: disk use bounded by retention, every
acknowledged event delivered once to ``live``, ``abandoned`` expired, ``lagging``
skipped forward (counted), and the exports holding every acknowledged record.

    .venv/bin/python bench/soak.py                     # 30 days, 500 locks (minutes)
    .venv/bin/python bench/soak.py --days 4 --locks 50 --retention-days 1

Prints the numbers, the machine and the path of a PNG of disk use over simulated
time (``pip install -e '.[bench]'`` for matplotlib). ``tests/broker/test_soak.py``
runs a short version in the default suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from lockmq.clock import ManualClock
from lockmq.export import export
from lockmq.protocol import Op, Publish, PublishAck
from lockmq.store.records import scan
from lockmq.testing import BrokerThread, Peer, open_peer

HOUR = 3600 * 1000
DAY = 24 * HOUR
T0 = 1_767_225_600_000   # 2026-01-01T00:00:00Z


def calls(peer: Peer, requests: list[tuple[int, bytes]]) -> list[Any]:
    """Send ``(opcode, body)`` requests back to back (pipelined), then collect their
    decoded answers, in order."""
    opaques = [peer.send(opcode, body) for opcode, body in requests]
    return [peer.answer(opaque) for opaque in opaques]


def consume(peer: Peer, sub_id: int, limit: int) -> list[Any]:
    """Pull and ack up to ``limit`` messages (what is there now); returns them."""
    got: list[Any] = []
    while len(got) < limit:
        batch = peer.pull(sub_id, min(512, limit - len(got))).messages
        if not batch:
            break
        peer.ack(sub_id, [m.lease for m in batch])
        got.extend(batch)
    return got


@dataclass
class SoakResult:
    """What a soak run measured; :meth:`problems` lists every failed check."""

    days: int
    locks: int
    retention_days: float
    hours: list[float] = field(default_factory=list)
    disk_bytes: list[int] = field(default_factory=list)
    bound_bytes: list[int] = field(default_factory=list)
    written_bytes: int = 0
    acked: int = 0
    acked_events: int = 0
    delivered_live: int = 0
    duplicates_live: int = 0
    missing_live: int = 0
    lagging_delivered: int = 0
    lagging_skipped: int = 0
    clusters_left: list[str] = field(default_factory=list)
    clusters_expired: int = 0
    exports: int = 0
    exported_records: int = 0
    export_missing: int = 0
    wall_s: float = 0.0

    def problems(self) -> list[str]:
        """The checks of issue 12 that failed (empty: all passed)."""
        out = []
        over = [h for h, d, b in zip(self.hours, self.disk_bytes, self.bound_bytes) if d > b]
        if over:
            out.append(f"log larger than retention allows at simulated hours {over[:5]}")
        if self.missing_live or self.duplicates_live:
            out.append(f"live cluster: {self.missing_live} missing, "
                       f"{self.duplicates_live} duplicates")
        if "abandoned" in self.clusters_left or self.clusters_expired < 1:
            out.append("the abandoned cluster was not expired")
        if self.lagging_skipped <= 0 or "lagging" not in self.clusters_left:
            out.append("the lagging cluster did not skip forward (or vanished)")
        if self.export_missing:
            out.append(f"{self.export_missing} acknowledged records missing from the exports")
        return out


def _log_bytes(data_dir: str) -> int:
    """Bytes of commit-log segment files on disk (sidecars and indexes are small)."""
    seg_dir = os.path.join(data_dir, "message.log")
    return sum(os.path.getsize(os.path.join(seg_dir, n)) for n in os.listdir(seg_dir)
               if n.endswith(".log"))


def _exported_ids(dest: str) -> set[tuple[str, int]]:
    """(sn, seq) of every record in the export's segments."""
    ids = set()
    seg_dir = os.path.join(dest, "message.log")
    for name in sorted(os.listdir(seg_dir)):
        with open(os.path.join(seg_dir, name), "rb") as fh:
            data = fh.read()
        ids.update((r.sn, r.seq) for r in scan(data, 0, len(data)))
    return ids


def soak(days: int = 30, locks: int = 500, retention_days: float = 7.0,
         offsets_retention_days: float = 7.0, abandon_day: float = 3.0,
         events_per_lock_hour: int = 2, lagging_per_hour: int | None = None,
         work_dir: str | None = None, seed: int = 1) -> SoakResult:
    """Run the simulation (see the module docstring) and return its measurements."""
    rng = random.Random(seed)
    work = work_dir or tempfile.mkdtemp(prefix="lockmq-soak-")
    data_dir, dest = os.path.join(work, "data"), os.path.join(work, "export")
    clock = ManualClock(T0)
    retention_ms = int(retention_days * DAY)
    tables = {
        "broker": {"port": 0, "status_port": 0, "host": "127.0.0.1", "data_dir": data_dir,
                   "auth": "off", "log_level": "WARNING", "retention_interval_s": 3600.0,
                   "position_flush_ms": 50},
        "store": {"min_free_bytes": 0, "segment_ms": HOUR, "retention_ms": retention_ms,
                  "segment_bytes": 8 << 20,
                  # this gateway writes ~10 KB an hour: 4 MiB of zeros ahead would be
                  # most of its disk use, so the checks would say little
                  "preallocate_bytes": 64 << 10},
        "clusters": {"offsets_retention_ms": int(offsets_retention_days * DAY)},
    }
    res = SoakResult(days, locks, retention_days)
    started = time.monotonic()
    broker = BrokerThread(data_dir, clock=clock, **tables).start()
    core = broker.broker.core
    gateway = open_peer(broker.port, "SOAK-GW", timeout=60)
    readers = {name: open_peer(broker.port, f"svc-{name}", timeout=60)
               for name in ("live", "lagging", "abandoned")}
    subs = {name: peer.subscribe("lock.events", name).sub_id for name, peer in readers.items()}
    per_hour = lagging_per_hour or max(1, locks * events_per_lock_hour // 3)
    seq = 0
    acked: set[tuple[str, int]] = set()
    events: set[int] = set()
    seen_live: set[int] = set()
    written: list[int] = []
    log_end = 0
    for hour in range(days * 24):
        clock.advance(HOUR)
        broker.call(core.enforce_retention)
        export(data_dir, dest, clock=clock)
        res.exports += 1
        batch = []
        for lock in range(locks):
            sn = f"LOCK-{lock:04d}"
            batch.append(("lock.heartbeats", json.dumps({"lock": sn}).encode()))
            for _ in range(rng.randint(0, 2 * events_per_lock_hour)):
                batch.append(("lock.events", f"{sn}:unlock:{rng.randrange(1 << 20)}".encode()))
        for i in range(0, len(batch), 1000):
            chunk = batch[i:i + 1000]
            reqs = [(Op.PUBLISH, Publish(topic, seq + k, int(clock.wall_ms()), payload).encode())
                    for k, (topic, payload) in enumerate(chunk)]
            for k, ack in enumerate(calls(gateway, reqs)):
                assert isinstance(ack, PublishAck) and ack.status == PublishAck.STORED
                acked.add(("SOAK-GW", seq + k))
                if chunk[k][0] == "lock.events":
                    events.add(seq + k)
            seq += len(chunk)
        for m in consume(readers["live"], subs["live"], 1 << 30):
            if m.seq in seen_live:
                res.duplicates_live += 1
            seen_live.add(m.seq)
        res.lagging_delivered += len(consume(readers["lagging"], subs["lagging"], per_hour))
        if "abandoned" in readers:
            if hour < abandon_day * 24:
                consume(readers["abandoned"], subs["abandoned"], 1 << 30)
            else:
                readers.pop("abandoned").close()   # never comes back
        written.append(core.store.log_end - log_end)
        log_end = core.store.log_end
        res.hours.append((hour + 1) / 24)
        res.disk_bytes.append(_log_bytes(data_dir))
        # retention may keep what was written in the last retention_ms, plus the
        # segment being written and the one closed since the last sweep, plus the
        # zeros preallocated ahead of the newest record
        keep_h = int(retention_ms // HOUR) + 2
        res.bound_bytes.append(sum(written[-keep_h:]) + core.store.config.preallocate_bytes)
    clock.advance(HOUR)                       # close the last hour, export it
    broker.call(core.enforce_retention)
    export(data_dir, dest, clock=clock)
    res.exports += 1
    stats = gateway.admin("stats")
    clusters = {c["name"]: c for c in gateway.admin("clusters")["clusters"]}
    res.clusters_left = sorted(clusters)
    res.clusters_expired = stats["broker"].get("clusters_expired", 0)
    res.lagging_skipped = clusters.get("lagging", {}).get("skipped", 0)
    res.written_bytes = core.store.log_end
    res.acked, res.acked_events = len(acked), len(events)
    res.delivered_live = len(seen_live)
    res.missing_live = len(events - seen_live)
    exported = _exported_ids(dest)
    res.exported_records = len(exported)
    res.export_missing = len(acked - exported)
    for peer in [gateway, *readers.values()]:
        peer.close()
    broker.stop()
    res.wall_s = time.monotonic() - started
    return res


def plot(res: SoakResult, path: str) -> str:
    """Disk use over simulated time as a PNG (needs matplotlib: the ``bench`` extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(res.hours, [b / 1e6 for b in res.disk_bytes], label="commit log on disk")
    ax.plot(res.hours, [b / 1e6 for b in res.bound_bytes], "--",
            label=f"written in the last {res.retention_days:g} days (+2 h)")
    ax.set_xlabel("simulated day")
    ax.set_ylabel("MB")
    ax.set_title(f"lockmq soak: {res.locks} locks, {res.days} days, "
                 f"retention {res.retention_days:g} days")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--locks", type=int, default=500)
    ap.add_argument("--retention-days", type=float, default=7.0)
    ap.add_argument("--offsets-retention-days", type=float, default=7.0)
    ap.add_argument("--abandon-day", type=float, default=3.0)
    ap.add_argument("--png", default="soak-disk.png", help="where to write the plot")
    ap.add_argument("--work-dir", help="keep the data and export here (default: a temp dir)")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine import machine_facts

    res = soak(args.days, args.locks, args.retention_days, args.offsets_retention_days,
               args.abandon_day, work_dir=args.work_dir)
    print("machine:", json.dumps(machine_facts()))
    print(f"simulated {res.days} days of {res.locks} locks in {res.wall_s:.1f} s "
          f"({res.acked} records acknowledged, {res.acked_events} events)")
    print(f"disk: peak {max(res.disk_bytes) / 1e6:.1f} MB, end {res.disk_bytes[-1] / 1e6:.1f} MB"
          f" (retention bound at the end {res.bound_bytes[-1] / 1e6:.1f} MB)")
    print(f"live cluster: {res.delivered_live} delivered, {res.missing_live} missing, "
          f"{res.duplicates_live} duplicates")
    print(f"lagging cluster: {res.lagging_delivered} delivered, {res.lagging_skipped} skipped")
    print(f"clusters left: {res.clusters_left}; expired: {res.clusters_expired}")
    print(f"exports: {res.exports} runs, {res.exported_records} records, "
          f"{res.export_missing} acknowledged records missing")
    try:
        print("plot:", os.path.abspath(plot(res, args.png)))
    except ImportError:
        print("plot: skipped (pip install -e '.[bench]' for matplotlib)")
    problems = res.problems()
    print("OK: every check of issue 12 passed" if not problems else
          "FAILED: " + "; ".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
