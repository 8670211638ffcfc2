# Frames: the envelope every message travels in, and the incremental decoder
# that cuts a TCP byte stream into frames (the paper's sticky/split packets).
#
#   version u8 | length u32 | opcode u16 | sn_len u8 | sn | flags u8 |
#   opaque u32 | body | crc16
#
# ``length`` counts the whole frame, first byte to last CRC byte. Big-endian.
import struct
import sys

from ._const import const
from . import _crc
from ._errors import (BadFrame, UnsupportedVersion, FrameTooLarge,
                      BadChecksum, UnknownOpcode, LocalProtocolError)

# The format's numbers, and _LOCK_KNOWN: every opcode, a constant tuple (in flash on
# a board): a lock does not import _constants, whose classes would take its heap.
# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
VERSION = const(1)
HEADER_SIZE = const(8)
SUBHEADER_SIZE = const(5)
CRC_SIZE = const(2)
MIN_FRAME = const(15)
MAX_SN = const(64)
DEFAULT_MAX_FRAME = const(65536)
HARD_MAX_FRAME = const(16777216)
_LOCK_KNOWN = (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14,
               0x15, 0x16, 0x17, 0x18, 0x19, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27,
               0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x100, 0x101)
# -- end of generated protocol numbers --

# MicroPython (the lock) hashes the CRC through a memoryview; CPython (crc_hqx, the
# broker's hot path) slices, which is faster there.
_VIEW = sys.implementation.name == "micropython"
if _VIEW:
    _KNOWN_OPCODES = _LOCK_KNOWN

    def op_name(opcode):
        """An opcode in hex (a lock keeps no table of names)."""
        return "0x%04x" % opcode
else:
    from ._constants import OP_NAMES as _KNOWN_OPCODES, op_name
_CRC = ">H"

# The whole fixed part of a frame with an SN of n bytes, read (or written) in one call.
_HEAD_BY_SN_LEN = {}
_PACK_BY_SN_LEN = {}


def _pack_struct(sn_len):
    fmt = ">BIHB%dsBI" % sn_len
    try:
        pack = struct.Struct(fmt).pack
    except AttributeError:           # MicroPython has no struct.Struct
        def pack(*values):
            return struct.pack(fmt, *values)
    _PACK_BY_SN_LEN[sn_len] = pack   # (sn_len is at most MAX_SN: checked before)
    return pack


def _head_struct(sn_len):
    fmt = ">BIHB%dsBI" % sn_len
    try:
        unpack = struct.Struct(fmt).unpack_from
    except AttributeError:           # MicroPython has no struct.Struct
        def unpack(buf, pos):
            return struct.unpack_from(fmt, buf, pos)
    if sn_len <= MAX_SN:
        _HEAD_BY_SN_LEN[sn_len] = unpack
    return unpack


class Frame:
    """One decoded frame. ``sn`` is a str; ``body`` is bytes."""
    __slots__ = ("opcode", "sn", "flags", "opaque", "body", "version")

    def __init__(self, opcode, sn, flags, opaque, body, version=VERSION):
        self.opcode = opcode
        self.sn = sn
        self.flags = flags
        self.opaque = opaque
        self.body = body
        self.version = version

    def __eq__(self, other):
        return (isinstance(other, Frame) and self.opcode == other.opcode
                and self.sn == other.sn and self.flags == other.flags
                and self.opaque == other.opaque and self.body == other.body
                and self.version == other.version)

    def __repr__(self):
        return "Frame(%s sn=%r flags=%d opaque=%d body=%d bytes)" % (
            op_name(self.opcode), self.sn, self.flags, self.opaque, len(self.body))

    def encode(self):
        """The frame's bytes on the wire."""
        return encode_frame(self.opcode, self.sn, self.body, self.opaque, self.flags)


def _sn_bytes(sn):
    if isinstance(sn, str):
        sn = sn.encode()
    if len(sn) > MAX_SN:
        raise LocalProtocolError("lock SN is %d bytes, at most %d" % (len(sn), MAX_SN))
    return sn


def encode_frame(opcode, sn, body=b"", opaque=0, flags=0):
    """Encode one frame; ``sn`` is str or bytes (at most 64 bytes)."""
    snb = _sn_bytes(sn)
    n = len(snb)
    length = MIN_FRAME + n + len(body)
    if length > HARD_MAX_FRAME:
        raise LocalProtocolError("frame of %d bytes exceeds %d" % (length, HARD_MAX_FRAME))
    if not 0 <= opcode <= 0xFFFF or not 0 <= flags <= 0xFF or not 0 <= opaque <= 0xFFFFFFFF:
        raise LocalProtocolError("opcode, flags or opaque out of range")
    pack = _PACK_BY_SN_LEN.get(n) or _pack_struct(n)
    data = pack(VERSION, length, opcode, n, snb, flags, opaque) + body
    return data + struct.pack(_CRC, _crc.crc16_init(data, 0xFFFF))


