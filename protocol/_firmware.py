# Firmware bundles fetched over the lock's own link (SPEC "Firmware bundles").
# A FW_UPDATE command names a bundle released to the broker by its SHA-256; the lock
# asks for it piece by piece, each piece fitting the frame limit it stated, from the
# offset it already holds on flash (a download resumes after a power cut):
#   FW_FETCH  lock -> broker: sha256 (32 bytes) | offset u32 | max_len u16
#   FW_CHUNK  broker -> lock (RESPONSE): offset u32 | total u32 | data (the rest)
# A bundle the broker does not hold is answered with ERROR INVALID_ARGUMENT.
# Shared by the lock (MicroPython) and the broker; the bundle's own format is the
# lock's and the release tool's (firmware/lockapp/ota.py, lockmq.firmware_tools.bundle).
import struct

from ._codec import Reader
from ._errors import LocalProtocolError

DIGEST_SIZE = 32


def fetch_body(digest, offset, max_len):
    """FW_FETCH: which bundle, from where, at most how many bytes."""
    if len(digest) != DIGEST_SIZE:
        raise LocalProtocolError("a bundle digest is %d bytes" % DIGEST_SIZE)
    return bytes(digest) + struct.pack(">IH", offset, max_len)


def fetch_fields(body):
    """FW_FETCH -> (digest, offset, max_len)."""
    r = Reader(body, "FW_FETCH")
    digest = bytes(r.take(DIGEST_SIZE))
    offset, max_len = r.unpack(">IH", 6)
    r.end()
    return digest, offset, max_len


def chunk_body(offset, total, data):
    """FW_CHUNK: ``data`` is the bundle's bytes from ``offset`` (of ``total``)."""
    return struct.pack(">II", offset, total) + data


def chunk_fields(body):
    """FW_CHUNK -> (offset, total, data: a view of the body, no copy)."""
    r = Reader(body, "FW_CHUNK")
    offset, total = r.unpack(">II", 8)
    return offset, total, memoryview(body)[8:]
