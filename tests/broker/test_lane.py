"""The compiled lane (``lockmq._core.Lane``, issue #14) on real sockets: what it
takes from a lock's socket, what it gives back to the Python path, and the acks it
sends. The broker's use of it is in ``test_lane_broker.py``."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from lockmq import accel
from lockmq.broker.lane import LANE_TYPE
from lockmq.broker.publish import PublishRefused
from lockmq.protocol import Flag, FrameDecoder, Op, Publish, PublishAck
from lockmq.protocol import batch as py_batch
from lockmq.protocol import ESTABLISHED
from lockmq.protocol._crc import crc16
from lockmq.protocol._frame import encode_frame
from lockmq.protocol._mac import TO_BROKER, TO_CLIENT
from lockmq.protocol._session import _Session
from lockmq.store import Appended, NewRecord

from ..protocol.helpers import FUZZ

pytestmark = pytest.mark.skipif(LANE_TYPE is None, reason="lockmq._core not built")
mac_pads = accel.speedups.mac_pads if accel.COMPILED else None

SN = "lock-7"
TOPIC = "door-events"
MAX_FRAME = 4096


def publish(seq: int, opaque: int, topic: str = TOPIC, sn: str = SN, flags: int = 0,
            payload: bytes = b"p" * 24) -> bytes:
    return encode_frame(Op.PUBLISH, sn, Publish(topic, seq, 1700000000000 + seq,
                                                payload).encode(), opaque, flags)


class Conn:
    """Stands for the broker's Connection: the lane names it and sets its last_seen."""

    last_seen = 0.0


class Pair:
    """A lane with one socket of a socketpair in it; ``peer`` is the lock's end."""

    def __init__(self, credit: int = -1, limit: int = 1 << 20,
                 topics: set[str] | None = None) -> None:
        self.lane = LANE_TYPE(NewRecord, MAX_FRAME)
        self.mine, self.peer = socket.socketpair()
        self.mine.setblocking(False)
        self.conn = Conn()   # (what the lane names in its answers)
        self.topics = {TOPIC} if topics is None else topics
        self.lane.adopt(self.mine.fileno(), self.conn, SN, self.topics, credit, limit)

    def poll(self) -> tuple[list[NewRecord], Any, list, int, int]:
        return self.lane.poll(4096)

    def received(self) -> bytes:
        """Every byte the lane sent to the lock so far."""
        self.peer.setblocking(False)
        data = b""
        try:
            while True:
                data += self.peer.recv(65536)
        except BlockingIOError:
            pass
        return data

    def acks(self) -> list[Any]:
        """Every frame the lane sent to the lock so far."""
        dec = FrameDecoder(MAX_FRAME)
        dec.feed(self.received())
        return list(dec.frames())

    def answered_into_full_buffers(self, frames: list[bytes]) -> tuple[list, bytes]:
        """``frames`` read, and their acks answered into socket buffers too small to
        take them all: (every leftover of the answers, the bytes the lock got)."""
        self.peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        self.peer.sendall(b"".join(frames))
        plans, read = [], 0
        while read < len(frames):
            got, plan, bails, _, _ = self.poll()
            assert bails == []
            read += len(got)
            plans.append((plan, len(got)))
        lefts, k = [], 0
        for plan, m in plans:
            lefts += self.lane.answer(plan, [appended(i) for i in range(k, k + m)])[4]
            k += m
        return lefts, self.received()

    def close(self) -> None:
        self.lane.close()
        self.mine.close()
        self.peer.close()


@pytest.fixture
def pair() -> Any:
    p = Pair()
    yield p
    p.close()


def appended(offset: int, dup: bool = False) -> Appended:
    return Appended(offset, TOPIC, offset, dup)