class FrameDecoder:
    """Incremental, sans-IO frame decoder.

    Feed it bytes in chunks of any size with :meth:`feed`; take whole frames
    with :meth:`next_frame` (None means "need more data"). A frame's declared
    length is checked against ``max_frame`` as soon as its first 5 bytes are
    in, so a hostile length never makes it buffer more than ``max_frame``
    beyond one chunk. After a fatal error the decoder stays broken (a byte
    stream cannot be resynchronised); :class:`UnknownOpcode` is not fatal.
    """

    def __init__(self, max_frame=DEFAULT_MAX_FRAME, known_opcodes=None):
        if not MIN_FRAME <= max_frame <= HARD_MAX_FRAME:
            raise LocalProtocolError("max_frame must be within %d..%d" % (MIN_FRAME, HARD_MAX_FRAME))
        self.max_frame = max_frame
        self._known = _KNOWN_OPCODES if known_opcodes is None else known_opcodes
        self._buf = b""
        self._pos = 0
        self._error = None
        self._sn_cache = {}

    def feed(self, data):
        """Append received bytes."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            # Nothing pending (the usual case): decode straight from the
            # caller's bytes, so bodies are sliced out without another copy.
            self._buf = data if isinstance(data, bytes) else bytes(data)
        else:
            # A frame is split across reads: accumulate in a bytearray, which
            # grows in amortised constant time even if a peer trickles bytes.
            if pos or isinstance(buf, bytes):
                buf = bytearray(buf[pos:])
            buf.extend(data)
            self._buf = buf
        self._pos = 0

    def buffered(self):
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def next_frame(self):
        """Return the next whole frame, or None when more bytes are needed."""
        for frame in self._decode(1):
            return frame
        return None

    def frames(self):
        """Iterate over every whole frame buffered so far.

        Frames before a bad one are returned first, then the error is raised.
        """
        return self._decode(-1)

    def _decode(self, limit):
        # One tight loop for every frame in the buffer: the broker decodes a
        # whole socket read at once, so per-frame overhead is what counts.
        # (max_frame is read per frame: it grows once the peer has authenticated,
        # possibly in the middle of one read.)
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        size = len(buf)
        known = self._known
        sn_cache = self._sn_cache
        while limit:
            avail = size - pos
            if avail < HEADER_SIZE:
                if avail >= 5:   # the length is in: refuse a hostile one now
                    self._check_length(buf[pos], struct.unpack_from(">I", buf, pos + 1)[0])
                break
            sn_len = buf[pos + 7]
            if avail < HEADER_SIZE + sn_len + SUBHEADER_SIZE:
                self._check_length(buf[pos], struct.unpack_from(">I", buf, pos + 1)[0], sn_len)
                break
            unpack = _HEAD_BY_SN_LEN.get(sn_len) or _head_struct(sn_len)
            version, length, opcode, _, snb, flags, opaque = unpack(buf, pos)
            if version != VERSION or sn_len > MAX_SN or not MIN_FRAME + sn_len <= length <= self.max_frame:
                self._check_length(version, length, sn_len)
            end = pos + length
            if end > size:
                break
            # (a lock checks the CRC through a view: no second copy of a big frame)
            if _crc.crc16_init(memoryview(buf)[pos:end - CRC_SIZE] if _VIEW else buf[pos:end - CRC_SIZE],
                          0xFFFF) \
                    != (buf[end - 2] << 8) | buf[end - 1]:
                self._pos = pos
                self._fail(BadChecksum("checksum mismatch in a %s frame" % op_name(opcode)))
            body_start = pos + HEADER_SIZE + sn_len + SUBHEADER_SIZE
            pos = end
            self._pos = pos
            if opcode not in known:
                raise UnknownOpcode("unknown opcode 0x%04x (frame skipped)" % opcode)
            sn = sn_cache.get(snb)
            if sn is None:
                sn = self._sn_text(snb)
            limit -= 1
            yield Frame(opcode, sn, flags, opaque, bytes(buf[body_start:end - CRC_SIZE]), version)
            if self._buf is not buf:   # feed() ran meanwhile: this iterator is stale
                return
        self._pos = pos

    def _check_length(self, version, length, sn_len=0):
        if version != VERSION:
            self._fail(UnsupportedVersion("frame version %d, this side speaks %d" % (version, VERSION)))
        if length > self.max_frame:
            self._fail(FrameTooLarge(
                "frame of %d bytes exceeds the limit of %d" % (length, self.max_frame)))
        if length < MIN_FRAME:
            self._fail(BadFrame("frame length %d is below the minimum %d" % (length, MIN_FRAME)))
        if sn_len > MAX_SN or length < MIN_FRAME + sn_len:
            self._fail(BadFrame("lock SN of %d bytes does not fit the frame" % sn_len))

    def _sn_text(self, snb):
        try:
            sn = snb.decode()
        except UnicodeError:
            self._fail(BadFrame("lock SN is not text"))
        if len(self._sn_cache) < 16:   # one connection speaks for one or a few SNs
            self._sn_cache[snb] = sn
        return sn

    def _fail(self, error):
        self._error = error
        raise error
