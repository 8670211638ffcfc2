"""The incremental decoder: sticky and split packets, bad input, bounded memory."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from lockmq import protocol as p

SN = "LK-0001"


def publish(seq: int, payload: bytes = b"x" * 24, opaque: int = 0, sn: str = SN) -> bytes:
    return p.encode_frame(p.Op.PUBLISH, sn, p.Publish("lock.events", seq, 1000 + seq, payload).encode(),
                          opaque)


frames_strategy = st.lists(
    st.tuples(st.sampled_from([p.Op.PUBLISH, p.Op.HEARTBEAT, p.Op.ACK, p.Op.ERROR]),
              st.text(alphabet="ABCDEF0123456789-", max_size=p.MAX_SN),
              st.binary(max_size=300), st.integers(0, 2**32 - 1), st.integers(0, 255)),
    min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(frames_strategy, st.lists(st.integers(1, 97), min_size=1, max_size=50))
def test_any_split_of_a_valid_stream_gives_back_the_same_frames(frames, cuts) -> None:
    stream = b"".join(p.encode_frame(op, sn, body, opaque, flags)
                      for op, sn, body, opaque, flags in frames)
    dec = p.FrameDecoder()
    got, pos, i = [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        dec.feed(stream[pos:pos + step])
        pos += step
        i += 1
        got.extend(dec.frames())
    assert [(f.opcode, f.sn, f.body, f.opaque, f.flags) for f in got] == \
        [(op, sn, body, opaque, flags) for op, sn, body, opaque, flags in frames]
    assert dec.buffered() == 0


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000), st.integers(1, 64))
def test_random_bytes_give_frames_or_a_protocol_error_never_a_crash(data, chunk) -> None:
    dec = p.FrameDecoder(max_frame=1024)
    try:
        for i in range(0, len(data), chunk):
            dec.feed(data[i:i + chunk])
            for _ in dec.frames():
                pass
            assert dec.buffered() <= 1024 + chunk
    except p.ProtocolError as e:
        assert e.code in range(1, 7)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200), st.integers(0, 7), st.integers(1, 40))
def test_a_flipped_bit_is_always_caught(index, bit, seq) -> None:
    frame = bytearray(publish(seq))
    index %= len(frame)
    frame[index] ^= 1 << bit
    dec = p.FrameDecoder()
    dec.feed(bytes(frame))
    with pytest.raises(p.ProtocolError):
        list(dec.frames())
        # A flip in the length field can make the frame look longer: the
        # decoder then waits for more bytes; closing the stream exposes it.
        if dec.buffered():
            raise p.BadFrame("truncated at end of stream")


def test_hostile_length_is_refused_after_five_bytes_without_buffering() -> None:
    dec = p.FrameDecoder(max_frame=4096)
    dec.feed(struct.pack(">BI", 1, 50_000_000))
    with pytest.raises(p.FrameTooLarge) as info:
        dec.next_frame()
    assert info.value.code == p.ErrorCode.FRAME_TOO_LARGE
    assert dec.buffered() == 5


def test_after_a_fatal_error_the_decoder_stays_broken() -> None:
    dec = p.FrameDecoder()
    bad = bytearray(publish(1))
    bad[-1] ^= 0xFF
    dec.feed(bytes(bad))
    with pytest.raises(p.BadChecksum):
        dec.next_frame()
    with pytest.raises(p.BadChecksum):
        dec.feed(publish(2))


def test_frames_before_a_bad_one_are_delivered_first() -> None:
    bad = bytearray(publish(3))
    bad[30] ^= 0x10
    dec = p.FrameDecoder()
    dec.feed(publish(1) + publish(2) + bytes(bad))
    it = dec.frames()
    assert p.Publish.decode(next(it).body).seq == 1
    assert p.Publish.decode(next(it).body).seq == 2
    with pytest.raises(p.BadChecksum):
        next(it)


def test_unknown_opcode_skips_the_frame_and_the_stream_goes_on() -> None:
    dec = p.FrameDecoder()
    dec.feed(p.encode_frame(0x7777, SN, b"from the future") + publish(5))
    with pytest.raises(p.UnknownOpcode) as info:
        dec.next_frame()
    assert not info.value.fatal
    assert p.Publish.decode(dec.next_frame().body).seq == 5


def test_sticky_packets_in_one_read() -> None:
    dec = p.FrameDecoder()
    dec.feed(b"".join(publish(i) for i in range(1000)))
    assert [p.Publish.decode(f.body).seq for f in dec.frames()] == list(range(1000))


def test_encoder_refuses_what_the_format_cannot_carry() -> None:
    with pytest.raises(p.LocalProtocolError):
        p.encode_frame(p.Op.PUBLISH, "S" * (p.MAX_SN + 1), b"")
    with pytest.raises(p.LocalProtocolError):
        p.Publish("t" * 256, 1, 0, b"").encode()
    with pytest.raises(p.LocalProtocolError):
        p.Publish("t", 2**32, 0, b"").encode()
    with pytest.raises(p.LocalProtocolError):
        p.FrameDecoder(max_frame=p.HARD_MAX_FRAME + 1)


def test_error_codes_are_distinct() -> None:
    codes = [v for k, v in vars(p.ErrorCode).items() if not k.startswith("_")]
    assert len(codes) == len(set(codes))


def test_feeding_while_a_frames_iterator_is_suspended_is_safe() -> None:
    dec = p.FrameDecoder()
    first = publish(1)
    dec.feed(first + publish(2)[:10])
    it = dec.frames()
    assert p.Publish.decode(next(it).body).seq == 1
    dec.feed(publish(2)[10:])          # the buffer grows under the suspended iterator
    assert [p.Publish.decode(f.body).seq for f in dec.frames()] == [2]


def test_a_trickling_peer_costs_linear_time_and_bounded_memory() -> None:
    frame = p.encode_frame(p.Op.PUBLISH, SN, p.Publish("t", 1, 0, bytes(30_000)).encode())
    dec = p.FrameDecoder()
    for i in range(len(frame)):
        dec.feed(frame[i:i + 1])
        assert dec.buffered() <= len(frame)
    assert p.Publish.decode(dec.next_frame().body).payload == bytes(30_000)


def test_an_iterator_made_stale_by_feed_stops_instead_of_corrupting_state() -> None:
    dec = p.FrameDecoder()
    dec.feed(publish(1) + publish(2) + publish(3)[:5])
    it = dec.frames()
    next(it)
    dec.feed(publish(3)[5:])
    assert list(it) == []
    assert [p.Publish.decode(f.body).seq for f in dec.frames()] == [2, 3]


def test_a_raised_max_frame_applies_to_the_rest_of_the_same_read() -> None:
    # The broker raises the limit once AUTH succeeds, maybe in the middle of one read
    # it iterates with frames(): the frames after it get the new limit.
    small = p.encode_frame(p.Op.HEARTBEAT, "A", b"")
    big = p.encode_frame(p.Op.PUBLISH, "A", bytes(500))
    dec = p.FrameDecoder(max_frame=100)
    dec.feed(small + big)
    got = []
    for frame in dec.frames():
        got.append(frame)
        dec.max_frame = 1000
    assert [f.opcode for f in got] == [p.Op.HEARTBEAT, p.Op.PUBLISH]