def test_a_reads_publishes_become_records_and_one_answer_sends_their_acks(pair: Pair) -> None:
    pair.peer.sendall(b"".join(publish(i, 100 + i) for i in range(1, 6)))
    records, plan, bails, nbytes, frames = pair.poll()
    assert bails == [] and frames == 5 and len(plan) == 5
    assert pair.conn.last_seen > 0   # (the broker's idle check reads it)
    assert nbytes == sum(len(publish(i, 100 + i)) for i in range(1, 6))
    assert [(r.topic, r.sn, r.seq, r.lock_ts_ms, r.payload, r.headers) for r in records] == \
        [(TOPIC, SN, i, 1700000000000 + i, b"p" * 24, None) for i in range(1, 6)]
    stored, dup, fr, nb, left = pair.lane.answer(
        plan, [appended(10), appended(11), appended(12, dup=True), appended(13), appended(14)])
    assert (stored, dup, fr, nb, left) == (4, 1, 5, 5 * 24, [])
    acks = pair.acks()
    assert [(f.opcode, f.opaque, f.flags) for f in acks] == \
        [(Op.PUBLISH_ACK, 100 + i, Flag.RESPONSE) for i in range(1, 6)]
    bodies = [PublishAck.decode(f.body) for f in acks]
    assert [(b.status, b.offset) for b in bodies] == [
        (PublishAck.STORED, 10), (PublishAck.STORED, 11), (PublishAck.DUPLICATE, 12),
        (PublishAck.STORED, 13), (PublishAck.STORED, 14)]


def test_a_frame_split_anywhere_is_held_until_it_is_whole(pair: Pair) -> None:
    data = b"".join(publish(i, i) for i in range(1, 4))
    got: list[NewRecord] = []
    for cut in range(0, len(data), 7):   # every piece ends mid-frame somewhere
        pair.peer.sendall(data[cut:cut + 7])
        records, plan, bails, _, _ = pair.poll()
        assert bails == []
        got += records
    assert [r.seq for r in got] == [1, 2, 3]
    assert pair.lane.adopted() == 1


@pytest.mark.parametrize("why, frame", [
    ("another opcode", encode_frame(Op.HEARTBEAT, SN, b"", 9)),
    ("oneway", publish(9, 9, flags=Flag.ONEWAY)),
    ("frame MAC", publish(9, 9, flags=Flag.MAC)),
    ("another producer id", publish(9, 9, sn="lock-8")),
    ("a topic not allowed yet", publish(9, 9, topic="other-topic")),
    ("a bad CRC", publish(9, 9)[:-1] + bytes([publish(9, 9)[-1] ^ 1])),
    ("a bad version", b"\x09" + publish(9, 9)[1:]),
    ("longer than max_frame", publish(9, 9, payload=b"x" * MAX_FRAME)),
    ("a truncated body", encode_frame(Op.PUBLISH, SN, b"\x05door", 9)),
])
def test_what_the_lane_does_not_take_goes_back_to_python_unread(pair: Pair, why: str,
                                                                 frame: bytes) -> None:
    before = publish(1, 1) + publish(2, 2)
    after = publish(3, 3)
    pair.peer.sendall(before + frame + after)
    records, plan, bails, nbytes, frames = pair.poll()
    assert [r.seq for r in records] == [1, 2], why
    assert bails == [(pair.conn, frame + after, -1, 0, 0)], why
    assert nbytes == len(before) and frames == 2
    assert pair.lane.adopted() == 0
    assert pair.lane.release(pair.mine.fileno()) is None   # (gone already)
    # the records read before it are still answered, on the socket Python now has
    stored, _, _, nb, left = pair.lane.answer(plan, [appended(1), appended(2)])
    assert stored == 2 and nb == 0
    assert [(k, c, len(a), n) for k, c, a, n in left] == [(2, pair.conn, 48, 2)]


def test_eof_gives_the_socket_back_with_the_partial_frame_it_held(pair: Pair) -> None:
    frame = publish(1, 1)
    pair.peer.sendall(frame[:10])
    assert pair.poll()[2] == []
    pair.peer.shutdown(socket.SHUT_WR)
    records, _, bails, _, _ = pair.poll()
    assert records == [] and bails == [(pair.conn, frame[:10], -1, 0, 0)]


