"""The compiled hot path (``lockmq._core``) against the pure-Python code it mirrors.

Every test runs on both paths (``impl``: ``pure`` and ``compiled``; the compiled one is
skipped, with the reason, when the extension was not built) and most compare the
two directly: the same vectors, the same answers for random, truncated and corrupt
bytes, and the same errors for bad input once the Python decoder takes over.
"""
from __future__ import annotations

import binascii
import gc
import hashlib
import hmac
import json
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from lockmq import protocol as p
from lockmq.protocol import batch as py_batch
from lockmq.protocol._constants import OP_NAMES
from lockmq.store import records
from lockmq.store.errors import InvalidRecord
from lockmq.store.records import Appended, NewRecord

from .helpers import FUZZ, NOT_BUILT, SPEEDUPS

VECTORS = json.loads((Path(p.__file__).parent / "vectors.json").read_text())
SN = "LK-0001"
MAX = p.DEFAULT_MAX_FRAME


PURE = SimpleNamespace(scan_publishes=py_batch.scan_publishes, scan_frame=py_batch.scan_frame,
                       publish_acks=py_batch.publish_acks, queue_run=py_batch.queue_run,
                       encode_records=records._encode_records_py,
                       crc16=lambda d, c=0xFFFF: binascii.crc_hqx(d, c), crc32=zlib.crc32)


def _compiled_impl() -> SimpleNamespace:
    def encode_records(recs, ts, maxrec, known):
        # records._encode_records_c over this module, whatever LOCKMQ_PURE_PYTHON says
        saved = getattr(records, "_c_encode_records", None)
        records._c_encode_records = SPEEDUPS.encode_records
        try:
            return records._encode_records_c(recs, ts, maxrec, known)
        finally:
            if saved is None:
                del records._c_encode_records
            else:
                records._c_encode_records = saved
    return SimpleNamespace(scan_publishes=SPEEDUPS.scan_publishes,
                           scan_frame=SPEEDUPS.scan_frame, publish_acks=SPEEDUPS.publish_acks,
                           queue_run=SPEEDUPS.queue_run, encode_records=encode_records,
                           crc16=SPEEDUPS.crc16, crc32=SPEEDUPS.crc32)


IMPLS = [pytest.param("pure"), pytest.param("compiled", marks=NOT_BUILT)]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> SimpleNamespace:
    return PURE if request.param == "pure" else _compiled_impl()


def publish(seq: int, payload: bytes = b"x" * 24, opaque: int = 0, sn: str = SN,
            topic: str = "lock.events", flags: int = 0) -> bytes:
    return p.encode_frame(p.Op.PUBLISH, sn, p.Publish(topic, seq, 1000 + seq, payload).encode(),
                          opaque, flags)


# -- checksums -------------------------------------------------------------------------

def test_crc_vectors(impl: SimpleNamespace) -> None:
    for v in VECTORS["crc16"]:
        assert impl.crc16(bytes.fromhex(v["data_hex"]), 0xFFFF) == v["crc"]
    assert impl.crc32(b"123456789") == 0xCBF43926


@settings(max_examples=200 * FUZZ, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF))
@NOT_BUILT
def test_c_checksums_are_the_standard_librarys(data: bytes, c16: int, c32: int) -> None:
    assert SPEEDUPS.crc16(data, c16) == binascii.crc_hqx(data, c16)
    assert SPEEDUPS.crc32(data, c32) == zlib.crc32(data, c32)


@settings(max_examples=200 * FUZZ, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300))
@NOT_BUILT
def test_c_hmac_is_the_standard_librarys(key: bytes, msg: bytes) -> None:
    from lockmq.security import keys

    assert SPEEDUPS.hmac_sha256(key, msg) == keys.py_hmac_sha256(key, msg) \
        == hmac.new(key, msg, hashlib.sha256).digest()
    # (the process's one choice: the core's, unless LOCKMQ_PURE_PYTHON chose Python)
    from lockmq import accel
    assert keys.hmac_sha256 is (SPEEDUPS.hmac_sha256 if accel.COMPILED else keys.py_hmac_sha256)


# -- scan_publishes ----------------------------------------------------------------------

