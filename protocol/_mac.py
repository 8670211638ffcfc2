# Frame MACs (SPEC 2, "Frame MACs"): on plain TCP a lock's session seals every frame
# after AUTH with a 16-byte tag under a key derived from the handshake. Loaded only
# by a session that has MACs on, so a lock on TLS does not carry it in RAM.
import struct

from ._const import const
from ._frame import op_name
from ._hmac import hmac_sha256, compare_digest

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
TAG_SIZE = const(16)
TO_BROKER = const(0)
TO_CLIENT = const(1)
_E_BAD_MAC = const(17)
_FLAG_MAC = const(4)
# -- end of generated protocol numbers --

SESSION_DOMAIN = b"lockmq-session-v2"


def _b(sn):
    return sn.encode() if isinstance(sn, str) else bytes(sn)


def session_key(key, nonce, cnonce, sn, transcript):
    """The session's frame-MAC key: HMAC(key, "lockmq-session-v2" | nonce | cnonce |
    sn_len u8 | sn | transcript) -- bound to what the handshake agreed (_auth.py)."""
    snb = _b(sn)
    return hmac_sha256(key, SESSION_DOMAIN + bytes(nonce) + bytes(cnonce) + bytes((len(snb),)) + snb,
                       bytes(transcript))


def frame_tag(skey, direction, counter, opcode, sn, flags, opaque, body):
    """A frame's tag: HMAC(session key, direction u8 | counter u32 | opcode u16 | flags u8 |
    opaque u32 | sn_len u8 | sn | body)[:16]. ``counter`` counts the frames already sealed
    in that direction, so a replayed, dropped or reordered frame fails."""
    snb = _b(sn)
    head = struct.pack(">BIHBIB", direction, counter & 0xFFFFFFFF, opcode, flags, opaque, len(snb))
    return hmac_sha256(skey, head + snb + bytes(body))[:TAG_SIZE]


def seal(sess, opcode, sn, body, opaque, flags):
    """``sess.seal`` with MACs on: the frame flagged MAC, its tag appended."""
    from ._frame import encode_frame
    flags |= _FLAG_MAC
    tag = frame_tag(sess.mac_key, sess._OUT, sess.tx, opcode, sn, flags, opaque, body)
    sess.tx += 1
    return encode_frame(opcode, sn, bytes(body) + tag, opaque, flags)


def open_frame(sess, frame):
    """Check and strip a received frame's tag; a SessionError (BAD_MAC, fatal) when
    it is missing or wrong: the frame was altered, injected, replayed or reordered.
    An action of the session's, not a transition: the session's _process ends it."""
    from ._session import fatal_error
    body = frame.body
    if sess.mac_key is None:
        raise fatal_error("a MAC flag on a session without frame MACs", _E_BAD_MAC)
    if not frame.flags & _FLAG_MAC or len(body) < TAG_SIZE:
        raise fatal_error("%s without a frame tag" % op_name(frame.opcode), _E_BAD_MAC)
    body, tag = body[:-TAG_SIZE], body[-TAG_SIZE:]
    want = frame_tag(sess.mac_key, 1 - sess._OUT, sess.rx, frame.opcode, frame.sn,
                     frame.flags, frame.opaque, body)
    if not compare_digest(want, tag):
        raise fatal_error("%s with a bad frame tag (altered, injected, replayed or "
                          "reordered)" % op_name(frame.opcode), _E_BAD_MAC)
    sess.rx += 1
    frame.body = bytes(body)
