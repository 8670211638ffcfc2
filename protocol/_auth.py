# What a lock signs, and what a broker signs for a lock. Both are HMAC-SHA256
# under the lock's per-device key, over domain-separated messages, so a proof
# made for one purpose can never be replayed for another.
import struct

from ._hmac import hmac_sha256, compare_digest

AUTH_DOMAIN = b"lockmq-auth-v1"
COMMAND_DOMAIN = b"lockmq-cmd-v1"


def _b(sn):
    return sn.encode() if isinstance(sn, str) else bytes(sn)


def auth_proof(key, nonce, cnonce, sn):
    """The lock's answer to a CHALLENGE: HMAC(key, domain | nonce | cnonce | sn)."""
    return hmac_sha256(key, AUTH_DOMAIN + bytes(nonce) + bytes(cnonce) + _b(sn))


def command_mac(key, sn, cmd_id, expires_ms, kind, args):
    """The broker's signature on a COMMAND for lock ``sn``."""
    # args hashed in place (no concatenated copy: it may be most of a lock's free heap)
    return hmac_sha256(key, COMMAND_DOMAIN + _b(sn) + struct.pack(">IQB", cmd_id, expires_ms, kind),
                       args)


def verify_auth_proof(key, nonce, cnonce, sn, proof):
    return compare_digest(auth_proof(key, nonce, cnonce, sn), proof)


def verify_command(key, sn, command):
    """True when ``command``'s MAC was made with ``key`` for lock ``sn``."""
    return compare_digest(
        command_mac(key, sn, command.cmd_id, command.expires_ms, command.kind, command.args),
        command.mac)
