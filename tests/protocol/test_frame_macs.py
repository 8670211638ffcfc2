"""Frame MACs have two implementations, the reference (protocol/_mac.py: what a lock
runs, and a host process without the compiled core) and the core's tags
(lockmq._core: mac_pads, frame_tag, scan_sealed_publishes, sealed_publish_acks), which
a host process hands the protocol once, at import (lockmq.accel ->
lockmq.protocol.compiled.use). Here: the shared vectors pass with either, random
frames get the same tags, both refuse the same damaged, replayed and reordered frames,
and the core's batch calls answer as the reference's (protocol/batch.py)."""
from __future__ import annotations

import hmac as std_hmac
import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

import pytest
from hypothesis import given, settings, strategies as st

from lockmq import accel, protocol as p
from lockmq.protocol import _hmac, _mac, batch
from lockmq.protocol import compiled as compiled_api
from lockmq.protocol._crc import crc16_table
from lockmq.protocol._session import _Session

from . import vector_checks
from .helpers import FUZZ, NOT_BUILT, SPEEDUPS
from lockmq.testing.micropython import PROTOCOL

compiled = NOT_BUILT   # skips where lockmq._core is not built

#: what sessions seal and open with, (name, keyed, tag, compare) as _mac holds them:
#: the reference always, the core's where it is built (whatever this process chose:
#: the tests hold both equal either way)
REFERENCE = ("reference", _hmac.hmac_pads, _mac._padded_tag, _hmac.compare_digest)
IMPLS = [REFERENCE] + ([("compiled", SPEEDUPS.mac_pads, SPEEDUPS.frame_tag,
                         std_hmac.compare_digest)] if SPEEDUPS is not None else [])


@contextmanager
def tags(impl: tuple) -> Iterator[None]:
    """Sessions made inside seal and open with ``impl``; the process's own choice
    after (a session keeps its key's state: one made under one does not go on to the
    other)."""
    chosen = (_mac._keyed, _mac._tag, _mac._equal)
    _mac._keyed, _mac._tag, _mac._equal = impl[1:]
    try:
        yield
    finally:
        _mac._keyed, _mac._tag, _mac._equal = chosen


def session(key: bytes | None, out: int) -> _Session:
    """A bare established session with frame MACs on, sealing in direction ``out``."""
    s = _Session()
    s._OUT = out
    s.mac_key = key
    s.state = p.ESTABLISHED
    return s


def test_sessions_take_the_tags_the_process_chose() -> None:
    chosen = (_mac._keyed, _mac._tag, _mac._equal)
    assert chosen == (IMPLS[1] if accel.COMPILED else REFERENCE)[1:]


_CHOICE = ("from lockmq.protocol import _crc, _mac\n"
           "import lockmq.broker.server\n"
           "from lockmq import _core\n"
           "print(_mac._tag is _core.frame_tag, _mac._keyed is _core.mac_pads,\n"
           "      _crc.crc16_init is _core.crc16)\n")


@compiled
@pytest.mark.parametrize("pure", ["1", "0"])
def test_the_choice_is_made_once_at_import_for_the_whole_process(pure: str) -> None:
    """A fresh broker process: the core's tags when it runs compiled, the reference's
    with LOCKMQ_PURE_PYTHON=1 (nothing else decides, per call site or per session)."""
    env = dict(os.environ, LOCKMQ_PURE_PYTHON=pure)
    got = subprocess.run([sys.executable, "-c", _CHOICE], capture_output=True, text=True,
                         env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(pure == "0")] * 3


@pytest.mark.parametrize("impl", IMPLS, ids=[i[0] for i in IMPLS])
def test_vectors_pass_with_either_implementation(impl: tuple) -> None:
    with tags(impl):
        passed, failures = vector_checks.run(str(PROTOCOL / "vectors.json"), [crc16_table])
    assert failures == []
    assert passed > 100


frames = st.tuples(st.sampled_from([p.Op.PUBLISH, p.Op.HEARTBEAT, p.Op.PUBLISH_ACK]),
                   st.sampled_from(["", "LOCK-0001", "L" * 64]),
                   st.binary(max_size=300), st.integers(0, 2**32 - 1),
                   st.sampled_from([0, p.Flag.RESPONSE]))


def _seal_all(impl: tuple, key: bytes, batch_: list, tx: int) -> list[bytes]:
    with tags(impl):
        lock = session(key, _mac.TO_BROKER)
        lock.tx = tx
        return [lock.seal(op, sn, body, opaque, flags) for op, sn, body, opaque, flags in batch_]


