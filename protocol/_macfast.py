# The CPython fast path of frame MACs: the same tags as _mac.py, computed with the
# session key's HMAC pads hashed once per session (a copy of each hash state per
# frame) instead of the key XORed and both pads hashed again for every frame, and the
# tag compared by the standard library's constant-time compare_digest. A broker seals
# every answer and opens every frame of each lock that asked for MACs: this took the
# two tags of a PUBLISH and its ack from ~10 to ~1.5 µs. A run of stored records'
# acks is sealed in one call (sealed_publish_acks), as _fast packs the unsealed ones.
#
# install() puts these on _Session (seal, _open), so ClientSession and ServerSession
# use them; vectors.json is checked with and without (tests/protocol/
# test_mac_fast_path.py). lockmq.protocol installs it on CPython only: MicroPython never
# imports this module (its hashlib objects have no copy()).
import hashlib
import hmac
import struct

from ._constants import ErrorCode, Op, Flag
from ._fast import ack_run
from ._frame import encode_frame, op_name
from ._mac import TAG_SIZE
from ._session import _Session, fatal_error

_FLAG_MAC = Flag.MAC
_E_BAD_MAC = ErrorCode.BAD_MAC
_BLOCK = 64
#: the tag's header: direction u8 | counter u32 | opcode u16 | flags u8 | opaque u32 | sn_len u8
_HEAD = struct.Struct(">BIHBIB")
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))
#: a PUBLISH_ACK's body: status u8 | offset u64
_ACK_BODY = struct.Struct(">BQ")
#: the portable methods, put back by install(False)
_PORTABLE = (_Session.seal, _Session._open)


def _pads(sess):
    """(key, inner, outer): the session key's HMAC-SHA256 pads, hashed once and kept on
    the session (made again if its key changed)."""
    key = sess.mac_key
    pads = getattr(sess, "_mac_pads", None)
    if pads is None or pads[0] is not key:
        k = key if len(key) <= _BLOCK else hashlib.sha256(key).digest()
        k = bytes(k).ljust(_BLOCK, b"\0")
        pads = (key, hashlib.sha256(k.translate(_IPAD)), hashlib.sha256(k.translate(_OPAD)))
        sess._mac_pads = pads
    return pads


def frame_tag(sess, direction, counter, opcode, sn, flags, opaque, body):
    """_mac.frame_tag under ``sess``'s key, from its hashed pads."""
    _, inner_pad, outer_pad = _pads(sess)
    snb = sn.encode() if isinstance(sn, str) else bytes(sn)
    inner = inner_pad.copy()
    inner.update(_HEAD.pack(direction, counter & 0xFFFFFFFF, opcode, flags, opaque, len(snb)))
    inner.update(snb)
    inner.update(body)
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return outer.digest()[:TAG_SIZE]


def seal(self, opcode, sn, body, opaque=0, flags=0):
    """_Session.seal: with frame MACs on, flag MAC and append the frame's tag."""
    if self.mac_key is None:
        return encode_frame(opcode, sn, body, opaque, flags)
    flags |= _FLAG_MAC
    body = bytes(body)
    tag = frame_tag(self, self._OUT, self.tx, opcode, sn, flags, opaque, body)
    self.tx += 1
    return encode_frame(opcode, sn, body + tag, opaque, flags)


def open_frame(self, frame):
    """_Session._open: check and strip a received frame's tag (_mac.open_frame's rules
    and errors; an action, not a transition: the session's _process ends it)."""
    flags = frame.flags
    if self.mac_key is None:
        if not flags & _FLAG_MAC:
            return
        raise fatal_error("a MAC flag on a session without frame MACs", _E_BAD_MAC)
    body = frame.body
    if not flags & _FLAG_MAC or len(body) < TAG_SIZE:
        raise fatal_error("%s without a frame tag" % op_name(frame.opcode), _E_BAD_MAC)
    body, tag = body[:-TAG_SIZE], body[-TAG_SIZE:]
    want = frame_tag(self, 1 - self._OUT, self.rx, frame.opcode, frame.sn, flags,
                     frame.opaque, body)
    if not hmac.compare_digest(want, tag):
        raise fatal_error("%s with a bad frame tag (altered, injected, replayed or "
                          "reordered)" % op_name(frame.opcode), _E_BAD_MAC)
    self.rx += 1
    frame.body = bytes(body)


def sealed_publish_acks(sess, batch, results, start):
    """_fast.publish_acks for a session with frame MACs: the PUBLISH_ACKs answering
    ``results[start:]`` up to the first that is not an ``Appended``, each sealed as
    ``sess.seal(Op.PUBLISH_ACK, "", PublishAck(status, offset).encode(), opaque,
    Flag.RESPONSE)`` would (the session's counter advanced once per ack), in one call:
    ``(bytes, frames, stored, duplicates, next index)``. The reference of
    ``lockmq._core.sealed_publish_acks``, which the broker uses when it is built."""
    def sealed_ack(status, offset, opaque):
        return seal(sess, Op.PUBLISH_ACK, "", _ACK_BODY.pack(status, offset), opaque,
                    Flag.RESPONSE)

    return ack_run(batch, results, start, sealed_ack)


def install(on=True):
    """Seal and open frames with the fast path (``on``) or the portable one of
    _mac.py (``on=False``); both give the same tags and refuse the same frames."""
    _Session.seal, _Session._open = (seal, open_frame) if on else _PORTABLE