def test_vector_frames_scan_as_the_decoder_reads_them(impl: SimpleNamespace) -> None:
    for v in VECTORS["frames"] + VECTORS["host_frames"] + VECTORS["invalid_frames"]:
        raw = bytes.fromhex(v["hex"])
        sn = v.get("sn", "")
        got, pos = impl.scan_publishes(raw, 0, MAX, sn, 10)
        if v.get("opcode") == p.Op.PUBLISH and "error" not in v:
            f = v["fields"]
            assert got == [(v["opaque"], v["flags"], sn, f["topic"], f["seq"], f["lock_ts_ms"],
                            bytes.fromhex(f["payload"]["hex"]))], v["name"]
            assert pos == len(raw)
        else:   # another opcode or a broken frame: left to the decoder
            assert (got, pos) == ([], 0), v["name"]


def test_scan_stops_before_what_the_session_must_see(impl: SimpleNamespace) -> None:
    good = publish(1, opaque=7) + publish(2, sn="", opaque=8)
    for stop in (p.encode_frame(p.Op.HEARTBEAT, SN, b"", 9),        # another request
                 publish(3, sn="LK-0002"),                             # another SN
                 publish(3, flags=p.Flag.MAC),                         # frame MACs
                 p.encode_frame(p.Op.PUBLISH, SN, b"\x05abc", 1),      # a bad body
                 publish(3)[:-1] + b"\x00",                            # a bad CRC
                 publish(3)[:20]):                                     # a partial frame
        got, pos = impl.scan_publishes(good + stop + publish(4), 0, MAX, SN, 100)
        assert [t[4] for t in got] == [1, 2] and pos == len(good)
        assert got[1][2] == SN   # an empty SN is the session's
    got, pos = impl.scan_publishes(b"junk" + good, 4, MAX, SN, 1)      # pos, limit
    assert [t[4] for t in got] == [1] and pos == 4 + len(publish(1, opaque=7))
    big = publish(5, payload=b"y" * 200)
    assert impl.scan_publishes(big, 0, len(big) - 1, SN, 9) == ([], 0)  # over max_frame


# A stream of valid frames of several kinds, then corrupted at random.
_frame = st.one_of(
    st.builds(lambda seq, pl, op, sn, fl, tp: publish(seq, pl, op, sn, tp, fl),
              st.integers(0, 2**32 - 1), st.binary(max_size=80), st.integers(0, 2**32 - 1),
              st.sampled_from([SN, "", "LK-0002", "é"]), st.sampled_from([0, 1, 2, 4]),
              st.sampled_from(["lock.events", "t", "ü.x", "a" * 200])),
    st.builds(lambda op, body: p.encode_frame(op, SN, body, 1),
              st.sampled_from([p.Op.PUBLISH, p.Op.HEARTBEAT, 0x7777]), st.binary(max_size=40)),
    st.binary(max_size=30))
_damage = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4)


@settings(max_examples=400 * FUZZ, deadline=None)
@given(st.lists(_frame, max_size=12), _damage, st.integers(0, 40),
       st.sampled_from([p.MIN_FRAME, 64, 300, MAX]), st.integers(0, 20))
@NOT_BUILT
def test_c_scanner_answers_as_the_pure_one(frames: list[bytes], damage: list[tuple[int, int]],
                                           cut: int, max_frame: int, limit: int) -> None:
    buf = bytearray(b"".join(frames))
    for at, byte in damage:
        if buf:
            buf[at % len(buf)] = byte
    buf = bytes(buf[:max(0, len(buf) - cut)])
    for start in (0, min(3, len(buf))):
        for data in (buf, bytearray(buf)):
            assert SPEEDUPS.scan_publishes(data, start, max_frame, SN, limit) == \
                py_batch.scan_publishes(data, start, max_frame, SN, limit)


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 250), st.integers(0, 2**40))
@NOT_BUILT
def test_c_scanner_survives_any_bytes(data: bytes, pos: int, max_frame: int) -> None:
    got, end = SPEEDUPS.scan_publishes(data, pos, max_frame, SN, 50)
    assert pos <= end <= max(pos, len(data))
    if p.MIN_FRAME <= max_frame <= p.HARD_MAX_FRAME:   # (the decoder's legal limits)
        assert (got, end) == py_batch.scan_publishes(data, pos, max_frame, SN, 50)