def _opened(impl: tuple, key: bytes | None, data: bytes, rx: int) -> tuple:
    """What the broker's side makes of ``data`` with ``impl``: the bodies it opened and
    its counter, or the error that refused it (and the counter then)."""
    with tags(impl):
        broker = session(key, _mac.TO_CLIENT)
        broker.rx = rx
        bodies = []
        try:
            dec = p.FrameDecoder(1 << 20)
            dec.feed(data)
            for frame in dec.frames():
                broker._open(frame)
                bodies.append(bytes(frame.body))
        except p.ProtocolError as exc:
            # the tag check is an action, not a transition: the opener writes no state
            assert broker.state == p.ESTABLISHED
            return bodies, broker.rx, type(exc).__name__, exc.code, getattr(exc, "fatal", None)
        return bodies, broker.rx, None, None, None


@settings(max_examples=100 * FUZZ, deadline=None)
@given(st.binary(min_size=1, max_size=100), st.lists(frames, min_size=1, max_size=5),
       st.integers(0, 2**32 - 1))
def test_random_frames_get_the_same_tags_and_open_with_either(key: bytes, batch_: list,
                                                              tx: int) -> None:
    sealed = [_seal_all(impl, key, batch_, tx) for impl in IMPLS]
    assert all(s == sealed[0] for s in sealed)
    for impl in IMPLS:
        got = _opened(impl, key, b"".join(sealed[0]), tx)
        assert got == ([body for _, _, body, _, _ in batch_], tx + len(batch_), None, None, None)


def _recrc(frame: bytes) -> bytes:
    """``frame`` with its checksum made right again for its (altered) bytes."""
    body = frame[:-2]
    return body + p.crc16(body).to_bytes(2, "big")


@settings(max_examples=200 * FUZZ, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.lists(frames, min_size=1, max_size=4),
       st.integers(0, 2**32 - 1), st.integers(-2, 2), st.data())
def test_damaged_frames_are_refused_alike(key: bytes, batch_: list, tx: int, skew: int,
                                          data) -> None:
    """A sealed run with one frame's byte altered (its CRC made right again, as an
    attacker's), or opened at a skewed counter (replayed, dropped, reordered): both
    implementations open the same frames before it and refuse it the same way."""
    sealed = _seal_all(IMPLS[0], key, batch_, tx)
    i = data.draw(st.integers(0, len(sealed) - 1))
    frame = sealed[i]
    pos = data.draw(st.integers(0, len(frame) - 3))
    flip = data.draw(st.integers(0 if skew else 1, 255))
    sealed[i] = _recrc(frame[:pos] + bytes([frame[pos] ^ flip]) + frame[pos + 1:])
    stream = b"".join(sealed)
    outcomes = [_opened(impl, key, stream, (tx + skew) & 0xFFFFFFFF) for impl in IMPLS]
    assert all(o == outcomes[0] for o in outcomes)
    bodies, _rx, error, code, fatal = outcomes[0]
    if skew == 0 and flip == 0:
        assert error is None and len(bodies) == len(batch_)
    elif error == "SessionError":
        assert code == p.ErrorCode.BAD_MAC and fatal
        assert len(bodies) == (0 if skew else i)
    else:   # the altered byte broke the frame itself: the decoder refused it, or waits
        assert flip and len(bodies) <= i   # for the bytes its length now claims


@pytest.mark.parametrize("impl", IMPLS, ids=[i[0] for i in IMPLS])
@pytest.mark.parametrize("fault", ["altered", "replayed", "reordered", "untagged",
                                   "unasked"])
def test_either_refuses_the_same_frames(fault: str, impl: tuple) -> None:
    key = bytes(range(32))
    first, second = _seal_all(IMPLS[0], key, [(p.Op.PUBLISH, "LOCK-1", b"first", 7, 0),
                                              (p.Op.PUBLISH, "LOCK-1", b"second", 8, 0)], 0)
    feed = {"altered": [_recrc(first[:-3] + bytes([first[-3] ^ 1]) + first[-2:])],
            "replayed": [first, first], "reordered": [second],
            "untagged": [p.encode_frame(p.Op.PUBLISH, "LOCK-1", b"x" * 20, 9)],
            "unasked": [first]}[fault]
    bodies, _rx, error, code, fatal = _opened(impl, None if fault == "unasked" else key,
                                              b"".join(feed), 0)
    assert (error, code, fatal) == ("SessionError", p.ErrorCode.BAD_MAC, True)
    assert bodies == ([b"first"] if fault == "replayed" else [])


