"""``seq_summary`` and ``seq_gaps`` count locks only: a service producer that
publishes to the same log (``lockmq produce``, a billing service) is no lock."""

from __future__ import annotations

import json

from lockmq.protocol import EventType, LockEvent, Method, Result
from lockmq.spark import generate
from lockmq.spark.ingest import ingest
from lockmq.spark.reports import ReportSettings, seq_gaps, seq_summary

T0_MS = 1_767_225_600_000


def _lock_event(sn: str, seq: int) -> generate.GenRecord:
    ts = T0_MS + seq * 1000
    payload = LockEvent(EventType.UNLOCK, ts, Method.CARD, Result.OK, 0, b"\x01").encode()
    return generate.GenRecord(generate.EVENT_TOPIC, sn, seq, ts, ts * 1000 + 300, payload)


def _service_record(sn: str, seq: int) -> generate.GenRecord:
    ts = T0_MS + seq * 1000
    return generate.GenRecord("orders", sn, seq, 0, ts * 1000 + 700, b"paid order %d" % seq)


def test_service_producers_are_not_counted_as_locks(spark, tmp_path):
    lock = [_lock_event("LK00001", seq) for seq in (0, 1, 2, 5)]          # a gap of 2
    service = [_service_record("cli-gw-4242-a1b2c3", seq) for seq in (0, 3, 9)]
    landing = tmp_path / "landing" / "gw-1"
    generate.write_log(str(landing), sorted(lock + service, key=lambda r: r.broker_ts_us))
    (landing / "manifest.json").write_text(json.dumps({"gateway_id": "gw-1"}))
    wh = str(tmp_path / "wh")
    ingest(spark, [str(tmp_path / "landing")], wh)

    summary = seq_summary(spark, wh, ReportSettings()).collect()
    assert [(r.sn, r.first_seq, r.last_seq, r.received, r.missing) for r in summary] == [
        ("LK00001", 0, 5, 4, 2)]
    gaps = seq_gaps(spark, wh, ReportSettings()).collect()
    assert [(g.sn, g.after_seq, g.next_seq) for g in gaps] == [("LK00001", 2, 5)]
