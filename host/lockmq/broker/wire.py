"""Hot-path codecs of the consumer side: MESSAGES out, ACK/NACK leases in.

Byte-for-byte the layouts of ``lockmq.protocol`` (``Messages``, ``Ack``, ``Nack``;
see protocol/SPEC.md), written with precompiled structs and cached SN/topic bytes
because the broker encodes every delivered message and decodes every lease. The
tests check them against the protocol's own codec.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Iterable

from lockmq.protocol import BadBody

_MSG = struct.Struct(">QHIQQ")      # queue_offset, delivery, seq, lock_ts_ms, broker_ts_us
_HEAD = struct.Struct(">IH")        # sub_id, count
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_LEASE = struct.Struct(">QH")
_NACK = struct.Struct(">II")        # sub_id, delay_ms
_NO_HEADERS = b"\x00\x00"
_CACHE_MAX = 100_000
_str8: dict[str, bytes] = {}


def _s8(s: str) -> bytes:
    b = _str8.get(s)
    if b is None:
        raw = s.encode()
        if len(raw) > 255:
            raise ValueError(f"{s[:20]!r}... is longer than 255 bytes")
        b = bytes((len(raw),)) + raw
        if len(_str8) >= _CACHE_MAX:
            _str8.clear()
        _str8[s] = b
    return b


def encode_messages(sub_id: int, items: Iterable[tuple[int, int, str, int, int, int, str,
                                                        bytes, bytes]]) -> bytes:
    """MESSAGES body from ``(queue_offset, delivery, sn, seq, lock_ts_ms, broker_ts_us,
    topic, payload, headers)`` tuples."""
    parts = [b""]
    n = 0
    pack = _MSG.pack
    u32 = _U32.pack
    append = parts.append
    for qo, dlv, sn, seq, lts, bts, topic, payload, hdr in items:
        append(pack(qo, dlv, seq, lts, bts))
        append(_s8(sn))
        append(_s8(topic))
        if hdr:
            append(_U16.pack(len(hdr)))
            append(hdr)
        else:
            append(_NO_HEADERS)
        append(u32(len(payload)))
        append(payload)
        n += 1
    parts[0] = _HEAD.pack(sub_id, n)
    return b"".join(parts)


#: (sn, topic, payload length) -> (pack, middle) for the delivery hot path: one
#: precompiled struct per message shape packs the fixed fields, the cached SN/topic/
#: empty-headers bytes and the payload in one call (see :func:`encode_leased`).
_shapes: dict[tuple[str, str, int], tuple[Any, bytes]] = {}
_structs: dict[tuple[int, int], Any] = {}


def _shape(sn: str, topic: str, plen: int) -> tuple[Any, bytes]:
    """The packer and the middle bytes (SN, topic, no headers, payload length) of a
    message without headers; cached, as a lock sends many records of one shape."""
    key = (sn, topic, plen)
    got = _shapes.get(key)
    if got is None:
        mid = _s8(sn) + _s8(topic) + _NO_HEADERS + _U32.pack(plen)
        st = _structs.get((len(mid), plen))
        if st is None:
            st = _structs[(len(mid), plen)] = struct.Struct(f">QHIQQ{len(mid)}s{plen}s")
        if len(_shapes) >= _CACHE_MAX:
            _shapes.clear()
        got = _shapes[key] = (st.pack, mid)
    return got


def encode_leased(sub_id: int, leases: list[Any]) -> bytes:
    """MESSAGES body straight from cluster leases (``lockmq.broker.clusters.Lease``):
    the broker's delivery hot path. A retried message gets ``{"retries": n}`` added to
    its headers.

    A message without headers (the common case) costs one cache lookup and one
    ``pack`` (see :func:`_shape`); the parts are joined once for the whole frame."""
    parts = [_HEAD.pack(sub_id, len(leases))]
    append = parts.append
    shapes = _shapes
    for lease in leases:
        r = lease.rec
        p = r.payload
        if r.headers or lease.retries:
            append(_with_headers(lease, r))
            continue
        got = shapes.get((r.sn, r.topic, len(p)))
        if got is None:
            got = _shape(r.sn, r.topic, len(p))
        append(got[0](lease.wire, lease.deliveries, r.seq, r.lock_ts_ms, r.broker_ts_us,
                      got[1], p))
    return b"".join(parts)


def _with_headers(lease: Any, r: Any) -> bytes:
    """One message of MESSAGES whose record has headers or whose lease was retried."""
    h = dict(r.headers or {})
    if lease.retries:
        h["retries"] = lease.retries
    hdr = json.dumps(h, separators=(",", ":")).encode()
    p = r.payload
    return b"".join((_MSG.pack(lease.wire, lease.deliveries, r.seq, r.lock_ts_ms,
                               r.broker_ts_us), _s8(r.sn), _s8(r.topic), _U16.pack(len(hdr)),
                     hdr, _U32.pack(len(p)), p))


def _leases(body: bytes, pos: int, what: str) -> list[tuple[int, int]]:
    if len(body) < pos + 2:
        raise BadBody(f"{what} body truncated")
    (count,) = _U16.unpack_from(body, pos)
    pos += 2
    if len(body) != pos + count * 10:
        raise BadBody(f"{what} body: {count} leases need {count * 10} bytes, "
                      f"got {len(body) - pos}")
    return list(_LEASE.iter_unpack(body[pos:]))


def decode_ack(body: bytes) -> tuple[int, list[tuple[int, int]]]:
    """ACK body -> (sub_id, leases)."""
    if len(body) < 4:
        raise BadBody("ACK body truncated")
    (sub_id,) = _U32.unpack_from(body, 0)
    return sub_id, _leases(body, 4, "ACK")


def decode_nack(body: bytes) -> tuple[int, int, str, list[tuple[int, int]]]:
    """NACK body -> (sub_id, delay_ms, reason, leases)."""
    if len(body) < 10:
        raise BadBody("NACK body truncated")
    sub_id, delay_ms = _NACK.unpack_from(body, 0)
    (rlen,) = _U16.unpack_from(body, 8)
    if len(body) < 10 + rlen:
        raise BadBody("NACK reason truncated")
    try:
        reason = bytes(body[10:10 + rlen]).decode()
    except UnicodeError:
        raise BadBody("NACK reason is not UTF-8") from None
    return sub_id, delay_ms, reason, _leases(body, 10 + rlen, "NACK")