def test_release_hands_back_the_partial_frame_and_the_credit_left() -> None:
    p = Pair(credit=5)
    try:
        p.peer.sendall(publish(1, 1) + publish(2, 2)[:9])
        records, _, bails, _, _ = p.poll()
        assert len(records) == 1 and bails == []
        assert p.lane.release(p.mine.fileno()) == (p.conn, publish(2, 2)[:9], 4, 0, 0)
        assert p.lane.adopted() == 0
    finally:
        p.close()


def test_the_rate_credit_used_up_gives_the_rest_back() -> None:
    p = Pair(credit=2)
    try:
        p.peer.sendall(b"".join(publish(i, i) for i in range(1, 5)))
        records, _, bails, _, _ = p.poll()
        assert [r.seq for r in records] == [1, 2]
        assert bails == [(p.conn, publish(3, 3) + publish(4, 4), 0, 0, 0)]
    finally:
        p.close()


def test_a_topic_python_allows_later_is_taken_from_then_on(pair: Pair) -> None:
    pair.peer.sendall(publish(1, 1, topic="new-topic"))
    assert pair.poll()[2] != []   # not allowed: back to Python, which allows it
    pair.topics.add("new-topic")
    pair.lane.adopt(pair.mine.fileno(), pair.conn, SN, pair.topics, -1, 1 << 20)
    pair.peer.sendall(publish(2, 2, topic="new-topic"))
    records, _, bails, _, _ = pair.poll()
    assert [r.topic for r in records] == ["new-topic"] and bails == []


def test_reading_stops_above_the_limit_until_answers_bring_it_down() -> None:
    p = Pair(limit=200)   # a record costs its payload + 64: 88 bytes here
    try:
        p.peer.sendall(b"".join(publish(i, i) for i in range(1, 4)))
        records, plan, _, _, _ = p.poll()
        assert len(records) == 3   # one read: all of it, then no more reads
        p.peer.sendall(publish(4, 4))
        assert p.poll()[0] == []
        p.lane.answer(plan, [appended(1), appended(2), appended(3)])
        records, _, _, _, _ = p.poll()
        assert [r.seq for r in records] == [4]
    finally:
        p.close()


def test_a_refusal_in_an_answer_is_left_to_python_with_its_group() -> None:
    p = Pair()
    try:
        p.peer.sendall(publish(1, 11) + publish(2, 12))
        records, plan, _, _, _ = p.poll()
        busy = PublishRefused(7, "busy", 50)
        stored, dup, fr, nb, left = p.lane.answer(plan, [appended(1), busy])
        assert (stored, dup, fr, nb) == (0, 0, 0, 0)
        assert left == [(1, p.conn, [(11, False, None), (12, False, None)], [appended(1), busy])]
        assert p.acks() == []
    finally:
        p.close()


def test_acks_the_socket_does_not_take_whole_are_given_back_with_the_socket() -> None:
    p = Pair()
    try:
        n = 2000   # 48 KB of acks: more than the two buffers hold
        lefts, sent = p.answered_into_full_buffers([publish(i, i) for i in range(1, n + 1)])
        assert lefts and lefts[0][0] == 3 and lefts[0][1] is p.conn
        assert p.lane.adopted() == 0   # the socket is Python's again
        unsent = b"".join(x[2] for x in lefts)
        assert len(sent) + len(unsent) == n * 24
        dec = FrameDecoder(MAX_FRAME)
        dec.feed(sent + unsent)
        assert [f.opaque for f in dec.frames()] == list(range(1, n + 1))
    finally:
        p.close()


def test_a_socket_released_and_its_fd_reused_gets_no_old_answer(pair: Pair) -> None:
    pair.peer.sendall(publish(1, 1))
    records, plan, _, _, _ = pair.poll()
    pair.lane.release(pair.mine.fileno())
    pair.lane.adopt(pair.mine.fileno(), pair.conn, SN, pair.topics, -1, 1 << 20)
    _, _, _, nb, left = pair.lane.answer(plan, [appended(1)])
    assert nb == 0 and [x[0] for x in left] == [2]   # Python writes it, not the new slot
    assert pair.acks() == []


