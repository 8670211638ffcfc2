"""MQTT field readers and writers: integers, variable byte integers, UTF-8 strings,
binary data and MQTT 5 properties (sections 1.5 and 2.2.2)."""

from __future__ import annotations

import struct
from typing import Any

from ._errors import MalformedPacket

MAX_VARINT = 268_435_455
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# property id -> (name, type); type: b byte, h u16, i u32, v varint, s utf-8, d binary, p pair
PROPERTIES: dict[int, tuple[str, str]] = {
    0x01: ("payload_format", "b"), 0x02: ("message_expiry", "i"),
    0x03: ("content_type", "s"), 0x08: ("response_topic", "s"),
    0x09: ("correlation_data", "d"), 0x0B: ("subscription_id", "v"),
    0x11: ("session_expiry", "i"), 0x12: ("assigned_client_id", "s"),
    0x13: ("server_keep_alive", "h"), 0x15: ("auth_method", "s"),
    0x16: ("auth_data", "d"), 0x17: ("request_problem_info", "b"),
    0x18: ("will_delay", "i"), 0x19: ("request_response_info", "b"),
    0x1A: ("response_info", "s"), 0x1C: ("server_reference", "s"),
    0x1F: ("reason_string", "s"), 0x21: ("receive_maximum", "h"),
    0x22: ("topic_alias_maximum", "h"), 0x23: ("topic_alias", "h"),
    0x24: ("maximum_qos", "b"), 0x25: ("retain_available", "b"),
    0x26: ("user_property", "p"), 0x27: ("maximum_packet_size", "i"),
    0x28: ("wildcard_available", "b"), 0x29: ("subscription_id_available", "b"),
    0x2A: ("shared_available", "b"),
}
PROPERTY_IDS: dict[str, tuple[int, str]] = {name: (pid, t) for pid, (name, t) in PROPERTIES.items()}


def encode_varint(n: int) -> bytes:
    """A variable byte integer (1..4 bytes)."""
    if not 0 <= n <= MAX_VARINT:
        raise ValueError(f"{n} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_str(s: str) -> bytes:
    """A UTF-8 string with its 2-byte length."""
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _U16.pack(len(b)) + b


def encode_bin(b: bytes) -> bytes:
    """Binary data with its 2-byte length."""
    if len(b) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return _U16.pack(len(b)) + bytes(b)


def encode_props(props: dict[str, Any] | None) -> bytes:
    """MQTT 5 properties (with their length); ``user_property`` is a list of pairs,
    ``subscription_id`` an int or a list of ints."""
    if not props:
        return b"\x00"
    out = bytearray()
    for name, value in props.items():
        if value is None:
            continue
        pid, t = PROPERTY_IDS[name]
        values = value if t == "p" or (name == "subscription_id" and isinstance(value, list)) \
            else [value]
        for v in values:
            out.append(pid)
            if t == "b":
                out.append(int(v))
            elif t == "h":
                out += _U16.pack(int(v))
            elif t == "i":
                out += _U32.pack(int(v))
            elif t == "v":
                out += encode_varint(int(v))
            elif t == "s":
                out += encode_str(v)
            elif t == "d":
                out += encode_bin(v)
            else:
                out += encode_str(v[0]) + encode_str(v[1])
    return encode_varint(len(out)) + bytes(out)


class Reader:
    """Reads the fields of one packet body; every short read is :class:`MalformedPacket`."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def left(self) -> int:
        """Bytes not read yet."""
        return self.end - self.pos

    def _take(self, n: int) -> bytes:
        p = self.pos
        if p + n > self.end:
            raise MalformedPacket(f"packet ends {p + n - self.end} bytes short")
        self.pos = p + n
        return self.buf[p:p + n]

    def u8(self) -> int:
        """One byte."""
        if self.pos >= self.end:
            raise MalformedPacket("packet ends 1 byte short")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def u16(self) -> int:
        """A two-byte integer."""
        return int(_U16.unpack(self._take(2))[0])

    def u32(self) -> int:
        """A four-byte integer."""
        return int(_U32.unpack(self._take(4))[0])

    def varint(self) -> int:
        """A variable byte integer (at most 4 bytes)."""
        n = shift = 0
        for _ in range(4):
            b = self.u8()
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
        raise MalformedPacket("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        """Binary data with its 2-byte length."""
        return bytes(self._take(self.u16()))

    def string(self) -> str:
        """A UTF-8 string (no U+0000, as the spec requires)."""
        raw = self._take(self.u16())
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("string is not valid UTF-8") from None
        if "\x00" in s:
            raise MalformedPacket("string contains U+0000")
        return s

    def rest(self) -> bytes:
        """Everything left (a PUBLISH payload, a CONNECT password)."""
        return bytes(self._take(self.left()))

    def props(self) -> dict[str, Any]:
        """MQTT 5 properties; a repeated single-valued property is malformed."""
        n = self.varint()
        sub = Reader(self.buf, self.pos, self.pos + n)
        if sub.end > self.end:
            raise MalformedPacket("properties run past the packet")
        self.pos = sub.end
        out: dict[str, Any] = {}
        while sub.left():
            pid = sub.varint()
            spec = PROPERTIES.get(pid)
            if spec is None:
                raise MalformedPacket(f"unknown property 0x{pid:02x}")
            name, t = spec
            if t == "b":
                v: Any = sub.u8()
            elif t == "h":
                v = sub.u16()
            elif t == "i":
                v = sub.u32()
            elif t == "v":
                v = sub.varint()
            elif t == "s":
                v = sub.string()
            elif t == "d":
                v = sub.binary()
            else:
                out.setdefault(name, []).append((sub.string(), sub.string()))
                continue
            if name == "subscription_id":
                out.setdefault(name, []).append(v)
                continue
            if name in out:
                raise MalformedPacket(f"property {name} given twice")
            out[name] = v
        return out
