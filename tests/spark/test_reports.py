"""Every report against the same numbers computed in plain Python from the generated records.

The log is written with the FORMAT.md test writer, not the storage engine, because
the reports depend on broker times, which the engine stamps with the wall clock.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections import defaultdict

import pytest

from lockmq.protocol import EventType, LockEvent, Result
from lockmq.spark import generate
from lockmq.spark.ingest import ingest
from lockmq.spark.layout import list_segments
from lockmq.spark.reports import ReportSettings, run_reports

SETTINGS = ReportSettings(burst_count=5, burst_window_s=120, offline_after_s=120, clock_tolerance_s=30)
ALARMS = {EventType.DOOR_LEFT_OPEN, EventType.TAMPER, EventType.LOW_BATTERY}


def _date(us: int) -> dt.date:
    return dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).date()


def _us(ts: dt.datetime) -> int:
    return round(ts.timestamp() * 1_000_000)


@pytest.fixture(scope="module")
def reported(spark, tmp_path_factory, fleet_records):
    root = tmp_path_factory.mktemp("reports")
    gw1 = root / "landing" / "gw-1"
    generate.write_log(str(gw1), fleet_records, segment_bytes=64 * 1024)
    (gw1 / "manifest.json").write_text(json.dumps({"gateway_id": "gw-1"}))
    # a second gateway heard some of the same locks: two segments arrive twice
    gw2 = root / "landing" / "gw-2"
    os.makedirs(gw2 / "message.log")
    (gw2 / "manifest.json").write_text(json.dumps({"gateway_id": "gw-2"}))
    copied = list_segments(str(gw1))[3:5]
    for seg in copied:
        shutil.copy(seg.path, gw2 / "message.log")
    wh = str(root / "wh")
    res = ingest(spark, [str(root / "landing")], wh)
    lines = run_reports(spark, wh, settings=SETTINGS, echo=lambda s: None)
    out = os.path.join(wh, "reports")
    tables = {name: spark.read.parquet(os.path.join(out, name)).collect() for name in lines}
    dup_sns = defaultdict(int)  # SN of every record in the copied segments, read by hand
    for seg in copied:
        data = open(seg.path, "rb").read()
        pos = 0
        while pos < len(data):
            n = int.from_bytes(data[pos:pos + 4], "little")
            t, s = int.from_bytes(data[pos + 10:pos + 12], "little"), data[pos + 12]
            dup_sns[data[pos + 40 + t:pos + 40 + t + s].decode()] += 1
            pos += 4 + n
    return res, tables, lines, dup_sns


def test_ingest_counts(reported, fleet_records):
    res, _, lines, dup_sns = reported
    assert res.new == len(fleet_records) and res.duplicates == sum(dup_sns.values()) > 0
    assert set(lines) == {"daily_activity", "failed_bursts", "offline_periods", "clock_delay",
                          "seq_gaps", "seq_summary"}


def _events(recs):
    for r in recs:
        if r.topic == generate.EVENT_TOPIC:
            yield r, LockEvent.decode(r.payload)


def _failed(ev: LockEvent) -> bool:
    return ev.event_type == EventType.FAILED_ATTEMPT or (ev.event_type == EventType.UNLOCK and ev.result != Result.OK)


def test_daily_activity(reported, fleet_records):
    want: dict = defaultdict(lambda: [0, 0, 0, 0])
    for r, ev in _events(fleet_records):
        row = want[(_date(r.broker_ts_us), r.sn)]
        row[0] += ev.event_type == EventType.UNLOCK and ev.result == Result.OK
        row[1] += _failed(ev)
        row[2] += ev.event_type in ALARMS
        row[3] += 1
    got = {(t.date, t.sn): [t.unlocks, t.failed_attempts, t.alarms, t.events] for t in reported[1]["daily_activity"]}
    assert got == {k: v for k, v in want.items()}


def test_failed_bursts(reported, fleet_records):
    n, window = SETTINGS.burst_count, SETTINGS.burst_window_s * 1000
    per_lock = defaultdict(list)
    for r, ev in _events(fleet_records):
        if _failed(ev):
            per_lock[r.sn].append((ev.ts_ms, r.seq))
    want = []
    for sn, att in per_lock.items():
        att.sort()
        t = [a[0] for a in att]
        covered = [False] * len(t)
        for i in range(n - 1, len(t)):
            if t[i] - t[i - n + 1] <= window:
                for k in range(i - n + 1, i + 1):
                    covered[k] = True
        k = 0
        while k < len(t):
            if covered[k]:
                j = k
                while j + 1 < len(t) and covered[j + 1]:
                    j += 1
                want.append((sn, t[k] * 1000, t[j] * 1000, j - k + 1))
                k = j + 1
            else:
                k += 1
    got = sorted((b.sn, _us(b.burst_start), _us(b.burst_end), b.attempts) for b in reported[1]["failed_bursts"])
    assert got == sorted(want)
    assert len({b[0] for b in want}) >= 2  # the generator's bursts are there, the near-misses are not


def test_offline_periods(reported, fleet_records):
    # the lock's timeline from the generated records, in log order (= arrival order)
    line = defaultdict(list)
    for r in fleet_records:
        if not r.sn.startswith("$"):
            line[r.sn].append((r.broker_ts_us, "alive", None))
        elif r.topic == generate.HEARTBEAT_TOPIC:
            line[json.loads(r.payload)["sn"]].append((r.broker_ts_us, "alive", None))
        elif r.topic == generate.DEVICES_TOPIC:
            ev = json.loads(r.payload)
            if ev["event"] == "online":
                line[ev["sn"]].append((r.broker_ts_us, "alive", None))
            elif ev["event"] in ("offline", "evicted") and ev.get("reason") != "replaced":
                line[ev["sn"]].append((r.broker_ts_us, "down", ev.get("reason", ev["event"])))
    want = []
    limit = SETTINGS.offline_after_s * 1e6
    for sn, tl in line.items():
        for k, (t, kind, reason) in enumerate(tl):
            if kind == "down" and (k == 0 or tl[k - 1][1] == "alive"):
                back = next((x[0] for x in tl[k + 1:] if x[1] == "alive"), None)
                want.append((sn, t, back, reason))
            elif kind == "alive" and k + 1 < len(tl) and tl[k + 1][1] == "alive" and tl[k + 1][0] - t > limit:
                want.append((sn, t, tl[k + 1][0], "silent"))
    got = sorted((p.sn, _us(p.offline_from), p.back_online and _us(p.back_online), p.cause)
                 for p in reported[1]["offline_periods"])
    assert got == sorted(want)
    causes = {w[3] for w in want}
    assert causes == {"silent 120 s", "disconnected", "silent"}  # eviction, disconnect, silence
    assert {w[0] for w in want} == {generate.lock_sn(i) for i in range(12) if i % 4 in (1, 2, 3)}


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def test_clock_delay(reported, fleet_records):
    delays = defaultdict(list)
    for r in fleet_records:
        if not r.sn.startswith("$") and r.lock_ts_ms:
            delays[r.sn].append((r.broker_ts_us - r.lock_ts_ms * 1000) / 1000)
    got = {c.sn: c for c in reported[1]["clock_delay"]}
    assert set(got) == set(delays)
    for sn, xs in delays.items():
        c = got[sn]
        assert c.records == len(xs) and c.min_ms == pytest.approx(min(xs)) and c.max_ms == pytest.approx(max(xs))
        for q, v in ((0.5, c.p50_ms), (0.95, c.p95_ms), (0.99, c.p99_ms)):
            assert v == pytest.approx(_percentile(xs, q), abs=1e-6)
        assert c.clock_off == (abs(_percentile(xs, 0.5)) > SETTINGS.clock_tolerance_s * 1000)
    assert {sn for sn, c in got.items() if c.clock_off} == {
        generate.lock_sn(i) for i in range(12) if generate.skew_ms(i)}


def test_sequence_gaps_and_duplicates(reported, fleet_records):
    _, tables, _, _ = reported
    seqs = defaultdict(set)
    first_t: dict = {}
    for r in fleet_records:
        if not r.sn.startswith("$"):
            seqs[r.sn].add(r.seq)
            first_t[(r.sn, r.seq)] = min(first_t.get((r.sn, r.seq), r.broker_ts_us), r.broker_ts_us)
    online = defaultdict(list)
    for r in fleet_records:
        if r.topic == generate.DEVICES_TOPIC and json.loads(r.payload)["event"] == "online":
            online[json.loads(r.payload)["sn"]].append(r.broker_ts_us)
    want_gaps, skipped = [], defaultdict(int)
    for sn, s in seqs.items():
        s = sorted(s)
        for a, b in zip(s, s[1:]):
            if b - a <= 1:
                continue
            # the lock's block reservation: resumed past the unused rest after a reconnect
            if b - a - 1 <= generate.SEQ_BLOCK and any(first_t[(sn, a)] < t <= first_t[(sn, b)] for t in online[sn]):
                skipped[sn] += b - a - 1
            else:
                want_gaps.append((sn, a, b, b - a - 1))
    got = sorted((g.sn, g.after_seq, g.next_seq, g.missing) for g in tables["seq_gaps"])
    assert got == sorted(want_gaps) and want_gaps
    assert skipped[generate.lock_sn(7)] > 0  # the power cut of the generated fleet
    # duplicates: the lock records of the copied segments, counted per lock
    dup_sns = reported[3]
    for row in tables["seq_summary"]:
        s = sorted(seqs[row.sn])
        assert (row.first_seq, row.last_seq, row.received) == (s[0], s[-1], len(s))
        assert row.skipped == skipped[row.sn]
        assert row.missing == s[-1] - s[0] + 1 - len(s) - skipped[row.sn]
        assert row.duplicates == dup_sns.get(row.sn, 0)
    assert {r.sn for r in tables["seq_summary"]} == set(seqs)


def test_seq_block_is_the_firmwares():
    """The reports' and the generator's block size is the firmware's default ``seq_block``."""
    import re

    from lockmq.spark.reports import ReportSettings

    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "firmware", "lockapp", "config.py")
    if not os.path.exists(cfg):
        pytest.skip("no firmware sources next to the tests")
    block = int(re.search(r'"seq_block":\s*(\d+)', open(cfg).read())[1])
    assert ReportSettings().seq_block == generate.SEQ_BLOCK == block