def test_bad_arguments_are_refused(pair: Pair) -> None:
    with pytest.raises(ValueError):
        pair.lane.adopt(pair.mine.fileno(), pair.conn, SN, pair.topics, -1, 1 << 20)
    with pytest.raises(ValueError):
        pair.lane.adopt(-1, pair.conn, SN, pair.topics, -1, 1 << 20)
    with pytest.raises(ValueError):
        pair.lane.adopt(5, pair.conn, "x" * 65, pair.topics, -1, 1 << 20)
    with pytest.raises(TypeError):
        LANE_TYPE(dict, MAX_FRAME)
    pair.peer.sendall(publish(1, 1))
    _, plan, _, _, _ = pair.poll()
    with pytest.raises(ValueError):
        pair.lane.answer(plan, [])


# -- against the scanner the Python path uses -----------------------------------------

_ALLOWED = {TOPIC, "t"}
_frame = st.one_of(
    st.builds(lambda seq, op, pl, sn, fl, tp: publish(seq, op, tp, sn, fl, pl),
              st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.binary(max_size=80),
              st.sampled_from([SN, "", "LK-0002", "é"]), st.sampled_from([0, 0, 0, 1, 2, 4]),
              st.sampled_from([TOPIC, TOPIC, "t", "ü.x", "a" * 200])),
    st.builds(lambda op, body: encode_frame(op, SN, body, 1),
              st.sampled_from([Op.PUBLISH, Op.HEARTBEAT, 0x7777]), st.binary(max_size=40)),
    st.binary(max_size=30))


def _damage(at_most: int) -> st.SearchStrategy:
    """Bytes overwritten in the stream: (position, new byte) pairs."""
    return st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=at_most)


