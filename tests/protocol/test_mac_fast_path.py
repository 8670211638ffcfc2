"""The CPython fast path of frame MACs (protocol/_macfast.py) seals and opens exactly
as the portable one (_mac.py): the shared vectors pass with either, random frames get
the same tags, both refuse the same altered, replayed and reordered frames, and
MicroPython never loads it."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from lockmq import protocol as p
from lockmq.protocol import _mac, _macfast
from lockmq.protocol._crc import crc16_table
from lockmq.protocol._session import _Session

from . import vector_checks
from lockmq.testing.micropython import PROTOCOL


def session(key: bytes, out: int) -> _Session:
    """A bare established session with frame MACs on, sealing in direction ``out``."""
    s = _Session()
    s._OUT = out
    s.mac_key = key
    s.state = p.ESTABLISHED
    return s


def test_the_fast_path_is_on_under_cpython() -> None:
    assert _Session.seal is _macfast.seal and _Session._open is _macfast.open_frame


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "portable"])
def test_vectors_pass_on_both_paths(fast: bool) -> None:
    _macfast.install(fast)
    try:
        assert (_Session.seal is _macfast.seal) is fast
        passed, failures = vector_checks.run(str(PROTOCOL / "vectors.json"), [crc16_table])
    finally:
        _macfast.install(True)
    assert failures == []
    assert passed > 100


frames = st.tuples(st.sampled_from([p.Op.PUBLISH, p.Op.HEARTBEAT, p.Op.PUBLISH_ACK]),
                   st.sampled_from(["", "LOCK-0001", "L" * 64]),
                   st.binary(max_size=300), st.integers(0, 2**32 - 1),
                   st.sampled_from([0, p.Flag.RESPONSE]))


@given(st.binary(min_size=1, max_size=100), st.lists(frames, min_size=1, max_size=5))
def test_random_frames_get_the_portable_tags_and_open_on_either_path(key: bytes,
                                                                     batch: list) -> None:
    fast, portable = session(key, _mac.TO_BROKER), session(key, _mac.TO_BROKER)
    try:
        sealed = []
        for op, sn, body, opaque, flags in batch:
            got = _macfast.seal(fast, op, sn, body, opaque, flags)
            _macfast.install(False)
            assert portable.seal(op, sn, body, opaque, flags) == got
            _macfast.install(True)
            sealed.append((got, body))
        # the broker's side opens them, fast and portable alike, in order
        for opener in (_macfast.open_frame, _mac.open_frame):
            broker = session(key, _mac.TO_CLIENT)
            for data, body in sealed:
                dec = p.FrameDecoder(1 << 20)
                dec.feed(data)
                (frame,) = list(dec.frames())
                opener(broker, frame)
                assert frame.body == body
    finally:
        _macfast.install(True)


@pytest.mark.parametrize("fault", ["altered", "replayed", "reordered", "untagged",
                                   "unasked"])
def test_both_paths_refuse_the_same_frames(fault: str) -> None:
    key = bytes(range(32))
    lock = session(key, _mac.TO_BROKER)
    first = lock.seal(p.Op.PUBLISH, "LOCK-1", b"first", 7)
    second = lock.seal(p.Op.PUBLISH, "LOCK-1", b"second", 8)
    feed = {"altered": [first[:-3] + bytes([first[-3] ^ 1]) + first[-2:]],
            "replayed": [first, first], "reordered": [second],
            "untagged": [p.encode_frame(p.Op.PUBLISH, "LOCK-1", b"x" * 20, 9)],
            "unasked": [first]}[fault]
    for opener in (_macfast.open_frame, _mac.open_frame):
        broker = session(None if fault == "unasked" else key, _mac.TO_CLIENT)
        frames = []
        for data in feed:
            if fault == "altered":   # (a CRC that fits the altered bytes, as an attacker's)
                data = _recrc(data)
            dec = p.FrameDecoder(1 << 20)
            dec.feed(data)
            frames += list(dec.frames())
        with pytest.raises(p.SessionError) as err:
            for frame in frames:
                opener(broker, frame)
        assert err.value.code == p.ErrorCode.BAD_MAC and err.value.fatal
        # the tag check is an action, not a transition: ServerSession.receive ends the
        # session on its fatal error (test_session.py), the opener writes no state
        assert broker.state == p.ESTABLISHED


def _recrc(frame: bytes) -> bytes:
    """``frame`` with its checksum made right again for its (altered) bytes."""
    body = frame[:-2]
    return body + p.crc16(body).to_bytes(2, "big")


def test_a_new_key_is_hashed_again() -> None:
    s = session(b"k" * 32, _mac.TO_BROKER)
    one = _macfast.frame_tag(s, 0, 0, p.Op.PUBLISH, "A", 4, 1, b"x")
    s.mac_key = b"j" * 32
    two = _macfast.frame_tag(s, 0, 0, p.Op.PUBLISH, "A", 4, 1, b"x")
    assert one != two
    assert two == _mac.frame_tag(b"j" * 32, 0, 0, p.Op.PUBLISH, "A", 4, 1, b"x")


answers = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.booleans(),
                             st.one_of(st.integers(-1, 2**40), st.none()), st.booleans()),
                   max_size=12)


def _answered(runs: list) -> tuple[list, list]:
    """The connection's batch and the store's results for ``runs``: (opaque, oneway,
    offset or None for a refusal, duplicate) per publish."""
    from lockmq.store import Appended

    batch = [(opaque, oneway, None) for opaque, oneway, _, _ in runs]
    results = [RuntimeError("refused") if off is None else
               Appended(-1 if dup else off, "t", -1 if dup else 0, dup)
               for _, _, off, dup in runs]
    return batch, results


@given(answers, st.integers(0, 2**32 - 1))
def test_a_run_of_sealed_acks_is_what_sealing_each_ack_gives(runs: list, tx: int) -> None:
    batch, results = _answered(runs)
    fast, each = session(b"s" * 32, _mac.TO_CLIENT), session(b"s" * 32, _mac.TO_CLIENT)
    fast.tx = each.tx = tx
    data, frames, stored, dup, i = _macfast.sealed_publish_acks(fast, batch, results, 0)
    want = []
    for (opaque, oneway, _), a in zip(batch, results):
        if isinstance(a, Exception):
            break
        if not oneway:
            want.append(each.seal(p.Op.PUBLISH_ACK, "", p.PublishAck(
                int(a.duplicate), max(a.offset, 0)).encode(), opaque, p.Flag.RESPONSE))
    assert data == b"".join(want) and frames == len(want)
    assert i == len(results) if all(not isinstance(a, Exception) for a in results) \
        else isinstance(results[i], Exception)
    assert stored + dup == i and dup == sum(1 for a in results[:i] if a.duplicate)
    assert fast.tx == each.tx


# -- the compiled scan of sealed publishes (lockmq._core), against the session ----

from .helpers import FUZZ, NOT_BUILT, SPEEDUPS  # noqa: E402

compiled = NOT_BUILT   # skips where lockmq._core is not built


@settings(max_examples=100 * FUZZ, deadline=None)
@compiled
@given(st.binary(min_size=1, max_size=100), st.binary(max_size=200),
       st.sampled_from([b"", b"LOCK-9", b"L" * 64]), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 7))
def test_compiled_tags_are_the_reference_tags(key: bytes, body: bytes, sn: bytes,
                                              counter: int, opaque: int, flags: int) -> None:
    got = SPEEDUPS.frame_tag(SPEEDUPS.mac_pads(key), 1, counter, p.Op.PUBLISH, flags,
                             opaque, sn, body)
    assert got == _mac.frame_tag(key, 1, counter, p.Op.PUBLISH, sn, flags, opaque, body)


# (run in a fresh interpreter: the core as it loads first; not through lockmq.accel, so
# that it is tested whatever LOCKMQ_PURE_PYTHON says)
_EVERY_LENGTH = """
import hashlib, hmac, struct
from lockmq import _core as sp
for key in (b"", b"k", bytes(range(64)), bytes(range(65)), b"K" * 200):
    pads = sp.mac_pads(key)
    for n in range(0, 301):
        body = bytes((i * 7 + n) & 0xFF for i in range(n))
        head = struct.pack(">BIHBIB", 1, n, 0x10, 4, 2 * n, 3) + b"SN1"
        want = hmac.new(key, head + body, hashlib.sha256).digest()[:16]
        assert sp.frame_tag(pads, 1, n, 0x10, 4, 2 * n, b"SN1", body) == want, (key, n)
