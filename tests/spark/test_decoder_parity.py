"""The vectorised decoder and the storage engine's codec read the same bytes the same way.

Random segments (encoded by the engine's own ``encode_record``) are damaged at
random -- flipped bytes, overwritten lengths, zeroed runs, cut tails -- and read
by both: every record the vectorised decoder returns is one the engine's
``check_record`` accepts and ``decode_record`` decodes to the same fields; every
region it reports as corrupt starts where ``check_record`` refuses a record and
ends where the engine's ``next_valid`` resumes reading; and
the records plus the corrupt regions cover the segment with no gap.
"""

from __future__ import annotations

import datetime
import json
import random
import re

import pyarrow as pa
import pytest

from lockmq.protocol import LockEvent
from lockmq.protocol._errors import BadBody
from lockmq.spark import events
from lockmq.spark.decoder import HDR_DTYPE, decode_buffer
from lockmq.spark.logwriter import encode
from lockmq.store.records import HEADER, check_record, decode_record, next_valid


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _segment(rng: random.Random, n: int) -> bytes:
    out = []
    for i in range(n):
        topic = rng.choice(["lock.events", "$heartbeats", "$devices", "door.x"])
        if topic == "lock.events" and rng.random() < 0.8:
            payload = LockEvent(rng.randrange(1, 9), rng.randrange(0, 1 << 44), rng.randrange(6), rng.randrange(5),
                                rng.randrange(1 << 16), bytes(rng.randrange(256) for _ in range(rng.choice([0, 4, 8])))
                                ).encode()
        else:
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        headers = {"retry": rng.randrange(5)} if rng.random() < 0.1 else None
        out.append(encode(topic, f"LK{rng.randrange(50):03d}", i, rng.randrange(0, 1 << 42),
                          rng.randrange(1, 1 << 52), payload, headers))
    return b"".join(out)


def _damage(rng: random.Random, buf: bytes) -> bytes:
    b = bytearray(buf)
    for _ in range(rng.randrange(0, 4)):
        kind = rng.random()
        p = rng.randrange(len(b))
        if kind < 0.4:
            b[p] ^= 1 << rng.randrange(8)                       # a flipped bit
        elif kind < 0.6:
            b[p:p + 4] = rng.randrange(1 << 32).to_bytes(4, "little")[: len(b) - p]  # garbage (a length?)
        elif kind < 0.8:
            n = rng.randrange(1, 200)
            b[p:p + n] = bytes(len(b[p:p + n]))                  # a zeroed run
        else:
            del b[rng.randrange(len(b) // 2, len(b)):]          # a cut tail
    return bytes(b)


def _regions(tab: pa.Table) -> list[tuple[int, int, dict]]:
    out = []
    for row in tab.to_pylist():
        if row["error"] is None:
            out.append((row["offset"], None, row))
        else:
            out.append((row["offset"], int(re.search(r"\((\d+) bytes\)", row["error"])[1]), row))
    return sorted(out, key=lambda r: r[0])


def _us(ts) -> int:
    """A decoded timestamp as integer µs since the epoch (0 for null: unknown)."""
    return 0 if ts is None else (ts - _EPOCH) // datetime.timedelta(microseconds=1)


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_decoder_equals_the_engines_codec(seed):
    rng = random.Random(seed)
    clean = _segment(rng, rng.randrange(1, 120))
    buf = _damage(rng, clean) if seed % 5 else clean
    tab = pa.Table.from_batches(list(decode_buffer(buf, 0, batch_records=rng.choice([7, 64, 65536]))))
    pos = 0
    for off, size, row in _regions(tab):
        assert off == pos, f"gap or overlap at {pos}"
        if size is not None:  # a corrupt region: the engine refuses a record there too,
            assert check_record(buf, off, len(buf)) is not None
            nxt = next_valid(buf, off, len(buf))  # and reads on from where the broker would
            assert off + size == (len(buf) if nxt is None else nxt) or not buf[off + size:].strip(b"\0")
            pos = off + size
            continue
        assert check_record(buf, off, len(buf)) is None
        rec = decode_record(buf, off, off)
        assert (row["topic"], row["sn"], row["seq"], row["payload"]) == (rec.topic, rec.sn, rec.seq, rec.payload)
        assert row["message_id"] == rec.msg_id
        assert (json.loads(row["headers"]) if row["headers"] else None) == rec.headers
        assert row["flags"] == buf[off + 9]
        assert _us(row["broker_ts"]) == rec.broker_ts_us
        assert _us(row["lock_ts"]) == rec.lock_ts_ms * 1000
        try:
            ev = None if rec.topic.startswith("$") else LockEvent.decode(rec.payload)
        except BadBody:
            ev = None
        assert (row["event_type"] is None) == (ev is None)
        if ev is not None:
            assert row["event_type"] == events.EVENT_TYPES.get(ev.event_type, f"code:{ev.event_type}")
            assert (row["value"], row["credential_id"]) == (ev.value, ev.credential.hex() or None)
        pos = off + 4 + int.from_bytes(buf[off:off + 4], "little")
    assert pos == len(buf) or not buf[pos:].strip(b"\0"), "records and corrupt regions must cover the segment"
    if buf == clean:
        assert tab.num_rows == len(tab.filter(pa.compute.is_null(tab["error"])))


def test_the_header_layout_is_the_engines():
    """Offsets and sizes come from ``lockmq.store.records.HEADER`` (no second copy)."""
    assert HDR_DTYPE.itemsize == HEADER.size
    raw = encode("lock.events", "LK1", 77, 123, 456, b"xyz")
    rec = HDR_DTYPE and __import__("numpy").frombuffer(raw[: HEADER.size], dtype=HDR_DTYPE)[0]
    assert tuple(int(rec[name]) for name in HDR_DTYPE.names) == HEADER.unpack_from(raw)
