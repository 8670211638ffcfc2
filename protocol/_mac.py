# Frame MACs (SPEC 2, "Frame MACs"): on plain TCP a lock's session seals every frame
# after AUTH with a 16-byte tag under a key derived from the handshake. Loaded only
# by a session that has MACs on, so a lock on TLS does not carry it in RAM.
#
# One implementation, what a lock runs: frame_tag over _hmac's HMAC, a session's key
# padded once and its pads kept on the session (session_pads). A host process that
# chose its compiled core (lockmq.accel, once, at import) hands this module the core's
# tags with use(); sessions then seal and open through those, the same bytes
# (tests/protocol/test_frame_macs.py holds the two equal).
import struct

from ._const import const
from ._frame import encode_frame, op_name
from ._hmac import hmac_sha256, hmac_pads, hmac_padded, compare_digest

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


# The tags sessions seal and open with: _keyed(key) -> the key's HMAC state, made once
# a session; _tag(state, direction, counter, opcode, flags, opaque, sn bytes, body) ->
# the frame's tag. This module's own, or the compiled core's (use()).
_keyed = hmac_pads
_tag = _padded_tag


def use(keyed, tag):
    """Seal and open every frame from now on with ``tag(keyed(session key), direction,
    counter, opcode, flags, opaque, sn, body)``: :func:`frame_tag`'s bytes, computed
    faster (the host's compiled core: lockmq.accel calls this once, at import).
    ``use(None, None)``: this module's own again."""
    global _keyed, _tag
    _keyed = keyed or hmac_pads
    _tag = tag or _padded_tag


def session_pads(sess):
    """``sess``'s key as the HMAC state of the tags in use (:func:`use`), made on first
    use and kept on the session (made again for a new key, or other tags)."""
    key = sess.mac_key
    held = getattr(sess, "_mac_pads", None)
    if held is None or held[0] is not key or held[1] is not _keyed:
        held = sess._mac_pads = (key, _keyed, _keyed(key))
    return held[2]


def _session_tag(sess, direction, counter, opcode, sn, flags, opaque, body):
    # a frame's tag under sess's key, from the state it keeps
    return _tag(session_pads(sess), direction, counter, opcode, flags, opaque, _b(sn), body)


def seal(sess, opcode, sn, body, opaque, flags):
    """``sess.seal`` with MACs on: the frame flagged MAC, its tag appended."""
    flags |= _FLAG_MAC
    tag = _session_tag(sess, sess._OUT, sess.tx, opcode, sn, flags, opaque, body)
    sess.tx += 1
    return encode_frame(opcode, sn, bytes(body) + tag, opaque, flags)


def open_frame(sess, frame):
    """Check and strip a received frame's tag; a SessionError (BAD_MAC, fatal) when
    it is missing or wrong: the frame was altered, injected, replayed or reordered.
    An action of the session's, not a transition: the session's _process ends it."""
    body = frame.body
    if sess.mac_key is None:
        raise _refused("a MAC flag on a session without frame MACs")
    if not frame.flags & _FLAG_MAC or len(body) < TAG_SIZE:
        raise _refused("%s without a frame tag" % op_name(frame.opcode))
    body, tag = body[:-TAG_SIZE], body[-TAG_SIZE:]
    want = _session_tag(sess, 1 - sess._OUT, sess.rx, frame.opcode, frame.sn,
                        frame.flags, frame.opaque, body)
    if not compare_digest(want, tag):
        raise _refused("%s with a bad frame tag (altered, injected, replayed or "
                       "reordered)" % op_name(frame.opcode))
    sess.rx += 1
    frame.body = bytes(body)


def _refused(message):
    # (imported here: _session loads this module, and a good frame never needs it)
    from ._session import fatal_error
    return fatal_error(message, _E_BAD_MAC)
