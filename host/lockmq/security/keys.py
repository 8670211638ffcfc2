"""Key material: device secrets, the master key that wraps them, the auth proofs.

HMAC here is the standard HMAC-SHA256 (RFC 2104): the standard library's (the
reference) or, when the compiled core runs, RustCrypto's through ``lockmq._core`` (two
a handshake: a storm's AUTH spent ~8 % of the loop in ``hmac.new``); the protocol
package carries a pure-Python copy for MicroPython and the shared test vectors prove
they agree.

Device keys are stored wrapped (AES-256-GCM under a master key read from a file,
the SN as associated data), so a copy of the registry alone reveals no key and a
wrapped key cannot be moved to another SN.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets

from lockmq import accel

AUTH_LABEL = b"lockmq-auth-v2"
SESSION_LABEL = b"lockmq-session-v2"
KEY_BYTES = 32
NONCE_BYTES = 16
_WRAP_VERSION = b"\x01"


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    """HMAC-SHA256 of ``msg`` under ``key`` (32 bytes)."""
    return hmac.new(key, msg, hashlib.sha256).digest()


#: the standard library's, kept as the reference (tests hold the core to it)
py_hmac_sha256 = hmac_sha256
if accel.speedups is not None:   # (the choice of the whole process: lockmq.accel)
    hmac_sha256 = accel.speedups.hmac_sha256  # noqa: F811


def new_device_key() -> bytes:
    """A fresh 256-bit device secret from the OS CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


def new_nonce() -> bytes:
    """A fresh 16-byte random nonce (a challenge's), straight from the OS CSPRNG.

    Drawing nonces in bulk was tried for the storm and not kept: one ``getrandom``
    costs ~0.34 µs here against ~0.29 µs for a cut of a bulk draw, not worth a
    lock, a buffer of future nonces in memory and a fork hook."""
    return secrets.token_bytes(NONCE_BYTES)


def sn_bytes(sn: str | bytes) -> bytes:
    """The SN as it goes into MACs (ASCII bytes)."""
    return sn if isinstance(sn, bytes) else sn.encode("ascii")


def _bound(label: bytes, nonce: bytes, cnonce: bytes, sn: str | bytes,
           transcript: bytes) -> bytes:
    snb = sn_bytes(sn)
    return label + bytes(nonce) + bytes(cnonce) + bytes((len(snb),)) + snb + bytes(transcript)


def device_proof(key: bytes, nonce: bytes, cnonce: bytes, sn: str | bytes,
                 transcript: bytes) -> bytes:
    """The lock's answer to a challenge: HMAC(key, "lockmq-auth-v2" | nonce | cnonce |
    sn_len | sn | transcript), the transcript being the handshake's hash
    (``lockmq.protocol.transcript_hash``; SPEC 2 "The session transcript")."""
    return hmac_sha256(key, _bound(AUTH_LABEL, nonce, cnonce, sn, transcript))


def session_key(key: bytes, nonce: bytes, cnonce: bytes, sn: str | bytes,
                transcript: bytes) -> bytes:
    """The frame-MAC key of one session, bound to its transcript like the proof."""
    return hmac_sha256(key, _bound(SESSION_LABEL, nonce, cnonce, sn, transcript))


def equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a, b)


def token_hash(secret: str) -> bytes:
    """What the registry stores of a token: SHA-256 of its secret part.

    Token secrets are 256 random bits, so a fast hash is enough (no password KDF).
    """
    return hashlib.sha256(secret.encode("utf-8")).digest()


def load_or_create_master_key(path: str) -> bytes:
    """Read the 32-byte master key at ``path``; create it (mode 0600) if missing.

    Raises ``ValueError`` if the file exists with a wrong size or is readable by
    group/others (a leaked master key defeats the wrapping).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise ValueError(f"master key {path} is readable by group/others "
                             f"(mode {st.st_mode & 0o777:o}); chmod 600 it") from None
        with open(path, "rb") as fh:
            key = fh.read()
        if len(key) != KEY_BYTES:
            raise ValueError(f"master key {path} must be {KEY_BYTES} bytes, not {len(key)}")
        return key
    key = secrets.token_bytes(KEY_BYTES)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


@functools.lru_cache(maxsize=4)
def _aead(master: bytes):  # type: ignore[no-untyped-def]
    """The AES-GCM cipher of ``master``, built once per master key (~1.8 µs per AUTH
    otherwise); it keeps no state between calls, so one object serves every unwrap.
    A broker holds one master key (a rotation: two), so the cache stays tiny."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - dependency missing
        raise RuntimeError("the device registry needs the 'cryptography' package: "
                           "pip install 'lockmq[security]'") from exc
    return AESGCM(master)


def wrap_key(master: bytes, sn: str, key: bytes) -> bytes:
    """Encrypt a device key for storage: version | 12-byte nonce | AES-GCM(key)."""
    iv = secrets.token_bytes(12)
    aad = b"lockmq-device:" + sn_bytes(sn)
    return _WRAP_VERSION + iv + _aead(bytes(master)).encrypt(iv, key, aad)


def unwrap_key(master: bytes, sn: str, blob: bytes) -> bytes:
    """Decrypt a stored device key; ``ValueError`` if it was altered or moved."""
    if len(blob) < 13 or blob[:1] != _WRAP_VERSION:
        raise ValueError("unknown wrapped-key format")
    try:
        return _aead(bytes(master)).decrypt(blob[1:13], blob[13:], b"lockmq-device:" + sn_bytes(sn))
    except Exception as exc:  # cryptography.exceptions.InvalidTag
        raise ValueError(f"wrapped key of {sn} does not decrypt under this master key") from exc


def read_master_key(path: str) -> bytes | None:
    """The master key at ``path`` (checked as :func:`load_or_create_master_key` does),
    or None if there is no file: never creates one."""
    if not os.path.exists(path):
        return None
    return load_or_create_master_key(path)


def master_key_fingerprint(master: bytes | None) -> str:
    """A name for a master key that reveals nothing of it (HMAC of a fixed label),
    so a standby can check it holds the primary's key; "" for no key."""
    if master is None:
        return ""
    return hmac_sha256(master, b"lockmq-master-key-fingerprint-v1").hex()[:32]
