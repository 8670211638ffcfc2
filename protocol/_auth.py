# What a lock signs, and what a broker signs for a lock. Both are HMAC-SHA256
# under the lock's per-device key, over domain-separated messages, so a proof
# made for one purpose can never be replayed for another.
#
# The session transcript (SPEC 2, "The session transcript"): the AUTH proof and the
# frame-MAC session key both cover a hash of everything the two ends agreed on --
# the CONNECT's flags (MAC on/off), SN and whole body (role, keepalive, client,
# protocol version, frame limit, any later field) and the CHALLENGE's whole body
# (nonce, time, methods, the broker's id). A byte changed on the path in either
# direction gives a proof the broker refuses and a key the lock's CONNECT_ACK check
# refuses: nothing negotiated can be downgraded without the device key.
import struct
import hashlib

from ._const import const
from ._hmac import hmac_sha256, compare_digest

AUTH_DOMAIN = b"lockmq-auth-v2"
TRANSCRIPT_DOMAIN = b"lockmq-transcript-v1"
COMMAND_DOMAIN = b"lockmq-cmd-v1"
# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_VERSION = const(1)
# -- end of generated protocol numbers --


def _b(sn):
    return sn.encode() if isinstance(sn, str) else bytes(sn)


def transcript_hash(sn, connect_flags, connect_body, challenge_body):
    """SHA-256 of the handshake as both ends saw it: "lockmq-transcript-v1" | version u8
    | CONNECT flags u8 | sn_len u8 | sn | u16 len | CONNECT body | u16 len | CHALLENGE body."""
    snb = _b(sn)
    # one buffer, one hash call: both bodies are small (a storm of locks hashes one each)
    return hashlib.sha256(b"".join((
        TRANSCRIPT_DOMAIN, struct.pack(">BBB", _VERSION, connect_flags & 0xFF, len(snb)), snb,
        struct.pack(">H", len(connect_body)), bytes(connect_body),
        struct.pack(">H", len(challenge_body)), bytes(challenge_body)))).digest()


def auth_proof(key, nonce, cnonce, sn, transcript):
    """The lock's answer to a CHALLENGE:
    HMAC(key, "lockmq-auth-v2" | nonce | cnonce | sn_len u8 | sn | transcript)."""
    snb = _b(sn)
    return hmac_sha256(key, AUTH_DOMAIN + bytes(nonce) + bytes(cnonce) + bytes((len(snb),)) + snb,
                       bytes(transcript))


def command_mac(key, sn, cmd_id, expires_ms, kind, args):
    """The broker's signature on a COMMAND for lock ``sn``."""
    # args hashed in place (no concatenated copy: it may be most of a lock's free heap)
    return hmac_sha256(key, COMMAND_DOMAIN + _b(sn) + struct.pack(">IQB", cmd_id, expires_ms, kind),
                       args)


def verify_auth_proof(key, nonce, cnonce, sn, transcript, proof):
    return compare_digest(auth_proof(key, nonce, cnonce, sn, transcript), proof)


def verify_command(key, sn, command):
    """True when ``command``'s MAC was made with ``key`` for lock ``sn``."""
    return compare_digest(
        command_mac(key, sn, command.cmd_id, command.expires_ms, command.kind, command.args),
        command.mac)
