"""Record types and the commit-log record codec (layout in FORMAT.md).

Pure functions over bytes; no file I/O here.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from typing import Any, Iterator, NamedTuple

from lockmq import accel

from .errors import CorruptRecord, InvalidRecord

FORMAT_VERSION = 1
FLAG_SYSTEM = 0x01
FLAG_HEADERS = 0x02

#: length, crc, format, flags, topic_len, sn_len, reserved, headers_len, seq,
#: payload_len, lock_ts_ms, broker_ts_us
HEADER = struct.Struct("<IIBBHBBHIIQQ")
HEADER_SIZE = HEADER.size  # 40
_LEN_CRC = struct.Struct("<II")
_REST = struct.Struct("<BBHBBHIIQQ")  # the 32 header bytes after length and crc
MAX_SEQ = 0xFFFFFFFF
MAX_SN_LEN = 255
MAX_HEADERS_LEN = 0xFFFF
_TOPIC_RE = re.compile(r"[A-Za-z0-9._$%-]{1,128}\Z")


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a legal topic name, else raise :class:`InvalidRecord`.

    A topic is 1..128 characters of ``[A-Za-z0-9._$%-]`` (it becomes part of a file
    name). Topics starting with ``$`` are system topics.
    """
    if not isinstance(topic, str) or not _TOPIC_RE.match(topic):
        raise InvalidRecord(
            f"bad topic name {topic!r}: need 1..128 characters of [A-Za-z0-9._$%-]")
    return topic


def validate_cluster(cluster: object) -> str:
    """Consumer-cluster names follow the topic rules (they name a file too)."""
    if not isinstance(cluster, str) or not _TOPIC_RE.match(cluster):
        raise ValueError(
            f"bad cluster name {cluster!r}: need 1..128 characters of [A-Za-z0-9._$%-]")
    return cluster