def _read_all(dec: p.FrameDecoder, scan, frame_scan=None) -> list:
    """What a broker sees of the decoder's bytes: publishes taken by ``scan``, frames
    taken by ``frame_scan`` (None: neither) and frames from the decoder, in order,
    ending with the error it raised."""
    out: list = []
    while True:
        if scan is not None:
            out.extend(("pub",) + t[3:] for t in py_batch.take_publishes(dec, SN, 4, scan))
        f = py_batch.take_frame(dec, frame_scan) if frame_scan is not None else None
        if f is None:
            try:
                f = dec.next_frame()
            except p.ProtocolError as exc:
                out.append((type(exc).__name__, exc.code, exc.message))
                if isinstance(exc, p.UnknownOpcode):
                    continue
                return out
            if f is None:
                return out
        if f.opcode == p.Op.PUBLISH and not f.flags & p.Flag.MAC and f.sn in ("", SN):
            try:
                out.append(("pub",) + py_batch.publish_fields(f.body))
            except p.ProtocolError as exc:
                out.append((type(exc).__name__, exc.code, exc.message))
                return out
        else:
            out.append(("frame", f.opcode, f.sn, f.flags, f.opaque, f.body))


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.lists(_frame, max_size=10), _damage, st.integers(1, 60))
def test_bad_input_raises_the_same_errors_with_the_scanners(frames: list[bytes],
                                                           damage: list[tuple[int, int]],
                                                           chunk: int) -> None:
    buf = bytearray(b"".join(frames))
    for at, byte in damage:
        if buf:
            buf[at % len(buf)] = byte
    # (scan_publishes, scan_frame): the decoder alone, each scanner, and the broker's
    # compiled pair (frames the publish scanner leaves go to the frame reader)
    # and the broker's read of a lock: publishes scanned straight from the read's
    # bytes when the decoder holds nothing (feed_publishes), then the same pair
    readers = [(None, None, False), (py_batch.scan_publishes, None, False),
               (None, py_batch.scan_frame, False), (py_batch.scan_publishes, py_batch.scan_frame, True)]
    if SPEEDUPS:
        readers += [(SPEEDUPS.scan_publishes, None, False), (None, SPEEDUPS.scan_frame, False),
                    (SPEEDUPS.scan_publishes, SPEEDUPS.scan_frame, False),
                    (SPEEDUPS.scan_publishes, SPEEDUPS.scan_frame, True)]
    runs = []
    for scan, frame_scan, feed_scan in readers:
        dec = p.FrameDecoder(300)
        got: list = []
        for i in range(0, len(buf), chunk):
            data = bytes(buf[i:i + chunk])
            fed = py_batch.feed_publishes(dec, data, SN, 4, scan) if feed_scan else None
            if fed is not None:
                got.extend(("pub",) + t[3:] for t in fed[0])
                assert dec.buffered() == len(data) - fed[1]
            else:
                try:
                    dec.feed(data)
                except p.ProtocolError as exc:
                    got.append((type(exc).__name__, exc.code, exc.message))
                    break
            got.extend(_read_all(dec, scan, frame_scan))
            if got and got[-1][0] not in ("pub", "frame", "UnknownOpcode"):
                break
        runs.append(got)
    assert all(r == runs[0] for r in runs[1:])


# -- scan_frame (a handshake frame, or any other, read in one call) ----------------------

def _decoded(raw: bytes, max_frame: int = MAX, known: object = OP_NAMES) -> tuple | None:
    """What the decoder reads first from ``raw``, as scan_frame's tuple; None when it
    needs more bytes or raises."""
    dec = p.FrameDecoder(max_frame, known)
    dec.feed(raw)
    try:
        f = dec.next_frame()
    except p.ProtocolError:
        return None
    return None if f is None else (f.opcode, f.sn, f.flags, f.opaque, f.body,
                                   len(raw) - dec.buffered())


def test_vector_frames_are_read_as_the_decoder_reads_them(impl: SimpleNamespace) -> None:
    seen = 0
    for v in VECTORS["frames"] + VECTORS["host_frames"] + VECTORS["invalid_frames"]:
        raw = bytes.fromhex(v["hex"])
        got = impl.scan_frame(raw, 0, MAX, OP_NAMES)
        assert got == _decoded(raw), v["name"]
        if "error" in v:
            assert got is None, v["name"]
        else:
            seen += 1
            assert got[0] == v["opcode"] and got[5] == len(raw), v["name"]
    assert seen >= 10


