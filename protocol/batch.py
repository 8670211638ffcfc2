# The protocol's batch API: the broker's, the consumer side's and the load generator's
# per-batch functions in pure Python, with precompiled structs and cached SN/topic
# bytes. Each is the reference of a function of the compiled core (lockmq._core:
# scan_publishes, scan_sealed_publishes, scan_frame, publish_acks,
# sealed_publish_acks, queue_run, the MESSAGES writer) and the path a process without
# the core runs; tests hold the two equal (tests/protocol/test_accel*.py,
# test_frame_macs.py). Nothing here changes the protocol's classes. Public: host code
# imports these names (never a private protocol module). CPython only
# (struct.Struct): the lock never runs the broker's batch paths, and MicroPython never
# imports this module.
import json
import struct

from ._constants import VERSION, MIN_FRAME, Op, Flag
from . import _crc
from ._errors import BadBody, LocalProtocolError, ProtocolError
from ._frame import Frame, FrameDecoder
# the consumer side's name cache (an SN or topic decoded once; the core's
# messages_fields fills the same dict) and its bound
from ._consume import TEXT_CACHE_MAX, _texts as TEXTS

_MSG = struct.Struct(">QHIQQ")      # queue_offset, delivery, seq, lock_ts_ms, broker_ts_us
_HEAD = struct.Struct(">IH")        # sub_id, count
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_NO_HEADERS = b"\x00\x00"
_PUB = struct.Struct(">IQ")         # PUBLISH: seq, lock_ts_ms (after the topic)
# A whole PUBLISH_ACK frame from the broker (empty SN, RESPONSE flag) but its CRC:
# version, length, opcode, sn_len, flags, opaque | status, offset
_ACK_FRAME = struct.Struct(">BIHBBIBQ")
_ACK_FRAME_LEN = MIN_FRAME + 9
_ACK_BODY = struct.Struct(">BQ")    # a PUBLISH_ACK's body: status, offset
_topics = {}
_CACHE_MAX = 100000
_str8 = {}

#: (sn, topic, payload length) -> (pack, middle bytes): see message_shape()
SHAPES = {}
_structs = {}


def str8(s):
    """u8 length + UTF-8 of ``s``, cached (a broker sends few distinct SNs/topics)."""
    b = _str8.get(s)
    if b is None:
        raw = s.encode()
        if len(raw) > 255:
            raise LocalProtocolError("%r... is longer than 255 bytes" % s[:20])
        b = bytes((len(raw),)) + raw
        if len(_str8) >= _CACHE_MAX:
            _str8.clear()
        _str8[s] = b
    return b


def _new_text(cache, raw, cap, what):
    """Decode ``raw`` and remember it in ``cache`` (emptied at ``cap`` entries): the
    miss path of the name caches; ``what`` names the field in the BadBody."""
    try:
        text = bytes(raw).decode()
    except UnicodeError:
        raise BadBody("%s is not UTF-8" % what) from None
    if len(cache) >= cap:
        cache.clear()
    cache[bytes(raw)] = text
    return text


def publish_fields(body):
    """``(topic, seq, lock_ts_ms, payload)`` of a PUBLISH body: the fields of
    ``Publish.decode`` without building the object (the broker's hot path). Topic
    names are cached (a broker hears few distinct ones)."""
    n = body[0] if body else 0
    if len(body) < 13 + n:
        raise BadBody("PUBLISH body truncated")
    tb = body[1:1 + n]
    topic = _topics.get(tb)
    if topic is None:
        topic = _new_text(_topics, tb, 4096, "PUBLISH topic")
    seq, lock_ts_ms = _PUB.unpack_from(body, 1 + n)
    return topic, seq, lock_ts_ms, bytes(body[13 + n:])


def publish_ack_frame(status, offset, opaque):
    """The broker's PUBLISH_ACK frame for request ``opaque``, in one pack: the same
    bytes as ``encode_frame(Op.PUBLISH_ACK, "", PublishAck(status, offset).encode(),
    opaque, Flag.RESPONSE)`` (a frame without MAC)."""
    data = _ACK_FRAME.pack(VERSION, _ACK_FRAME_LEN, Op.PUBLISH_ACK, 0, Flag.RESPONSE,
                           opaque, status, offset)
    return data + _U16.pack(_crc.crc16_init(data, 0xFFFF))


def publish_acks(batch, results, start):
    """The PUBLISH_ACK frames answering ``results[start:]`` (the store's ``Appended``
    per publish of ``batch``, a list of ``(opaque, oneway, record)``), up to the
    first result that is not one (an exception: the caller answers it):
    ``(bytes, frames, stored, duplicates, next index)``. ONEWAY publishes are counted
    but not answered. The reference of ``lockmq._core.publish_acks``."""
    return ack_run(batch, results, start, publish_ack_frame)


