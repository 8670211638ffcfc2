# HMAC-SHA256 (RFC 2104) over hashlib.sha256: MicroPython has sha256 but no hmac
# module, so both sides use this one, and the shared vectors check it against
# RFC 4231.
import hashlib

_BLOCK = 64


def _xor(key, pad):
    return bytes([b ^ pad for b in key])


def hmac_pads(key):
    """``(inner, outer)``: the 64-byte blocks every HMAC-SHA256 under ``key`` starts
    from (the key, hashed first when longer than a block, zero-padded, XORed with 0x36
    and 0x5C). A session makes its key's once (frame MACs: _mac.py)."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key + bytes(_BLOCK - len(key))
    return _xor(key, 0x36), _xor(key, 0x5C)


def hmac_padded(pads, msg, *more):
    """:func:`hmac_sha256` under the key whose :func:`hmac_pads` are ``pads``."""
    inner = hashlib.sha256(pads[0])
    inner.update(msg)
    for part in more:
        inner.update(part)
    outer = hashlib.sha256(pads[1])
    outer.update(inner.digest())
    return outer.digest()


def hmac_sha256(key, msg, *more):
    """HMAC-SHA256 of ``msg`` (then each of ``more``, as if concatenated) under
    ``key``; returns 32 bytes. Parts are hashed in place: a lock verifying a 4 KiB
    command must not need another contiguous copy of it."""
    return hmac_padded(hmac_pads(key), msg, *more)


def compare_digest(a, b):
    """Constant-time equality of two byte strings."""
    if len(a) != len(b):
        return False
    diff = 0
    for i in range(len(a)):
        diff |= a[i] ^ b[i]
    return diff == 0