#: the sizes of the pieces the stream is sent in
_cuts = st.lists(st.integers(1, 90), min_size=1, max_size=8)


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.lists(_frame, max_size=10), _damage(3), _cuts)
def test_the_lane_takes_what_the_python_paths_scanner_takes(
        frames: list[bytes], damage: list[tuple[int, int]], cuts: list[int]) -> None:
    """Random, damaged frames sent in random pieces: the lane's records are the pure
    scanner's PUBLISH tuples up to the first it must not take (ONEWAY, a topic not
    allowed), and the bytes it gives back are exactly the rest of the stream."""
    buf = bytearray(b"".join(frames))
    for at, byte in damage:
        if buf:
            buf[at % len(buf)] = byte
    data = bytes(buf)
    tuples, stop = py_batch.scan_publishes(data, 0, MAX_FRAME, SN, len(data) + 1)
    for k, (opaque, flags, sn, topic, *_rest) in enumerate(tuples):
        if flags & Flag.ONEWAY or topic not in _ALLOWED:
            stop = _frame_start(data, k)
            tuples = tuples[:k]
            break
    p = Pair(topics=set(_ALLOWED))
    try:
        records: list[NewRecord] = []
        rest = b""
        pieces, at = [], 0
        for c in cuts * (len(data) // max(1, sum(cuts)) + 1):
            if at >= len(data):
                break
            pieces.append(data[at:at + c])
            at += c
        for piece in pieces:
            if p.lane.adopted():
                p.peer.sendall(piece)
                got, _, bails, _, _ = p.poll()
                records += got
                rest += b"".join(b[1] for b in bails)
            else:
                rest += piece
        if p.lane.adopted():
            rest += p.lane.release(p.mine.fileno())[1]
        assert [(r.sn, r.topic, r.seq, r.lock_ts_ms, r.payload) for r in records] == \
            [(sn, topic, seq, ts, payload) for _, _, sn, topic, seq, ts, payload in tuples]
        assert rest == data[stop:]
    finally:
        p.close()


def _frame_start(data: bytes, k: int) -> int:
    """Where the k-th whole frame of ``data`` starts (its frames read from the start)."""
    pos = 0
    for _ in range(k):
        pos += int.from_bytes(data[pos + 1:pos + 5], "big")
    return pos


# -- a session with frame MACs --------------------------------------------------------

KEY = bytes(range(32))


class SealedPair(Pair):
    """A Pair whose lock seals its frames: the lane holds the session key's pads and
    its counters, from rx=7 / tx=3 (frames opened and sealed before it joined);
    ``lock`` is the lock's session, which seals its publishes and opens the acks."""

    def __init__(self) -> None:
        self.lane = LANE_TYPE(NewRecord, MAX_FRAME)
        self.mine, self.peer = socket.socketpair()
        self.mine.setblocking(False)
        self.conn = Conn()
        self.topics = {TOPIC}
        self.lock = _Session()
        self.lock._OUT = TO_BROKER
        self.lock.mac_key = KEY
        self.lock.state = ESTABLISHED
        self.lock.tx, self.lock.rx = 7, 3
        self.lane.adopt(self.mine.fileno(), self.conn, SN, self.topics, -1, 1 << 20,
                        mac_pads(KEY), 7, 3)

    def sealed(self, seq: int, opaque: int, op: int = Op.PUBLISH) -> bytes:
        body = Publish(TOPIC, seq, 1700000000000 + seq, b"p" * 24).encode() \
            if op == Op.PUBLISH else b""
        return self.lock.seal(op, SN, body, opaque)

    def opened(self, frames: list[Any]) -> list[Any]:
        for f in frames:   # (in order: each tag carries the broker's next counter)
            self.lock._open(f)
        return frames


@pytest.fixture
def sealed() -> Any:
    p = SealedPair()
    yield p
    p.close()


def test_sealed_publishes_are_checked_and_their_acks_sealed_with_the_sessions_counters(
        sealed: SealedPair) -> None:
    sealed.peer.sendall(b"".join(sealed.sealed(i, 100 + i) for i in range(1, 4)))
    records, plan, bails, _, frames = sealed.poll()
    assert bails == [] and frames == 3
    assert [(r.seq, r.payload) for r in records] == [(i, b"p" * 24) for i in range(1, 4)]
    stored, dup, fr, nb, left = sealed.lane.answer(plan, [appended(1), appended(2, True),
                                                         appended(3)])
    assert (stored, dup, fr, nb, left) == (2, 1, 3, 3 * 40, [])
    acks = sealed.opened(sealed.acks())
    assert [(f.opaque, PublishAck.decode(f.body).status) for f in acks] == [
        (101, PublishAck.STORED), (102, PublishAck.DUPLICATE), (103, PublishAck.STORED)]
    # the counters go back with the socket: 3 frames opened, 3 acks sealed since
    assert sealed.lane.release(sealed.mine.fileno()) == (sealed.conn, b"", -1, 10, 6)


def test_a_bad_tag_stops_the_lane_and_goes_back_with_the_counters_before_it(
        sealed: SealedPair) -> None:
    good = sealed.sealed(1, 1)
    bad = bytearray(sealed.sealed(2, 2))
    bad[-5] ^= 1   # inside the tag
    bad[-2:] = crc16(bytes(bad[:-2])).to_bytes(2, "big")
    after = sealed.sealed(3, 3)
    plain = publish(4, 4)   # (a session with MACs takes no unsealed frame either)
    sealed.peer.sendall(good + bytes(bad) + after)
    records, _, bails, _, _ = sealed.poll()
    assert [r.seq for r in records] == [1]
    assert bails == [(sealed.conn, bytes(bad) + after, -1, 8, 3)]
    p = SealedPair()
    try:
        p.peer.sendall(plain)
        assert p.poll()[2] == [(p.conn, plain, -1, 7, 3)]
    finally:
        p.close()


def test_sealed_acks_for_a_socket_that_left_are_pythons_to_seal(sealed: SealedPair) -> None:
    sealed.peer.sendall(sealed.sealed(1, 11))
    _, plan, _, _, _ = sealed.poll()
    assert sealed.lane.release(sealed.mine.fileno())[3:] == (8, 3)
    # (the session's counters are Python's now: an ack sealed here would take them)
    left = sealed.lane.answer(plan, [appended(1)])
    assert left == (0, 0, 0, 0, [(1, sealed.conn, [(11, False, None)], [appended(1)])])
    assert sealed.acks() == []


def test_sealed_acks_the_socket_does_not_take_whole_go_back_with_the_counters() -> None:
    p = SealedPair()
    try:
        n = 1500   # 60 KB of sealed acks: more than the two buffers hold
        lefts, sent = p.answered_into_full_buffers([p.sealed(i, i) for i in range(1, n + 1)])
        (kind, conn, unsent, held, credit, rx, tx), *later = lefts
        assert (kind, conn, held, credit, rx) == (3, p.conn, b"", -1, 7 + n)
        assert tx == 3 + (len(sent) + len(unsent)) // 40   # (one counter per sealed ack)
        # the later answers are Python's, sealed with the counters it got back
        broker = _Session()
        broker._OUT, broker.mac_key, broker.state, broker.tx = TO_CLIENT, KEY, ESTABLISHED, tx
        rest = b""
        for k_, c_, batch, results in later:
            assert (k_, c_) == (1, p.conn)
            rest += py_batch.sealed_publish_acks(broker, batch, results, 0)[0]
        dec = FrameDecoder(MAX_FRAME)
        dec.feed(sent + unsent + rest)
        assert [f.opaque for f in p.opened(list(dec.frames()))] == list(range(1, n + 1))
    finally:
        p.close()


_sealed_publish = st.tuples(st.just("sealed"), st.integers(0, 2**32 - 1),
                            st.binary(max_size=60), st.sampled_from([0] * 6 + [Flag.ONEWAY]),
                            st.sampled_from([TOPIC] * 5 + ["t", "not-allowed"]))
# (mostly sealed publishes the lane takes, so that runs of them are common)
_sealed_item = st.one_of(_sealed_publish, _sealed_publish, _sealed_publish,
                         st.tuples(st.just("raw"), _frame))


@settings(max_examples=200 * FUZZ, deadline=None)
@given(st.lists(_sealed_item, max_size=10), _damage(2), _cuts)
def test_a_sealed_slot_takes_what_the_sealed_scanner_takes(
        items: list[tuple], damage: list[tuple[int, int]], cuts: list[int]) -> None:
    """Sealed frames (and plain or junk ones among them), damaged and sent in random
    pieces: the lane takes the compiled sealed scan's PUBLISH tuples up to the first
    it must not take, gives back exactly the rest of the stream, and hands back the
    receive counter advanced by what it took."""
    p = SealedPair()
    try:
        frames = []
        for item in items:
            if item[0] == "sealed":
                _, seq, payload, flags, topic = item
                body = Publish(topic, seq, 1700000000000, payload).encode()
                frames.append(p.lock.seal(Op.PUBLISH, SN, body, seq, flags))
            else:
                frames.append(item[1])
        buf = bytearray(b"".join(frames))
        for at, byte in damage:
            if buf:
                buf[at % len(buf)] = byte
        data = bytes(buf)
        tuples, stop, _ = accel.speedups.scan_sealed_publishes(
            data, 0, MAX_FRAME, SN, len(data) + 1, mac_pads(KEY), 7)
        for k, (_opaque, flags, _sn, topic, *_rest) in enumerate(tuples):
            if flags & Flag.ONEWAY or topic not in p.topics:
                stop = _frame_start(data, k)
                tuples = tuples[:k]
                break
        records: list[NewRecord] = []
        rest = b""
        back: tuple = ()
        at = 0
        for c in cuts * (len(data) // max(1, sum(cuts)) + 1):
            if at >= len(data):
                break
            piece, at = data[at:at + c], at + c
            if back:
                rest += piece
                continue
            p.peer.sendall(piece)
            got, _, bails, _, _ = p.poll()
            records += got
            if bails:
                [back] = bails
                rest += back[1]
        if not back:
            back = p.lane.release(p.mine.fileno())
            rest += back[1]
        assert [(r.topic, r.seq, r.payload) for r in records] == \
            [(topic, seq, payload) for _, _, _, topic, seq, _, payload in tuples]
        assert rest == data[stop:]
        assert back[3:] == (7 + len(tuples), 3)   # rx: one per frame taken; tx untouched
    finally:
        p.close()
