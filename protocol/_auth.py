# What a lock signs, and what a broker signs for a lock. Both are HMAC-SHA256
# under the lock's per-device key, over domain-separated messages, so a proof
# made for one purpose can never be replayed for another.
import struct

from ._hmac import hmac_sha256, compare_digest

AUTH_DOMAIN = b"lockmq-auth-v1"
COMMAND_DOMAIN = b"lockmq-cmd-v1"
SESSION_DOMAIN = b"lockmq-session-v1"
TAG_SIZE = 16          # frame tags: HMAC-SHA256 cut to 128 bits
TO_BROKER = 0          # direction byte of a frame tag: client -> broker
TO_CLIENT = 1          # broker -> client (a frame reflected back fails)


def _b(sn):
    return sn.encode() if isinstance(sn, str) else bytes(sn)


def auth_proof(key, nonce, cnonce, sn):
    """The lock's answer to a CHALLENGE: HMAC(key, domain | nonce | cnonce | sn)."""
    return hmac_sha256(key, AUTH_DOMAIN + bytes(nonce) + bytes(cnonce) + _b(sn))


def command_mac(key, sn, cmd_id, expires_ms, kind, args):
    """The broker's signature on a COMMAND for lock ``sn``."""
    return hmac_sha256(key, COMMAND_DOMAIN + _b(sn) + struct.pack(">IQB", cmd_id, expires_ms, kind)
                       + bytes(args))


def verify_auth_proof(key, nonce, cnonce, sn, proof):
    return compare_digest(auth_proof(key, nonce, cnonce, sn), proof)


def verify_command(key, sn, command):
    """True when ``command``'s MAC was made with ``key`` for lock ``sn``."""
    return compare_digest(
        command_mac(key, sn, command.cmd_id, command.expires_ms, command.kind, command.args),
        command.mac)


def session_key(key, nonce, cnonce, sn):
    """The session's frame-MAC key: HMAC(key, "lockmq-session-v1" | nonce | cnonce | sn)."""
    return hmac_sha256(key, SESSION_DOMAIN + bytes(nonce) + bytes(cnonce) + _b(sn))


def frame_tag(skey, direction, counter, opcode, sn, flags, opaque, body):
    """A frame's 16-byte tag: HMAC(session key, direction u8 | counter u32 | opcode u16 |
    flags u8 | opaque u32 | sn_len u8 | sn | body)[:16]. ``counter`` counts the frames
    already sealed in that direction, so a replayed, dropped or reordered frame fails."""
    snb = _b(sn)
    head = struct.pack(">BIHBIB", direction, counter & 0xFFFFFFFF, opcode, flags, opaque, len(snb))
    return hmac_sha256(skey, head + snb + bytes(body))[:TAG_SIZE]