def test_scan_frame_leaves_the_unusual_to_the_decoder(impl: SimpleNamespace) -> None:
    connect = p.encode_frame(p.Op.CONNECT, SN, p.Connect(p.Role.LOCK, 30, "fw").encode(), 1)
    assert impl.scan_frame(connect, 0, MAX, OP_NAMES) == \
        (p.Op.CONNECT, SN, 0, 1, p.Connect(p.Role.LOCK, 30, "fw").encode(), len(connect))
    assert impl.scan_frame(b"junk" + connect, 4, MAX, OP_NAMES)[5] == 4 + len(connect)
    for raw, max_frame, known in (
            (connect[:-1], MAX, OP_NAMES),                      # partial
            (connect[:-1] + b"\x00", MAX, OP_NAMES),            # bad CRC
            (connect, len(connect) - 1, OP_NAMES),              # over max_frame
            (connect, MAX, {p.Op.AUTH: "AUTH"}),                # an unknown opcode
            (p.encode_frame(p.Op.CONNECT, "", b"x", 1)[:8] + b"\xff" * 9, MAX, OP_NAMES),
            (b"\x02" + connect[1:], MAX, OP_NAMES)):            # another version
        assert impl.scan_frame(raw, 0, max_frame, known) is None
    bad_sn = bytearray(p.encode_frame(p.Op.CONNECT, "ab", b"", 1))
    bad_sn[8] = 0xFF                                            # an SN that is not UTF-8
    bad_sn[-2:] = p.crc16(bytes(bad_sn[:-2])).to_bytes(2, "big")
    assert impl.scan_frame(bytes(bad_sn), 0, MAX, OP_NAMES) is None
    assert _decoded(bytes(bad_sn)) is None
    assert impl.scan_frame(b"", 0, MAX, OP_NAMES) is None
    assert impl.scan_frame(connect, len(connect) + 5, MAX, OP_NAMES) is None


@settings(max_examples=400 * FUZZ, deadline=None)
@given(st.lists(_frame, max_size=6), _damage, st.integers(0, 40),
       st.sampled_from([p.MIN_FRAME, 64, 300, MAX]), st.integers(0, 30),
       st.sampled_from([OP_NAMES, {p.Op.PUBLISH: "PUBLISH"}, {}]))
@NOT_BUILT
def test_c_frame_reader_answers_as_the_pure_one(frames: list[bytes],
                                                damage: list[tuple[int, int]], cut: int,
                                                max_frame: int, start: int,
                                                known: dict) -> None:
    buf = bytearray(b"".join(frames))
    for at, byte in damage:
        if buf:
            buf[at % len(buf)] = byte
    buf = bytes(buf[:max(0, len(buf) - cut)])
    for data in (buf, bytearray(buf)):
        want = py_batch.scan_frame(data, start, max_frame, known)
        assert SPEEDUPS.scan_frame(data, start, max_frame, known) == want
        assert want == _decoded(buf[start:], max_frame, known) if want is None else \
            want[:5] == _decoded(buf[start:], max_frame, known)[:5]


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 250), st.integers(0, 2**40))
@NOT_BUILT
def test_c_frame_reader_survives_any_bytes(data: bytes, pos: int, max_frame: int) -> None:
    got = SPEEDUPS.scan_frame(data, pos, max_frame, OP_NAMES)
    assert got is None or pos < got[5] <= len(data)
    if p.MIN_FRAME <= max_frame <= p.HARD_MAX_FRAME:   # (the decoder's legal limits)
        assert got == py_batch.scan_frame(data, pos, max_frame, OP_NAMES)


# -- publish_acks ----------------------------------------------------------------------

