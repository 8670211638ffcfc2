# Frame MACs (SPEC 2, "Frame MACs"): on plain TCP a lock's session seals every frame
# after AUTH with a 16-byte tag under a key derived from the handshake. Loaded only
# by a session that has MACs on, so a lock on TLS does not carry it in RAM.
#
# One implementation, what a lock runs: frame_tag over _hmac's HMAC, a session's key
# padded once and its pads kept on the session (session_pads). A host process that
# chose its compiled core (lockmq.accel, once, at import) puts the core's tags in
# their place (protocol/compiled.py); sessions then seal and open through those, the
# same bytes (tests/protocol/test_frame_macs.py holds the two equal).
import struct

from ._const import const
from ._frame import encode_frame, op_name
from ._hmac import hmac_sha256, hmac_pads, hmac_padded, compare_digest
from ._session import fatal_error   # (_session loads this module only when a session uses it)

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
    return _padded_tag(hmac_pads(skey), direction, counter, opcode, flags, opaque, _b(sn),
                       body)


def _padded_tag(pads, direction, counter, opcode, flags, opaque, snb, body):
    # frame_tag from the key's hmac_pads (a session makes them once)
    head = struct.pack(">BIHBIB", direction, counter & 0xFFFFFFFF, opcode, flags, opaque, len(snb))
    return hmac_padded(pads, head + snb + bytes(body))[:TAG_SIZE]


# What sessions seal and open with: _keyed(key) -> the key's HMAC state, made once a
# session; _tag(state, direction, counter, opcode, flags, opaque, sn bytes, body) -> a
# frame's tag; _equal, the tag compare. This module's own, or a host's compiled core's
# (protocol/compiled.py sets all three once, at import; a lock never does).
_keyed = hmac_pads
_tag = _padded_tag
_equal = compare_digest


def session_pads(sess):
    """``sess``'s key as the HMAC state of the tags in use, made on first use and kept
    on the session (made again for a new key)."""
    key = sess.mac_key
    held = getattr(sess, "_mac_pads", None)
    if held is None or held[0] is not key:
        held = sess._mac_pads = (key, _keyed(key))
    return held[1]


def seal(sess, opcode, sn, body, opaque, flags):
    """``sess.seal`` with MACs on: the frame flagged MAC, its tag appended."""
    flags |= _FLAG_MAC
    snb = _b(sn)
    tag = _tag(session_pads(sess), sess._OUT, sess.tx, opcode, flags, opaque, snb, body)
    sess.tx += 1
    return encode_frame(opcode, sn, bytes(body) + tag, opaque, flags)


def open_frame(sess, frame):
    """Check and strip a received frame's tag; a SessionError (BAD_MAC, fatal) when
    it is missing or wrong: the frame was altered, injected, replayed or reordered.
    An action of the session's, not a transition: the session's _process ends it."""
    body = frame.body
    if sess.mac_key is None:
        raise fatal_error("a MAC flag on a session without frame MACs", _E_BAD_MAC)
    if not frame.flags & _FLAG_MAC or len(body) < TAG_SIZE:
        raise fatal_error("%s without a frame tag" % op_name(frame.opcode), _E_BAD_MAC)
    body, tag = body[:-TAG_SIZE], body[-TAG_SIZE:]
    want = _tag(session_pads(sess), 1 - sess._OUT, sess.rx, frame.opcode, frame.flags,
                frame.opaque, _b(frame.sn), body)
    if not _equal(want, tag):
        raise fatal_error("%s with a bad frame tag (altered, injected, replayed or "
                          "reordered)" % op_name(frame.opcode), _E_BAD_MAC)
    sess.rx += 1
    frame.body = bytes(body)
