"""Deterministic synthetic fleet traffic for tests, benchmarks and demos.

Locks publish ``LockEvent`` records to ``lock.events``; the broker writes their
heartbeats to ``$heartbeats`` and their online/offline/evicted events to
``$devices`` (JSON naming the lock in ``"sn"``, under the broker's own SN, as
host/lockmq/broker/devices.py does).
The traffic holds what the reports look for: failed-attempt bursts, locks whose
clock is off, offline periods (no records at all), sequence gaps (lost records).
Records can be written with the real storage engine (:func:`write_store`, broker
time = now) or with :class:`~lockmq.spark.logwriter.LogWriter` (:func:`write_log`,
broker time as generated).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Iterable, NamedTuple

from lockmq.protocol import EventType, LockEvent, Method, Result

EVENT_TOPIC = "lock.events"
HEARTBEAT_TOPIC = "$heartbeats"
DEVICES_TOPIC = "$devices"
BROKER_SN = "$broker"
#: the locks' sequence block (firmware/lockapp/config.py ``seq_block``)
SEQ_BLOCK = 64


class GenRecord(NamedTuple):
    """One record to write."""

    topic: str
    sn: str
    seq: int
    lock_ts_ms: int
    broker_ts_us: int
    payload: bytes


def lock_sn(i: int) -> str:
    """Serial number of the i-th generated lock."""
    return f"LK{i:05d}"


def skew_ms(i: int) -> int:
    """Clock error of lock i: every 7th lock runs 5 minutes fast, every 11th 2 minutes slow."""
    if i % 7 == 3:
        return 300_000
    if i % 11 == 5:
        return -120_000
    return 0


def fleet(n_locks: int = 12, hours: float = 6.0, start_ms: int = 1_767_225_600_000, seed: int = 1,
          heartbeat_s: int = 30, event_every_s: int = 300, heartbeats: bool = True) -> list[GenRecord]:
    """Generate traffic for ``n_locks`` over ``hours`` starting at ``start_ms`` (UTC ms).

    Returns records in broker-arrival order. Deterministic for a given seed.
    """
    rng = random.Random(seed)
    span = int(hours * 3600_000)
    out: list[tuple[int, GenRecord]] = []
    hb_seq = 0
    hb_phase = [rng.randrange(heartbeat_s * 1000) for _ in range(n_locks)]
    for i in range(n_locks):
        sn = lock_sn(i)
        # offline window: every 4th lock drops off for 20 minutes once
        off = (start_ms + span // 3, start_ms + span // 3 + 20 * 60_000) if i % 4 == 2 else None
        times: list[tuple[int, int, int]] = []  # (true ms, type, result)
        t = start_ms + rng.randrange(event_every_s * 1000)
        while t < start_ms + span:
            r = rng.random()
            if r < 0.6:
                times.append((t, EventType.UNLOCK, Result.OK))
            elif r < 0.8:
                times.append((t, EventType.FAILED_ATTEMPT, Result.DENIED_UNKNOWN))
            elif r < 0.88:
                times.append((t, EventType.DOOR_LEFT_OPEN, Result.OK))
            elif r < 0.9:
                times.append((t, EventType.TAMPER, Result.OK))
            elif r < 0.95:
                times.append((t, EventType.LOW_BATTERY, Result.OK))
            else:
                times.append((t, EventType.LOCKED, Result.OK))
            t += rng.randrange(1, 2 * event_every_s * 1000)
        if i % 5 == 0:  # a brute-force burst: 6 failed attempts within ~90 s
            b0 = start_ms + rng.randrange(span // 2, span - 600_000)
            times += [(b0 + k * 15_000 + rng.randrange(1000), EventType.FAILED_ATTEMPT,
                       Result.DENIED_UNKNOWN) for k in range(6)]
        if i % 5 == 1:  # 4 attempts within 2 minutes: not a burst
            b0 = start_ms + rng.randrange(span // 2, span - 600_000)
            times += [(b0 + k * 20_000, EventType.FAILED_ATTEMPT, Result.DENIED_EXPIRED) for k in range(4)]
        times.sort()
        if off:
            times = [x for x in times if not off[0] <= x[0] < off[1]]
        dev = [(start_ms, "online", "")]
        if off:  # silent, evicted 120 s after its last heartbeat, back when the window ends
            last_hb = max(h for h in range(start_ms + hb_phase[i], off[0], heartbeat_s * 1000))
            dev += [(last_hb + 120_000, "evicted", "silent 120 s"), (off[1], "online", "")]
        if i % 4 == 3:  # a short disconnect: shorter than the silence threshold
            cut = (start_ms + span // 2, start_ms + span // 2 + 45_000)
            times = [x for x in times if not cut[0] <= x[0] < cut[1]]
            dev += [(cut[0], "offline", "disconnected"), (cut[1], "online", "")]
            off = off or cut
        if i % 4 == 1:  # silent for 10 minutes with no $devices event (a broker crash)
            cut = (start_ms + span * 2 // 3, start_ms + span * 2 // 3 + 600_000)
            times = [x for x in times if not cut[0] <= x[0] < cut[1]]
            off = cut
        for tm, ev, reason in dev:
            body = {"sn": sn, "event": ev, "ts_ms": tm, "peer": "10.0.0.9:5000"}
            if reason:
                body["reason"] = reason
            out.append((tm * 1000 + 500, GenRecord(DEVICES_TOPIC, BROKER_SN, 0, tm,
                                                   tm * 1000 + 500, json.dumps(body).encode())))
        seq = 0
        # every 12th lock from the 8th: the short disconnect was a power cut, and it
        # resumes at the end of its reserved sequence block (firmware seqno.py)
        power_cut = cut[1] if i % 12 == 7 else None
        for k, (tm, etype, res) in enumerate(times):
            if i % 6 == 4 and k % 17 == 9:
                seq += 1  # a lost record: a gap in the lock's sequence
            if power_cut is not None and tm >= power_cut:
                seq = (seq // SEQ_BLOCK + 1) * SEQ_BLOCK
                power_cut = None
            method = Method.CARD if etype in (EventType.UNLOCK, EventType.FAILED_ATTEMPT) else Method.NONE
            cred = rng.randrange(1 << 40).to_bytes(8, "big") if method == Method.CARD else b""
            lock_ms = tm + skew_ms(i)
            ev = LockEvent(etype, lock_ms, method, res, 0, cred).encode()
            arrive_us = tm * 1000 + rng.randrange(20_000, 800_000)
            out.append((arrive_us, GenRecord(EVENT_TOPIC, sn, seq, lock_ms, arrive_us, ev)))
            seq += 1
        if heartbeats:
            hb = start_ms + hb_phase[i]
            while hb < start_ms + span:
                if not (off and off[0] <= hb < off[1]):
                    arrive_us = hb * 1000 + rng.randrange(5_000, 200_000)
                    payload = json.dumps({"sn": sn, "ts_ms": hb + skew_ms(i), "uptime_s": (hb - start_ms) // 1000,
                                          "queued": 0, "dropped": 0, "battery_pct": 80, "free_heap": 50000}).encode()
                    out.append((arrive_us, GenRecord(HEARTBEAT_TOPIC, BROKER_SN, 0, hb + skew_ms(i),
                                                     arrive_us, payload)))
                hb += heartbeat_s * 1000
    out.sort(key=lambda x: x[0])
    recs = []
    for _, r in out:
        if r.sn == BROKER_SN:
            r = r._replace(seq=hb_seq)
            hb_seq += 1
        recs.append(r)
    return recs


def bulk(n_records: int, n_locks: int = 1000, start_ms: int = 1_767_225_600_000, seed: int = 7) -> Iterable[GenRecord]:
    """``n_records`` lock events from ``n_locks`` locks, cheaply (for benchmarks)."""
    rng = random.Random(seed)
    seqs = [0] * n_locks
    payloads = [LockEvent(t, start_ms, Method.CARD, Result.OK, 0, b"\x00\x00\x00\x00\xca\xfe\xba\xbe").encode()
                for t in (1, 2, 3, 4, 5)]
    for k in range(n_records):
        i = k % n_locks
        tm = start_ms + k * 10
        p = payloads[rng.randrange(5)]
        yield GenRecord(EVENT_TOPIC, lock_sn(i), seqs[i], tm, tm * 1000 + 250_000,
                        p[:5] + tm.to_bytes(8, "big") + p[13:])
        seqs[i] += 1


def write_log(data_dir: str, records: Iterable[GenRecord], segment_bytes: int = 1 << 20) -> int:
    """Write records with the test :class:`LogWriter` (broker time as generated); returns the log end."""
    from .logwriter import LogWriter, encode

    w = LogWriter(data_dir, segment_bytes)
    for r in records:
        w.append_raw(encode(r.topic, r.sn, r.seq, r.lock_ts_ms, r.broker_ts_us, r.payload))
    w.close()
    return w.offset


def write_store(data_dir: str, records: Iterable[GenRecord], batch: int = 2000, **settings) -> list:
    """Append records through the real storage engine (``lockmq.store``); returns the Appended results.

    The engine stamps broker time itself (now); ``settings`` go to ``StoreConfig``.
    """
    from lockmq.store import NewRecord, Store, StoreConfig

    settings.setdefault("min_free_bytes", 0)
    settings.setdefault("retention_ms", None)

    async def run() -> list:
        store = Store.open(StoreConfig(data_dir=data_dir, **settings))
        results: list = []
        try:
            chunk: list = []
            for r in records:
                chunk.append(NewRecord(r.topic, r.sn, r.seq, r.lock_ts_ms, r.payload))
                if len(chunk) >= batch:
                    results += await store.append(chunk)
                    chunk = []
            if chunk:
                results += await store.append(chunk)
        finally:
            await store.close()
        return results

    return asyncio.run(run())