def ack_run(batch, results, start, ack_frame):
    """:func:`publish_acks` with each ack made by ``ack_frame(status, offset, opaque)``
    (a sealed session's makes them with frame MACs: :func:`sealed_publish_acks`)."""
    acks = []
    stored = dup = 0
    n = min(len(batch), len(results))
    i = start
    while i < n:
        a = results[i]
        if not isinstance(a, tuple):
            break
        opaque, oneway, _rec = batch[i]
        i += 1
        if a[3]:
            dup += 1
        else:
            stored += 1
        if not oneway:
            acks.append(ack_frame(1 if a[3] else 0, a[0] if a[0] > 0 else 0, opaque))
    return b"".join(acks), len(acks), stored, dup, i


def sealed_publish_acks(sess, batch, results, start):
    """:func:`publish_acks` for a session with frame MACs: each ack sealed as
    ``sess.seal(Op.PUBLISH_ACK, "", PublishAck(status, offset).encode(), opaque,
    Flag.RESPONSE)`` seals it (the session's counter advanced once per ack). The
    reference of ``lockmq._core.sealed_publish_acks``."""
    def sealed_ack(status, offset, opaque):
        return sess.seal(Op.PUBLISH_ACK, "", _ACK_BODY.pack(status, offset), opaque,
                         Flag.RESPONSE)

    return ack_run(batch, results, start, sealed_ack)


def queue_run(pubs, start, limit, record_type, queue, records):
    """Queue the run of :func:`scan_publishes` tuples from ``pubs[start]`` on that go
    to its topic and want an answer (no ONEWAY flag), at most ``limit`` long, as the
    broker's ``Connection._publish`` queues a record: ``record_type(topic, sn, seq,
    lock_ts_ms, payload)`` appended to ``records`` and ``(opaque, False, record)`` to
    ``queue``. Returns ``(stop, size)``: where the run ended (``start`` when
    ``pubs[start]`` is ONEWAY) and the records' buffer cost (payload length + 64
    each). The reference of ``lockmq._core.queue_run``."""
    if start < 0 or start > len(pubs):
        raise ValueError("start out of range")
    i = start
    size = 0
    topic = None
    n_queue = len(queue)
    n_records = len(records)
    try:
        while i < len(pubs) and i - start < limit:
            opaque, flags, sn, t, seq, lock_ts_ms, payload = pubs[i]
            if flags & Flag.ONEWAY or (topic is not None and t != topic):
                break
            topic = t
            rec = record_type(t, sn, seq, lock_ts_ms, payload)
            records.append(rec)
            queue.append((opaque, False, rec))
            size += len(payload) + 64
            i += 1
    except BaseException:   # nothing of a failed call stays queued (as in the core)
        del queue[n_queue:]
        del records[n_records:]
        raise
    return i, size


def scan_publishes(buf, pos, max_frame, sn, limit):
    """The leading run of whole, valid PUBLISH frames in ``buf[pos:]`` (at most
    ``limit``) as ``(opaque, flags, sn, topic, seq, lock_ts_ms, payload)`` tuples, and
    the position after them: ``(list, pos)``. It stops before anything else -- a
    partial or bad frame, another opcode, a frame MAC, an SN other than ``sn`` or
    empty, a bad PUBLISH body -- which the caller's decoder then handles (and raises
    about). The pure-Python reference of ``lockmq._core.scan_publishes``: the
    decoder and :func:`publish_fields`, one frame at a time."""
    dec = FrameDecoder(max_frame)
    dec.feed(bytes(buf[pos:]))
    total = dec.buffered()
    out = []
    done = 0
    while len(out) < limit:
        try:
            frame = dec.next_frame()
            if frame is None or frame.opcode != Op.PUBLISH or frame.flags & Flag.MAC \
                    or frame.sn not in ("", sn):
                break
            topic, seq, lock_ts_ms, payload = publish_fields(frame.body)
        except ProtocolError:
            break
        out.append((frame.opaque, frame.flags, sn, topic, seq, lock_ts_ms, payload))
        done = total - dec.buffered()
    return out, pos + done


def take_publishes(decoder, sn, limit, scan):
    """Run ``scan`` (:func:`scan_publishes` or its compiled twin) over what ``decoder`` holds
    and consume the PUBLISH frames it took; returns their tuples. The broker's
    compiled read path: one call for a read's publishes instead of a frame object,
    a generator step and a body decode each."""
    if decoder._error is not None:
        return []
    pubs, pos = scan(decoder._buf, decoder._pos, decoder.max_frame, sn, limit)
    decoder._pos = pos
    return pubs