def test_acks_are_the_generic_frames(impl: SimpleNamespace) -> None:
    batch = [(7, False, None), (8, True, None), (9, False, None), (10, False, None)]
    results = [Appended(100, "t", 0, False), Appended(101, "t", 1, False),
               ValueError("refused"), Appended(-1, "t", -1, True)]
    data, frames, stored, dup, nxt = impl.publish_acks(batch, results, 0)
    assert (frames, stored, dup, nxt) == (1, 2, 0, 2)   # ONEWAY counted, not answered
    assert data == p.encode_frame(p.Op.PUBLISH_ACK, "", p.PublishAck(0, 100).encode(), 7,
                                  p.Flag.RESPONSE)
    data, frames, stored, dup, nxt = impl.publish_acks(batch, results, 3)
    assert (frames, stored, dup, nxt) == (1, 0, 1, 4)
    assert data == p.encode_frame(p.Op.PUBLISH_ACK, "", p.PublishAck(1, 0).encode(), 10,
                                  p.Flag.RESPONSE)
    assert impl.publish_acks(batch, results, 4) == (b"", 0, 0, 0, 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.booleans(),
                          st.one_of(st.none(), st.integers(-1, 2**63 - 1)), st.booleans()),
                max_size=30))
@NOT_BUILT
def test_c_acks_match_the_pure_ones(rows: list) -> None:
    batch = [(op, oneway, None) for op, oneway, _, _ in rows]
    results = [RuntimeError("x") if off is None else Appended(off, "t", 0, dup)
               for _, _, off, dup in rows]
    for start in range(len(rows) + 1):
        assert SPEEDUPS.publish_acks(batch, results, start) == \
            py_batch.publish_acks(batch, results, start)


# -- queue_run -----------------------------------------------------------------------------

_pub_tuple = st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([0, 0, 1, 2, 3]),
                       st.just(SN), st.sampled_from(["a", "a", "b", "lock.events"]),
                       st.integers(0, 2**32 - 1), st.integers(0, 2**63), st.binary(max_size=40))


def _run(impl: SimpleNamespace, pubs: list, start: int, limit: int) -> tuple:
    queue: list = []
    recs: list = [NewRecord("x", SN, 0)]   # (appended to, never touched)
    stop, size = impl.queue_run(pubs, start, limit, NewRecord, queue, recs)
    assert [r for _, _, r in queue] == recs[1:]
    return stop, size, [(o, ow, repr(r)) for o, ow, r in queue]


def test_a_run_is_one_topic_answered(impl: SimpleNamespace) -> None:
    pubs = [(1, 0, SN, "a", 1, 0, b"x"), (2, 0, SN, "a", 2, 0, b""),
            (3, p.Flag.ONEWAY, SN, "a", 3, 0, b""), (4, 0, SN, "b", 4, 7, b""),
            (5, 0, SN, "b", 5, 0, b"yy"), (6, 0, SN, "a", 6, 0, b"")]
    assert [_run(impl, pubs, i, 10)[:2] for i in range(7)] == \
        [(2, 129), (2, 64), (2, 0), (5, 130), (5, 66), (6, 64), (6, 0)]
    assert _run(impl, pubs, 3, 1)[:2] == (4, 64) and _run(impl, pubs, 0, 0)[:2] == (0, 0)
    queue: list = []
    recs: list = []
    impl.queue_run(pubs, 3, 10, NewRecord, queue, recs)
    assert [(o, ow) for o, ow, _ in queue] == [(4, False), (5, False)]
    assert [(r.topic, r.sn, r.seq, r.lock_ts_ms, r.payload, r.headers) for r in recs] == \
        [("b", SN, 4, 7, b"", None), ("b", SN, 5, 0, b"yy", None)]
    for bad in (-1, 7):
        with pytest.raises(ValueError):
            impl.queue_run(pubs, bad, 1, NewRecord, [], [])


def test_a_failed_run_leaves_nothing_queued(impl: SimpleNamespace) -> None:
    def record(*args):
        if args[2] == 3:
            raise RuntimeError("no")
        return NewRecord(*args)
    pubs = [(i, 0, SN, "a", i, 0, b"") for i in range(1, 5)]
    queue, recs = [(0, False, None)], [None]
    with pytest.raises(RuntimeError):
        impl.queue_run(pubs, 0, 10, record, queue, recs)
    assert queue == [(0, False, None)] and recs == [None]


class _CountedRecord(NewRecord):
    """NewRecord's slots, its own __init__: the compiled queue_run must call it."""

    __slots__ = ()
    made = 0

    def __init__(self, *args) -> None:
        super().__init__(*args)
        type(self).made += 1