print(sp.SHA256)
"""


@compiled
def test_the_cores_sha256_gives_hashlibs_tags_for_every_length() -> None:
    """The core's HMAC-SHA256 (RustCrypto ``sha2``, which picks the CPU's SHA
    extensions at run time and says which in ``SHA256``) gives the standard library's
    HMAC for every length across the block boundaries, and for keys longer than a
    block. (The C extension had two block functions and LOCKMQ_SHA256=portable to pick
    the second; ``sha2`` has one dispatch, tested by its own suite on both paths.)"""
    got = subprocess.run([sys.executable, "-c", _EVERY_LENGTH], capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == SPEEDUPS.SHA256
    assert SPEEDUPS.SHA256 in ("sha-ni", "armv8-sha2", "portable")


records = st.lists(st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 2**32 - 1),
                             st.binary(max_size=80), st.sampled_from(["", "LOCK-9"])),
                   min_size=1, max_size=8)


@settings(max_examples=100 * FUZZ, deadline=None)
@compiled
@given(records, st.integers(-1, 8), st.integers(0, 2**32 - 1))
def test_compiled_scan_takes_what_the_session_opens_and_stops_where_it_would_not(
        recs: list, spoil: int, rx: int) -> None:
    """Sealed PUBLISH frames, one spoiled (its tag altered) when ``spoil`` points at one:
    the scan returns the fields the session's own path gives for the frames before it,
    counts them as opened, and leaves the spoiled one, at its place, to that path."""
    from lockmq.protocol._fast import publish_fields, take_sealed_publishes

    key = b"k" * 32
    lock = session(key, _mac.TO_BROKER)
    lock.tx = rx
    stream = []
    for i, (topic, seq, payload, sn) in enumerate(recs):
        body = p.Publish(topic, seq, 0, payload).encode()
        frame = lock.seal(p.Op.PUBLISH, sn, body, 100 + i)
        if i == spoil:
            frame = frame[:-3] + bytes([frame[-3] ^ 1]) + frame[-2:]
            frame = frame[:-2] + p.crc16(frame[:-2]).to_bytes(2, "big")
        stream.append(frame)
    broker = session(key, _mac.TO_CLIENT)
    broker.name = "LOCK-9"
    broker.rx = rx
    dec = p.FrameDecoder(1 << 20)
    dec.feed(b"".join(stream))
    got = take_sealed_publishes(dec, broker, 1024, SPEEDUPS.scan_sealed_publishes,
                                SPEEDUPS.mac_pads(key))
    taken = len(recs) if not 0 <= spoil < len(recs) else spoil
    assert len(got) == taken and broker.rx == rx + taken
    reference = session(key, _mac.TO_CLIENT)
    reference.rx = rx
    want = []
    for data in stream[:taken]:
        d = p.FrameDecoder(1 << 20)
        d.feed(data)
        (f,) = list(d.frames())
        _macfast.open_frame(reference, f)
        want.append((f.opaque, f.flags, "LOCK-9", *publish_fields(f.body)))
    assert got == want
    if taken < len(recs):   # the spoiled frame is next, and the session refuses it
        f = dec.next_frame()
        with pytest.raises(p.SessionError) as err:
            _macfast.open_frame(broker, f)
        assert err.value.code == p.ErrorCode.BAD_MAC


@compiled
@given(answers, st.integers(0, 2**32 - 1))
def test_compiled_sealed_acks_are_the_reference_ones(runs: list, tx: int) -> None:
    batch, results = _answered(runs)
    reference = session(b"s" * 32, _mac.TO_CLIENT)
    reference.tx = tx
    want = _macfast.sealed_publish_acks(reference, batch, results, 0)
    got = SPEEDUPS.sealed_publish_acks(batch, results, 0, SPEEDUPS.mac_pads(b"s" * 32), tx)
    assert got == want and reference.tx == tx + got[1]


@compiled
@given(st.binary(max_size=300), st.integers(0, 320), st.integers(0, 2**32 - 1))
def test_compiled_sealed_scan_takes_nothing_from_noise(noise: bytes, pos: int, rx: int) -> None:
    # (no frame of random bytes has a valid CRC and tag; nothing read past the buffer)
    pubs, end, rx_after = SPEEDUPS.scan_sealed_publishes(
        noise, pos, 1 << 20, "LOCK-9", 1024, SPEEDUPS.mac_pads(b"k" * 32), rx)
    assert (pubs, end, rx_after) == ([], pos, rx)


@compiled
@given(st.integers(1, 6), st.data())
def test_compiled_sealed_scan_takes_only_whole_frames_of_a_cut_stream(count: int, data) -> None:
    key = b"k" * 32
    lock = session(key, _mac.TO_BROKER)
    frames = [lock.seal(p.Op.PUBLISH, "LOCK-9", p.Publish("lock.x", i, 0, b"e" * 24).encode(),
                        i) for i in range(count)]
    stream = b"".join(frames)
    cut = data.draw(st.integers(0, len(stream)))
    pubs, end, rx = SPEEDUPS.scan_sealed_publishes(stream[:cut], 0, 1 << 20, "LOCK-9", 1024,
                                                   SPEEDUPS.mac_pads(key), 0)
    whole = 0
    while whole < count and sum(len(f) for f in frames[:whole + 1]) <= cut:
        whole += 1
    assert len(pubs) == whole == rx and end == sum(len(f) for f in frames[:whole])