class NewRecord:
    """A record to append: what a producer sent.

    Attributes:
        topic: topic name (see :func:`validate_topic`).
        sn: lock serial number or producer id, ASCII, 1..255 bytes.
        seq: the lock's sequence number, 0..2**32-1. ``(sn, seq)`` is the message id.
        lock_ts_ms: the lock's own clock in ms since the Unix epoch (0 = unknown).
        payload: opaque bytes (for lock events, a protocol ``LockEvent``).
        headers: optional JSON-serialisable dict (dead letters, retries).
    """

    __slots__ = ("topic", "sn", "seq", "lock_ts_ms", "payload", "headers")

    def __init__(self, topic: str, sn: str, seq: int, lock_ts_ms: int = 0,
                 payload: bytes = b"", headers: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self.sn = sn
        self.seq = seq
        self.lock_ts_ms = lock_ts_ms
        self.payload = payload
        self.headers = headers

    def __repr__(self) -> str:
        return (f"NewRecord(topic={self.topic!r}, sn={self.sn!r}, seq={self.seq}, "
                f"lock_ts_ms={self.lock_ts_ms}, payload={bytes(self.payload)[:32]!r}"
                f"{'...' if len(self.payload) > 32 else ''}, headers={self.headers!r})")


class Appended(NamedTuple):
    """Outcome of appending one :class:`NewRecord`.

    ``offset`` is the record's commit-log position and ``queue_offset`` its position
    in the topic queue. For a duplicate (its ``(sn, seq)`` was stored before) both are
    -1 and ``duplicate`` is True: the earlier copy is durable, nothing new was stored.
    """

    offset: int
    topic: str
    queue_offset: int
    duplicate: bool


class StoredRecord(NamedTuple):
    """A record read back from the store."""

    offset: int
    queue_offset: int
    topic: str
    sn: str
    seq: int
    lock_ts_ms: int
    broker_ts_us: int
    headers: dict[str, Any] | None
    payload: bytes

    @property
    def msg_id(self) -> str:
        """The message id written ``sn:seq``."""
        return f"{self.sn}:{self.seq}"


#: topic -> (encoded name, flags, length); validated once per topic
_topic_cache: dict[str, tuple[bytes, int, int]] = {}


def _topic_bytes(topic: object) -> tuple[bytes, int, int]:
    got = _topic_cache.get(topic)  # type: ignore[arg-type]
    if got is None:
        name = validate_topic(topic)
        b = name.encode("ascii")
        got = (b, FLAG_SYSTEM if name[0] == "$" else 0, len(b))
        if len(_topic_cache) > 4096:
            _topic_cache.clear()
        _topic_cache[name] = got
    return got


def _slow_checks(rec: NewRecord) -> None:
    """Explain exactly what is wrong with a record the fast path refused."""
    if not isinstance(rec.sn, str):
        raise InvalidRecord(f"sn must be str, not {type(rec.sn).__name__}")
    if not rec.sn.isascii():
        raise InvalidRecord(f"sn {rec.sn!r} is not ASCII")
    if not 0 < len(rec.sn) <= MAX_SN_LEN:
        raise InvalidRecord(f"sn must be 1..{MAX_SN_LEN} bytes, got {len(rec.sn)}")
    if type(rec.seq) is not int or not 0 <= rec.seq <= MAX_SEQ:
        raise InvalidRecord(f"seq must be an int in 0..{MAX_SEQ}, got {rec.seq!r}")
    if type(rec.lock_ts_ms) is not int or not 0 <= rec.lock_ts_ms < 1 << 63:
        raise InvalidRecord(f"lock_ts_ms must be a non-negative int, got {rec.lock_ts_ms!r}")
    if not isinstance(rec.payload, (bytes, bytearray, memoryview)):
        raise InvalidRecord(f"payload must be bytes, not {type(rec.payload).__name__}")
    if rec.headers is not None and not isinstance(rec.headers, dict):
        raise InvalidRecord("headers must be a dict or None")


def _headers_bytes(rec: NewRecord) -> bytes:
    """The record's headers as compact JSON (checked against the size limit)."""
    if not isinstance(rec.headers, dict):
        _slow_checks(rec)
    try:
        hdr_b = json.dumps(rec.headers, separators=(",", ":"),
                           ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"headers are not JSON-serialisable: {exc}") from None
    if len(hdr_b) > MAX_HEADERS_LEN:
        raise InvalidRecord(f"headers JSON is {len(hdr_b)} bytes, max {MAX_HEADERS_LEN}")
    return hdr_b


def encode_record(rec: NewRecord, broker_ts_us: int, max_record_bytes: int) -> bytes:
    """Validate ``rec`` and return its commit-log bytes (header, CRC and all).

    Raises :class:`InvalidRecord` naming the broken rule.
    """
    # the hot path of every append: kept to few bytecodes (each one is measurable
    # at 100k records/s); rare cases and error messages live in helpers
    got = _topic_cache.get(rec.topic)
    topic_b, flags, tlen = _topic_bytes(rec.topic) if got is None else got
    sn = rec.sn
    seq = rec.seq
    lock_ts = rec.lock_ts_ms
    payload = rec.payload
    if (type(sn) is not str or not sn.isascii() or not 0 < len(sn) <= MAX_SN_LEN
            or type(seq) is not int or not 0 <= seq <= MAX_SEQ
            or type(lock_ts) is not int or not 0 <= lock_ts < 1 << 63):
        _slow_checks(rec)
    if type(payload) is not bytes:
        if not isinstance(payload, (bytearray, memoryview)):
            _slow_checks(rec)
        payload = bytes(payload)
    if rec.headers is None:
        body = _REST.pack(FORMAT_VERSION, flags, tlen, len(sn), 0, 0, seq, len(payload),
                          lock_ts, broker_ts_us) + topic_b + sn.encode() + payload
    else:
        hdr_b = _headers_bytes(rec)
        body = _REST.pack(FORMAT_VERSION, flags | FLAG_HEADERS, tlen, len(sn), 0, len(hdr_b),
                          seq, len(payload), lock_ts, broker_ts_us) + topic_b + sn.encode() \
            + hdr_b + payload
    size = len(body) + 8
    if size > max_record_bytes:
        raise InvalidRecord(f"record is {size} bytes, max_record_bytes is {max_record_bytes}")
    return _LEN_CRC.pack(size - 4, zlib.crc32(body)) + body


def _encode_records_py(records: list[NewRecord], broker_ts_us: int, max_record_bytes: int,
                       known: dict[str, Any]) -> tuple[list[bytes], int, set[str]]:
    enc = []
    n = 0
    new: set[str] = set()
    for r in records:
        b = encode_record(r, broker_ts_us, max_record_bytes)
        n += len(b)
        enc.append(b)
        if r.topic not in known:
            new.add(r.topic)
    return enc, n, new


def _encode_records_c(records: list[NewRecord], broker_ts_us: int, max_record_bytes: int,
                      known: dict[str, Any]) -> tuple[list[bytes], int, set[str]]:
    if broker_ts_us < 0 or type(records) is not list:   # (struct's error, not a wrap-around)
        return _encode_records_py(records, broker_ts_us, max_record_bytes, known)
    enc, n, new, slow = _c_encode_records(records, broker_ts_us, max_record_bytes,
                                          _topic_cache, known)
    if slow:   # headers, a topic seen for the first time, a bad field: encode_record's
        for i, b in enumerate(enc):
            if b is None:
                r = records[i]
                b = enc[i] = encode_record(r, broker_ts_us, max_record_bytes)
                n += len(b)
                if r.topic not in known:
                    new.add(r.topic)
    return enc, n, new


#: ``encode_records(records, broker_ts_us, max_record_bytes, known) -> (bytes per
#: record, their total size, the topics not in known)``: :func:`encode_record` for a
#: batch (the store's append), in one compiled call when ``lockmq._core`` is in use;
#: raises the first record's :class:`InvalidRecord` like the loop it replaces.
encode_records = _encode_records_py
if accel.speedups is not None:
    _c_encode_records = accel.speedups.encode_records
    encode_records = _encode_records_c


class RecordView(NamedTuple):
    """Fields of a record found while scanning (payload and headers not decoded)."""

    pos: int
    size: int
    topic: str
    sn: str
    seq: int
    lock_ts_ms: int
    broker_ts_us: int


def check_record(buf: bytes | memoryview, pos: int, end: int) -> str | None:
    """Return why the record at ``buf[pos:]`` is bad, or None if it is whole and valid."""
    if end - pos < HEADER_SIZE:
        return "truncated header"
    (length, crc, fmt, flags, tlen, slen, _res, hlen, _seq, plen, _lts,
     _bts) = HEADER.unpack_from(buf, pos)
    if length < HEADER_SIZE - 4:
        return f"length field {length} too small"
    if pos + 4 + length > end:
        return f"length {length} runs past the end"
    if zlib.crc32(buf[pos + 8:pos + 4 + length]) != crc:
        return "checksum mismatch"
    if fmt != FORMAT_VERSION:
        return f"unknown format {fmt}"
    if HEADER_SIZE + tlen + slen + hlen + plen != 4 + length:
        return "field lengths do not add up"
    return None


def next_valid(buf: Any, pos: int, end: int) -> int | None:
    """Where the first whole, valid record after a bad one at ``buf[pos:]`` starts
    (``None``: none before ``end``): how a reader gets past damage without losing
    the intact records after it. ``buf`` is a bytes-like object with ``find``
    (bytes, mmap).

    Every position whose format byte is right is checked like :func:`check_record`
    (a false match would need a CRC-32 collision), in order. The bad record's own
    length, when it leads to a valid record, bounds the search (a damaged payload
    leaves its framing intact); it is not taken on trust, since the length may be
    the damaged field."""
    limit = end
    shortcut = None
    if end - pos >= HEADER_SIZE:
        length = HEADER.unpack_from(buf, pos)[0]
        nxt = pos + 4 + length
        if length >= HEADER_SIZE - 4 and nxt < end and check_record(buf, nxt, end) is None:
            shortcut = limit = nxt
    unpack = HEADER.unpack_from
    fmt_byte = bytes([FORMAT_VERSION])
    c = pos + 1
    while True:
        f = buf.find(fmt_byte, c + 8, limit + 8)
        if f < 0 or f - 8 >= limit:
            return shortcut
        c = f - 8
        if end - c < HEADER_SIZE:
            return shortcut
        (length, crc, _fmt, _fl, tlen, slen, res, hlen, _s, plen, _l, _b) = unpack(buf, c)
        if (res == 0 and length >= HEADER_SIZE - 4 and c + 4 + length <= end
                and HEADER_SIZE + tlen + slen + hlen + plen == 4 + length
                and zlib.crc32(buf[c + 8:c + 4 + length]) == crc):
            return c
        c += 1


def trailing_zeros(buf: bytes | memoryview, pos: int, end: int) -> int:
    """Where the run of zero bytes that ends at ``end`` starts (``pos`` at the
    earliest). It is ``pos`` when ``buf[pos:end]`` holds only zeros: the preallocated,
    never-written tail of an active segment, where its records end (FORMAT.md).
    Read backwards 64 KiB at a time."""
    step = 1 << 16
    hi = end
    while hi > pos:
        lo = max(pos, hi - step)
        n = len(bytes(buf[lo:hi]).rstrip(b"\0"))
        if n:
            return lo + n
        hi = lo
    return pos


def scan(buf: bytes | memoryview, pos: int, end: int) -> Iterator[RecordView]:
    """Yield every valid record from ``pos`` on; stop at ``end`` or the first bad one.

    The caller learns where scanning stopped from the last ``pos + size`` (or
    ``pos`` if nothing was yielded) and calls :func:`check_record` there for the reason.
    """
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    while end - pos >= HEADER_SIZE:
        (length, crc, fmt, _flags, tlen, slen, _res, hlen, seq, plen, lts,
         bts) = unpack(buf, pos)
        nxt = pos + 4 + length
        if (length < HEADER_SIZE - 4 or nxt > end or fmt != FORMAT_VERSION
                or HEADER_SIZE + tlen + slen + hlen + plen != 4 + length
                or crc32(buf[pos + 8:nxt]) != crc):
            return
        t0 = pos + HEADER_SIZE
        try:
            topic = bytes(buf[t0:t0 + tlen]).decode("ascii")
            sn = bytes(buf[t0 + tlen:t0 + tlen + slen]).decode("ascii")
        except UnicodeDecodeError:
            return
        yield RecordView(pos, 4 + length, topic, sn, seq, lts, bts)
        pos = nxt


# Topic names and SNs repeat from record to record: decode each distinct one once.
_TEXT_CACHE: dict[bytes, str] = {}
_TEXT_CACHE_MAX = 65536


def _text(raw: bytes, encoding: str) -> str:
    text = _TEXT_CACHE.get(raw)
    if text is None:
        text = raw.decode(encoding, "replace")
        if len(_TEXT_CACHE) >= _TEXT_CACHE_MAX:
            _TEXT_CACHE.clear()
        _TEXT_CACHE[raw] = text
    return text


def decode_record(buf: bytes | memoryview, pos: int = 0, offset: int = -1,
                  queue_offset: int = -1) -> StoredRecord:
    """Decode the record at ``buf[pos:]`` fully, verifying its checksum.

    One header unpack serves the checks and the fields (this is the consumer
    read path); only a bad record pays for :func:`check_record`'s diagnosis.
    """
    end = len(buf)
    if end - pos >= HEADER_SIZE:
        (length, crc, fmt, _flags, tlen, slen, _res, hlen, seq, plen, lts,
         bts) = HEADER.unpack_from(buf, pos)
        nxt = pos + 4 + length
        valid = (length >= HEADER_SIZE - 4 and nxt <= end and fmt == FORMAT_VERSION
                 and HEADER_SIZE + tlen + slen + hlen + plen == 4 + length
                 and zlib.crc32(buf[pos + 8:nxt]) == crc)
    else:
        valid = False
    if not valid:
        raise CorruptRecord(f"record at offset {offset}: {check_record(buf, pos, end)}")
    p = pos + HEADER_SIZE
    topic = _text(bytes(buf[p:p + tlen]), "utf-8")
    p += tlen
    sn = _text(bytes(buf[p:p + slen]), "ascii")
    p += slen
    headers = None
    if hlen:
        try:
            headers = json.loads(bytes(buf[p:p + hlen]).decode("utf-8"))
        except ValueError as exc:
            raise CorruptRecord(f"record at offset {offset}: bad headers JSON: {exc}") from None
    p += hlen
    payload = bytes(buf[p:p + plen])
    return StoredRecord(offset, queue_offset, topic, sn, seq, lts, bts, headers, payload)