def test_records_are_whole_and_a_subclass_init_still_runs(impl: SimpleNamespace) -> None:
    # (the compiled path builds NewRecord without its __init__: every slot filled,
    # a real, collectable object; a subclass or another callable is called as before)
    pubs = [(i, 0, SN, "a", i, 7, b"p" * i) for i in range(1, 4)]
    for record_type, extra in ((NewRecord, 0), (_CountedRecord, 3), (NewRecord, 0)):
        queue, recs = [], []
        made = _CountedRecord.made
        impl.queue_run(pubs, 0, 10, record_type, queue, recs)
        assert [type(r) for r in recs] == [record_type] * 3
        assert [(r.topic, r.sn, r.seq, r.lock_ts_ms, r.payload, r.headers) for r in recs] == \
            [("a", SN, i, 7, b"p" * i, None) for i in range(1, 4)]
        assert _CountedRecord.made == made + extra
        assert all(gc.is_tracked(r) for r in recs)
        recs[0].headers = {"retries": 1}   # the slots stay writable
        assert recs[0].headers == {"retries": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(_pub_tuple, max_size=20), st.integers(0, 20), st.integers(-1, 25))
@NOT_BUILT
def test_c_runs_match_the_pure_ones(pubs: list, start: int, limit: int) -> None:
    start = min(start, len(pubs))
    assert _run(SPEEDUPS, pubs, start, limit) == _run(PURE, pubs, start, limit)


# -- encode_records ----------------------------------------------------------------------

_record = st.builds(
    NewRecord,
    st.sampled_from(["lock.events", "$sys.x", "bad topic", "t" * 129, "ü", 5]),
    st.sampled_from([SN, "", "é", "x" * 256, "x" * 255, 7]),
    st.one_of(st.integers(-1, 2**32), st.just(True)),
    st.one_of(st.integers(-1, 2**63), st.just(False)),
    st.one_of(st.binary(max_size=300), st.binary(max_size=8).map(bytearray), st.just("text")),
    st.sampled_from([None, None, {"retries": 1}, {"x": object()}]))


def _encode(impl: SimpleNamespace, recs: list, ts: int, maxrec: int, known: dict):
    try:
        return impl.encode_records(recs, ts, maxrec, known)
    except InvalidRecord as exc:
        return ("InvalidRecord", str(exc))


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.lists(_record, max_size=8), st.integers(0, 2**62), st.sampled_from([100, 400, 10**6]),
       st.booleans())
@NOT_BUILT
def test_c_records_are_the_pure_ones(recs: list, ts: int, maxrec: int, warm: bool) -> None:
    known = {"lock.events": object()}
    if not warm:   # topics not yet validated take the Python path in C too
        records._topic_cache.clear()
    assert _encode(_compiled_impl(), recs, ts, maxrec, known) == \
        _encode(PURE, recs, ts, maxrec, known)


def test_records_read_back(impl: SimpleNamespace) -> None:
    recs = [NewRecord("lock.events", SN, i, 1000 + i, b"p" * i) for i in range(5)]
    recs.append(NewRecord("other.t", SN, 9, 0, b"h", {"retries": 2}))
    enc, n, new = impl.encode_records(recs, 123456, 10**6, {"lock.events": None})
    assert new == {"other.t"} and n == sum(map(len, enc))
    for r, b in zip(recs, enc):
        assert b == records.encode_record(r, 123456, 10**6)
        back = records.decode_record(b)
        assert (back.topic, back.sn, back.seq, back.payload, back.headers) == \
            (r.topic, r.sn, r.seq, r.payload, r.headers)
    with pytest.raises(InvalidRecord, match="max_record_bytes"):
        impl.encode_records(recs, 1, 50, {})
    assert struct.unpack_from("<I", enc[0])[0] == len(enc[0]) - 4


def test_the_environment_variable_forces_the_pure_path() -> None:
    import os
    import subprocess
    import sys

    probe = "import lockmq.accel as a; print(a.COMPILED, a.DESCRIPTION)"
    env = {k: v for k, v in os.environ.items() if k != "LOCKMQ_PURE_PYTHON"}
    forced = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=dict(env, LOCKMQ_PURE_PYTHON="1"), check=True).stdout
    assert forced == "False pure Python (LOCKMQ_PURE_PYTHON is set)\n"
    default = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             env=env, check=True).stdout
    assert default == (f"True compiled (lockmq._core, SHA-256 {SPEEDUPS.SHA256})\n"
                       if SPEEDUPS is not None else
                       "False pure Python (lockmq._core is not built)\n")