@pytest.mark.parametrize("impl", IMPLS, ids=[i[0] for i in IMPLS])
def test_a_sessions_pads_are_made_once_and_again_for_a_new_key(impl: tuple) -> None:
    with tags(impl):
        s = session(b"k" * 32, _mac.TO_BROKER)
        pads = compiled_api.session_pads(s)
        assert compiled_api.session_pads(s) is pads
        one = s.seal(p.Op.PUBLISH, "A", b"x", 1)
        s.mac_key = b"j" * 32
        s.tx = 0
        assert compiled_api.session_pads(s) is not pads
        two = s.seal(p.Op.PUBLISH, "A", b"x", 1)
    assert one != two
    assert two[-18:-2] == _mac.frame_tag(b"j" * 32, 0, 0, p.Op.PUBLISH, "A", p.Flag.MAC, 1,
                                         b"x")
    if impl is REFERENCE:   # (the reference's state: the key's padded blocks)
        assert pads == _hmac.hmac_pads(b"k" * 32)


answers = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.booleans(),
                             st.one_of(st.integers(-1, 2**40), st.none()), st.booleans()),
                   max_size=12)


def _answered(runs: list) -> tuple[list, list]:
    """The connection's batch and the store's results for ``runs``: (opaque, oneway,
    offset or None for a refusal, duplicate) per publish."""
    from lockmq.store import Appended

    batch_ = [(opaque, oneway, None) for opaque, oneway, _, _ in runs]
    results = [RuntimeError("refused") if off is None else
               Appended(-1 if dup else off, "t", -1 if dup else 0, dup)
               for _, _, off, dup in runs]
    return batch_, results


@given(answers, st.integers(0, 2**32 - 1))
def test_a_run_of_sealed_acks_is_what_sealing_each_ack_gives(runs: list, tx: int) -> None:
    batch_, results = _answered(runs)
    for impl in IMPLS:
        with tags(impl):
            run, each = session(b"s" * 32, _mac.TO_CLIENT), session(b"s" * 32, _mac.TO_CLIENT)
            run.tx = each.tx = tx
            data, frames, stored, dup, i = batch.sealed_publish_acks(run, batch_, results, 0)
            want = []
            for (opaque, oneway, _), a in zip(batch_, results):
                if isinstance(a, Exception):
                    break
                if not oneway:
                    want.append(each.seal(p.Op.PUBLISH_ACK, "", p.PublishAck(
                        int(a.duplicate), max(a.offset, 0)).encode(), opaque, p.Flag.RESPONSE))
        assert data == b"".join(want) and frames == len(want)
        assert i == len(results) if all(not isinstance(a, Exception) for a in results) \
            else isinstance(results[i], Exception)
        assert stored + dup == i and dup == sum(1 for a in results[:i] if a.duplicate)
        assert run.tx == each.tx


# -- the core's own calls, against the reference ------------------------------------

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
    got = batch.take_sealed_publishes(dec, broker, 1024, SPEEDUPS.scan_sealed_publishes,
                                      SPEEDUPS.mac_pads(key))
    taken = len(recs) if not 0 <= spoil < len(recs) else spoil
    assert len(got) == taken and broker.rx == rx + taken
    reference = session(key, _mac.TO_CLIENT)
    reference.rx = rx
    want = []
    with tags(IMPLS[0]):   # (what the reference opens)
        for data in stream[:taken]:
            d = p.FrameDecoder(1 << 20)
            d.feed(data)
            (f,) = list(d.frames())
            reference._open(f)
            want.append((f.opaque, f.flags, "LOCK-9", *batch.publish_fields(f.body)))
        assert got == want
        if taken < len(recs):   # the spoiled frame is next, and the session refuses it
            f = dec.next_frame()
            with pytest.raises(p.SessionError) as err:
                broker._open(f)
            assert err.value.code == p.ErrorCode.BAD_MAC


@compiled
@given(answers, st.integers(0, 2**32 - 1))
def test_compiled_sealed_acks_are_the_reference_ones(runs: list, tx: int) -> None:
    batch_, results = _answered(runs)
    reference = session(b"s" * 32, _mac.TO_CLIENT)
    reference.tx = tx
    with tags(IMPLS[0]):
        want = batch.sealed_publish_acks(reference, batch_, results, 0)
    got = SPEEDUPS.sealed_publish_acks(batch_, results, 0, SPEEDUPS.mac_pads(b"s" * 32), tx)
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