def take_sealed_publishes(decoder, sess, limit, scan, pads):
    """:func:`take_publishes` for a session with frame MACs: ``scan`` is
    ``lockmq._core.scan_sealed_publishes`` (the tags checked in the core from
    ``pads``, the session's :func:`~lockmq.protocol.session_pads`), and the session counts the frames it took as
    opened (``rx``). What it stops at -- another request, a bad tag, a partial frame --
    is left to the session's own path, which refuses a bad tag with BAD_MAC."""
    if decoder._error is not None:
        return []
    pubs, decoder._pos, _rx = scan(decoder._buf, decoder._pos, decoder.max_frame,
                                   sess.name, limit, pads, sess.rx)
    sess.rx += len(pubs)   # (the session's count, as its own path keeps it: not mod 2**32)
    return pubs


def feed_publishes(decoder, data, sn, limit, scan):
    """``decoder.feed(data)`` and :func:`take_publishes` in one call, for a decoder
    that holds nothing (a lock's steady state: every read is whole frames): ``scan``
    runs straight over ``data``, which the decoder then holds from where the scan
    stopped. Returns the scanner's ``(publishes, pos)`` (``pos == len(data)``: the
    read was all publishes), or None, having done nothing, when the decoder holds
    bytes or has failed: the caller feeds it as usual."""
    if decoder._error is not None or decoder._pos < len(decoder._buf):
        return None
    if not isinstance(data, bytes):
        data = bytes(data)
    got = scan(data, 0, decoder.max_frame, sn, limit)
    decoder._buf = data
    decoder._pos = got[1]
    return got


def scan_frame(buf, pos, max_frame, known):
    """``(opcode, sn, flags, opaque, body, end)`` of the whole, valid frame at
    ``buf[pos:]`` whose opcode is in ``known``, or None for anything else (too few
    bytes, a bad header, length, CRC or SN, an unknown opcode): the caller's decoder
    then reads it and raises the protocol's own error. The pure-Python reference of
    ``lockmq._core.scan_frame``: the decoder, for one frame."""
    dec = FrameDecoder(max_frame, known)
    dec.feed(bytes(buf[pos:]))
    total = dec.buffered()
    try:
        frame = dec.next_frame()
    except ProtocolError:
        return None
    if frame is None:
        return None
    return (frame.opcode, frame.sn, frame.flags, frame.opaque, frame.body,
            pos + total - dec.buffered())


def take_frame(decoder, scan):
    """The next frame of ``decoder`` read by ``scan`` (:func:`scan_frame` or its C
    twin) and consumed, or None (nothing whole, or something the decoder itself must
    read and raise about). The broker's compiled read of a handshake frame: one call
    instead of a generator step of :meth:`FrameDecoder.frames`."""
    if decoder._error is not None:
        return None
    got = scan(decoder._buf, decoder._pos, decoder.max_frame, decoder._known)
    if got is None:
        return None
    decoder._pos = got[5]
    return Frame(got[0], got[1], got[2], got[3], got[4])


def messages_head(sub_id, count):
    """The first 6 bytes of a MESSAGES body."""
    return _HEAD.pack(sub_id, count)


def message_shape(sn, topic, plen):
    """``(pack, middle)`` for a message without headers from ``sn`` on ``topic`` with a
    ``plen``-byte payload: ``pack(queue_offset, delivery, seq, lock_ts_ms,
    broker_ts_us, middle, payload)`` is the whole message in one call. Cached in
    :data:`SHAPES` (a lock sends many records of one shape): a hot loop looks there
    first and calls this only on a miss."""
    key = (sn, topic, plen)
    got = SHAPES.get(key)
    if got is None:
        mid = str8(sn) + str8(topic) + _NO_HEADERS + _U32.pack(plen)
        st = _structs.get((len(mid), plen))
        if st is None:
            st = _structs[(len(mid), plen)] = struct.Struct(">QHIQQ%ds%ds" % (len(mid), plen))
        if len(SHAPES) >= _CACHE_MAX:
            SHAPES.clear()
        got = SHAPES[key] = (st.pack, mid)
    return got


def encode_message(queue_offset, delivery, sn, seq, lock_ts_ms, broker_ts_us, topic,
                   payload, headers=b""):
    """One message of a MESSAGES body (``headers``: JSON bytes, or empty)."""
    if not headers:
        pack, mid = SHAPES.get((sn, topic, len(payload))) or message_shape(sn, topic,
                                                                         len(payload))
        return pack(queue_offset, delivery, seq, lock_ts_ms, broker_ts_us, mid, payload)
    if len(headers) > 0xFFFF:
        raise LocalProtocolError("headers are %d bytes, at most 65535" % len(headers))
    return b"".join((_MSG.pack(queue_offset, delivery, seq, lock_ts_ms, broker_ts_us),
                     str8(sn), str8(topic), _U16.pack(len(headers)), headers,
                     _U32.pack(len(payload)), payload))


def json_headers(headers):
    """Record headers (a dict) as the compact JSON a MESSAGES body carries."""
    return json.dumps(headers, separators=(",", ":")).encode()
