"""Vectorised decoding of commit-log segments into Arrow record batches (no JVM).

One Python loop walks the record chain and checks each record's CRC
(``zlib.crc32``); everything else -- header fields, strings, timestamps, the
``LockEvent`` payload fields -- is gathered with numpy and handed to pyarrow
without per-row Python objects. Shared by the Spark data source, ``lockmq export
--parquet`` and the benchmark floor.

Bad data never raises (except in ``FAILFAST`` mode): a record whose CRC does not
match, or whose header does not add up, becomes an *error row* (``error`` set,
``payload`` = the raw bytes skipped) and is counted in :class:`DecodeStats`. A
record that runs past the end of the newest segment, or into the zeros preallocated
after its last record, is torn (still being written): it is not read, and the
position before it is reported so that a later read picks it up once complete.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lockmq.store.records import FORMAT_VERSION as RECORD_FORMAT
from lockmq.store.records import HEADER, HEADER_SIZE, next_valid, trailing_zeros

from . import events
from .arrays import at_every_byte, struct_dtype
from .layout import MIN_LENGTH

MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
UTC_US = pa.timestamp("us", tz="UTC")

#: Arrow schema of decoded records; the Spark schema (:data:`SPARK_DDL`) matches it.
SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("gateway_id", pa.string()),
        ("topic", pa.string()),
        ("sn", pa.string()),
        ("seq", pa.int64()),
        ("message_id", pa.string()),
        ("lock_ts", UTC_US),
        ("broker_ts", UTC_US),
        ("flags", pa.int32()),
        ("headers", pa.string()),
        ("payload", pa.binary()),
        *events.ARROW_FIELDS,
        ("error", pa.string()),
    ]
)

#: The same schema as a Spark DDL string.
SPARK_DDL = (
    "offset BIGINT, gateway_id STRING, topic STRING, sn STRING, seq BIGINT, "
    "message_id STRING, lock_ts TIMESTAMP, broker_ts TIMESTAMP, flags INT, "
    "headers STRING, payload BINARY, " + events.SPARK_DDL + ", error STRING"
)

#: Spark type of every column, by name (for a projected schema)
_DDL_TYPES = dict(part.split(" ", 1) for part in SPARK_DDL.split(", "))


def projected(columns: tuple[str, ...] | None) -> tuple[pa.Schema, str]:
    """The Arrow schema and Spark DDL of ``columns`` (all of them if None), in table order.

    A pass that needs only a few columns (the ingest's id pass) asks the data source
    for just those: less to build in Python, to ship and to convert in the JVM."""
    if not columns:
        return SCHEMA, SPARK_DDL
    unknown = [c for c in columns if c not in _DDL_TYPES]
    if unknown:
        raise ValueError(f"lockmq: unknown column(s) {unknown}; choose from {SCHEMA.names}")
    names = [n for n in SCHEMA.names if n in columns]
    return pa.schema([SCHEMA.field(n) for n in names]), ", ".join(f"{n} {_DDL_TYPES[n]}" for n in names)


#: The record header as the store's codec lays it out (``lockmq.store.records.HEADER``:
#: types, sizes and byte order from its struct format; only the names are ours).
HDR_DTYPE = struct_dtype(HEADER, ("length", "crc", "format", "flags", "topic_len", "sn_len", "reserved",
                                  "headers_len", "seq", "payload_len", "lock_ts_ms", "broker_ts_us"))
_LEN_CRC = struct.Struct("<II")
_LEN = struct.Struct("<I")
#: Largest µs timestamp that fits a signed 64-bit value; larger ones become null.
_MAX_US = (1 << 63) - 1
_MAX_MS = _MAX_US // 1000
#: Raw bytes kept in the payload of an error row.
MAX_ERROR_BYTES = 1 << 16


class LogCorruptError(ValueError):
    """Raised in ``FAILFAST`` mode when a corrupt record is found."""


@dataclass
class DecodeStats:
    """What one decode call saw."""

    records: int = 0
    corrupt: int = 0
    corrupt_bytes: int = 0
    torn_bytes: int = 0
    missing_segments: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: "DecodeStats") -> None:
        """Accumulate ``other`` into this object."""
        self.records += other.records
        self.corrupt += other.corrupt
        self.corrupt_bytes += other.corrupt_bytes
        self.torn_bytes += other.torn_bytes
        self.missing_segments += other.missing_segments
        self.errors.extend(other.errors[: max(0, 100 - len(self.errors))])


def _resync(buf: bytes, pos: int, end: int) -> int:
    """Where reading continues after the bad record at ``pos``: the store's own rule
    (``lockmq.store.records.next_valid``: the first whole, valid record after it),
    ``end`` if there is none."""
    nxt = next_valid(buf, pos, end)
    return end if nxt is None else nxt


def _walk(buf: bytes, pos: int, end: int, max_records: int) -> tuple[list[int], int]:
    """Follow record lengths from ``pos``: (record starts, stop). No CRC work.

    Stops at ``end``, at a length too small to be a record, at a record running
    past ``end``, or after ``max_records`` records (-1: no limit).
    """
    unpack = _LEN.unpack_from
    out: list[int] = []
    append = out.append
    limit = end - 4
    for _ in range(max_records if max_records >= 0 else 1 << 62):
        if pos > limit:
            break
        length = unpack(buf, pos)[0]
        nxt = pos + 4 + length
        if length < MIN_LENGTH or nxt > end:
            break
        append(pos)
        pos = nxt
    return out, pos


def scan(
    buf: bytes, start: int, end: int, closed: bool, max_records: int = -1
) -> tuple[list[int], list[tuple[int, int, str]], int, int]:
    """Walk records in ``buf[start:end]`` verifying CRCs.

    Returns ``(positions, bad_regions, next_pos, torn_bytes)``: the start of every good
    record, ``(pos, nbytes, reason)`` for every corrupt region, where reading stopped,
    and how many bytes of an incomplete last record were left unread. In a closed
    segment an incomplete tail is corrupt (reported as a bad region, not torn).

    Fast path: one tight loop follows the lengths, then the CRCs of all records
    found are computed in one comprehension and compared with numpy; the careful
    path (skip or resynchronise) runs only where a record is bad.
    """
    crc32 = zlib.crc32
    mv = memoryview(buf)
    arr = np.frombuffer(buf, dtype=np.uint8)
    positions: list[int] = []
    bad: list[tuple[int, int, str]] = []
    pos = start
    while pos < end and len(positions) != max_records:
        want = -1 if max_records < 0 else max_records - len(positions)
        ps, stop = _walk(buf, pos, end, want)
        if ps:
            ends = ps[1:]
            ends.append(stop)
            ps_np = np.asarray(ps, dtype=np.int64)
            # map() keeps the per-record work in C: slice -> memoryview -> crc32
            computed = np.fromiter(map(crc32, map(mv.__getitem__, map(slice, (ps_np + 8).tolist(), ends))),
                                   dtype=np.uint32, count=len(ps))
            stored = _u32_at(arr, ps_np + 4)
            mismatch = np.flatnonzero(computed != stored)
            if mismatch.size:
                k = int(mismatch[0])
                positions.extend(ps[:k])
                p_bad, rec_end = ps[k], ends[k]
                zeros_from = end if closed else trailing_zeros(buf, p_bad, end)
                if zeros_from < rec_end:
                    # it runs into the newest segment's preallocated zeros: a record
                    # being written (its bytes are not all there yet), not damage
                    return positions, bad, p_bad, zeros_from - p_bad
                nxt = _resync(buf, p_bad, end)  # as the broker's reads get past damage
                bad.append((p_bad, nxt - p_bad, "crc mismatch"))
                pos = nxt
                continue
            positions.extend(ps)
            pos = stop
            continue
        # the walk could not take a single record at pos: find out why
        if pos + 8 > end:
            break
        length = _LEN.unpack_from(buf, pos)[0]
        if length >= MIN_LENGTH:
            break  # runs past the end: torn (or being written)
        data_end = trailing_zeros(buf, pos, end)
        if data_end == pos:
            # zero-filled, never-written tail: the end of data (for now, if live)
            return positions, bad, (end if closed else pos), 0
        if not closed and data_end < pos + 8:
            # the newest segment: a length field being written over the zeros
            return positions, bad, pos, data_end - pos
        nxt = _resync(buf, pos, end)
        bad.append((pos, nxt - pos, f"bad record length {length}"))
        pos = nxt
    torn = end - pos if (pos < end and len(positions) != max_records) else 0
    if torn and closed:
        bad.append((pos, torn, "incomplete record at end of closed segment"))
        pos, torn = end, 0
    return positions, bad, pos, torn


def _u32_at(arr: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Little-endian u32 at each byte position."""
    return at_every_byte(arr, np.dtype("<u4"))[starts]


def _gather(arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``arr[s:s+l]`` for every (s, l): returns (int32 offsets, bytes)."""
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        data = arr[idx]
    else:
        data = np.zeros(0, dtype=np.uint8)
    return offsets.astype(np.int32), data


def _var_array(typ: pa.DataType, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
               valid: np.ndarray | None = None) -> pa.Array:
    offsets, data = _gather(arr, starts, lengths)
    vbuf = None
    null_count = 0
    if valid is not None and not valid.all():
        vbuf = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(len(valid) - valid.sum())
    return pa.Array.from_buffers(
        typ, len(starts), [vbuf, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=null_count
    )


def _ts_us(values: np.ndarray, scale: int, max_value: int) -> pa.Array:
    """u64 times in units of 1/scale µs -> timestamp[us, UTC]; 0 and overflow -> null."""
    bad = (values == 0) | (values > max_value)
    us = np.where(bad, 0, values).astype(np.int64) * scale
    return pa.array(us, type=UTC_US, mask=bad)


def build_batch(arr: np.ndarray, pos: np.ndarray, base: int, gateway_id: str | None,
                schema: pa.Schema = SCHEMA) -> tuple[pa.RecordBatch, np.ndarray]:
    """Decode the records starting at ``pos`` (CRC already verified) into a batch
    of the columns of ``schema`` (see :func:`projected`; only those are built).

    Returns ``(batch, inconsistent)``: ``inconsistent`` marks records whose header
    fields do not add up to their length; they are left out of the batch.
    """
    hdr = at_every_byte(arr, HDR_DTYPE)[pos]
    t = hdr["topic_len"].astype(np.int64)
    s = hdr["sn_len"].astype(np.int64)
    h = hdr["headers_len"].astype(np.int64)
    p = hdr["payload_len"].astype(np.int64)
    length = hdr["length"].astype(np.int64)
    inconsistent = (hdr["format"] != RECORD_FORMAT) | (MIN_LENGTH + t + s + h + p != length)
    if inconsistent.any():
        keep = ~inconsistent
        pos, hdr, t, s, h, p = pos[keep], hdr[keep], t[keep], s[keep], h[keep], p[keep]
    n = len(pos)
    topic_start = pos + HEADER_SIZE
    sn_start = topic_start + t
    hdrs_start = sn_start + s
    pay_start = hdrs_start + h
    want = set(schema.names)
    sn = _var_array(pa.string(), arr, sn_start, s)
    seq = pa.array(hdr["seq"].astype(np.int64))
    # each column only when asked for (the id pass needs message_id and error alone)
    builders = {
        "offset": lambda: pa.array(pos + base),
        "gateway_id": lambda: pa.array([gateway_id] * n, type=pa.string()) if gateway_id is not None
        else pa.nulls(n, pa.string()),
        "topic": lambda: _var_array(pa.string(), arr, topic_start, t),
        "sn": lambda: sn,
        "seq": lambda: seq,
        "message_id": lambda: pc.binary_join_element_wise(sn, pc.cast(seq, pa.string()), ":"),
        "lock_ts": lambda: _ts_us(hdr["lock_ts_ms"], 1000, _MAX_MS),
        "broker_ts": lambda: _ts_us(hdr["broker_ts_us"], 1, _MAX_US),
        "flags": lambda: pa.array(hdr["flags"].astype(np.int32)),
        "headers": lambda: _var_array(pa.string(), arr, hdrs_start, h, valid=h > 0),
        "payload": lambda: _var_array(pa.binary(), arr, pay_start, p),
        "error": lambda: pa.nulls(n, pa.string()),
    }
    cols = {name: build() for name, build in builders.items() if name in want}
    if want - cols.keys():  # the LockEvent fields
        cols.update(events.decode(arr, topic_start, pay_start, p))
    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema), inconsistent


def error_batch(buf: bytes, regions: list[tuple[int, int, str]], base: int, gateway_id: str | None) -> pa.RecordBatch:
    """Error rows for corrupt regions: offset, gateway, raw bytes and the reason."""
    n = len(regions)
    cols: dict[str, pa.Array] = {f.name: pa.nulls(n, f.type) for f in SCHEMA}
    cols["offset"] = pa.array([base + r[0] for r in regions], type=pa.int64())
    cols["gateway_id"] = pa.array([gateway_id] * n, type=pa.string())
    cols["payload"] = pa.array([bytes(buf[r[0] : r[0] + min(r[1], MAX_ERROR_BYTES)]) for r in regions], type=pa.binary())
    cols["error"] = pa.array([f"{r[2]} ({r[1]} bytes)" for r in regions], type=pa.string())
    return pa.RecordBatch.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)


def decode_buffer(
    buf: bytes,
    base: int,
    gateway_id: str | None = None,
    start: int = 0,
    end: int | None = None,
    closed: bool = True,
    mode: str = "PERMISSIVE",
    batch_records: int = 65536,
    stats: DecodeStats | None = None,
    schema: pa.Schema = SCHEMA,
) -> Iterator[pa.RecordBatch]:
    """Decode records in ``buf[start:end]``; ``buf[0]`` is at log offset ``base``.

    Yields record batches of at most ``batch_records`` good records (plus error rows
    in ``PERMISSIVE`` mode). ``closed`` says no more bytes will be appended (a
    record cut by ``end`` is then corrupt rather than torn). Counts go to ``stats``.
    """
    if mode not in MODES:
        raise ValueError(f"lockmq: mode must be one of {MODES}, not {mode!r}")
    stats = stats if stats is not None else DecodeStats()
    end = len(buf) if end is None else min(end, len(buf))
    arr = np.frombuffer(buf, dtype=np.uint8)
    pos = start
    while pos < end:
        positions, bad, nxt, torn = scan(buf, pos, end, closed, batch_records)
        if positions:
            batch, inconsistent = build_batch(arr, np.asarray(positions, dtype=np.int64), base, gateway_id, schema)
            if inconsistent.any():
                for i in np.flatnonzero(inconsistent):
                    p0 = positions[int(i)]
                    bad.append((p0, 4 + _LEN_CRC.unpack_from(buf, p0)[0], "inconsistent header"))
            stats.records += batch.num_rows
            if batch.num_rows:
                yield batch
        if bad:
            stats.corrupt += len(bad)
            stats.corrupt_bytes += sum(r[1] for r in bad)
            msgs = [f"offset {base + r[0]}: {r[2]} ({r[1]} bytes)" for r in bad]
            stats.errors.extend(msgs[: max(0, 100 - len(stats.errors))])
            if mode == "FAILFAST":
                raise LogCorruptError("lockmq: corrupt log: " + "; ".join(msgs[:5]))
            if mode == "PERMISSIVE":
                errors = error_batch(buf, bad, base, gateway_id)
                yield errors if schema is SCHEMA else errors.select(schema.names)
        stats.torn_bytes += torn
        if nxt <= pos or torn:
            break
        pos = nxt


def decode_file(path: str, base: int, gateway_id: str | None = None, start: int = 0,
                end: int | None = None, closed: bool = True, mode: str = "PERMISSIVE",
                batch_records: int = 65536, stats: DecodeStats | None = None,
                schema: pa.Schema = SCHEMA) -> Iterator[pa.RecordBatch]:
    """Read ``path`` bytes ``[start, end)`` and decode them (see :func:`decode_buffer`)."""
    with open(path, "rb") as f:
        f.seek(start)
        buf = f.read() if end is None else f.read(max(0, end - start))
    yield from decode_buffer(buf, base + start, gateway_id, 0, len(buf), closed, mode, batch_records, stats, schema)
