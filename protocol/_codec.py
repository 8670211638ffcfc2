# Small helpers to read and write body fields: fixed-width big-endian ints,
# and length-prefixed strings/bytes (str8 = u8 length + UTF-8, bytes16 = u16
# length + bytes, ...).
import struct

from ._errors import BadBody, LocalProtocolError


class Reader:
    """Reads fields from a body, raising BadBody when it is too short."""

    def __init__(self, data, what):
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, n):
        p = self.pos
        if p + n > len(self.data):
            raise BadBody("%s body truncated at byte %d" % (self.what, p))
        self.pos = p + n
        return self.data[p:p + n]

    def unpack(self, fmt, size):
        p = self.pos
        if p + size > len(self.data):
            raise BadBody("%s body truncated at byte %d" % (self.what, p))
        self.pos = p + size
        return struct.unpack_from(fmt, self.data, p)

    def u8(self):
        return self.unpack(">B", 1)[0]

    def u16(self):
        return self.unpack(">H", 2)[0]

    def u32(self):
        return self.unpack(">I", 4)[0]

    def u64(self):
        return self.unpack(">Q", 8)[0]

    def bytes8(self):
        return bytes(self.take(self.u8()))

    def bytes16(self):
        return bytes(self.take(self.u16()))

    def bytes32(self):
        return bytes(self.take(self.u32()))

    def text(self, raw):
        try:
            return raw.decode()
        except UnicodeError:
            raise BadBody("%s body has a text field that is not UTF-8" % self.what)

    def str8(self):
        return self.text(self.bytes8())

    def str16(self):
        return self.text(self.bytes16())

    def rest(self):
        data = bytes(self.data[self.pos:])
        self.pos = len(self.data)
        return data

    def end(self):
        if self.pos != len(self.data):
            raise BadBody("%s body has %d trailing bytes" % (self.what, len(self.data) - self.pos))


def _raw(value):
    return value.encode() if isinstance(value, str) else bytes(value)


def pack8(value, what="field"):
    """u8 length + bytes (str is encoded as UTF-8)."""
    raw = _raw(value)
    if len(raw) > 0xFF:
        raise LocalProtocolError("%s is %d bytes, at most 255" % (what, len(raw)))
    return struct.pack(">B", len(raw)) + raw


def pack16(value, what="field"):
    """u16 length + bytes (str is encoded as UTF-8)."""
    raw = _raw(value)
    if len(raw) > 0xFFFF:
        raise LocalProtocolError("%s is %d bytes, at most 65535" % (what, len(raw)))
    return struct.pack(">H", len(raw)) + raw


def pack32(value):
    """u32 length + bytes."""
    raw = _raw(value)
    return struct.pack(">I", len(raw)) + raw


def check_range(value, bits, what):
    if not 0 <= value < (1 << bits):
        raise LocalProtocolError("%s=%r does not fit u%d" % (what, value, bits))
    return value
