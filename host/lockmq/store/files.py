"""Small durable-file helpers: segment naming, atomic replace, checksummed blobs."""

from __future__ import annotations

import os
import struct
import zlib

SEGMENT_DIR = "message.log"
SEGMENT_SUFFIX = ".log"
QSTART_SUFFIX = ".qstart"
_CRC = struct.Struct("<I")


def segment_name(base: int) -> str:
    """File name of the segment starting at commit-log offset ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


def qstart_name(base: int) -> str:
    """File name of the queue-start sidecar of the segment at ``base``."""
    return f"{base:020d}{QSTART_SUFFIX}"


def list_segments(seg_dir: str) -> list[int]:
    """Sorted base offsets of the segment files in ``seg_dir``."""
    bases = []
    for name in os.listdir(seg_dir):
        stem, ext = os.path.splitext(name)
        if ext == SEGMENT_SUFFIX and len(stem) == 20 and stem.isdigit():
            bases.append(int(stem))
    bases.sort()
    return bases


def fsync_dir(path: str) -> None:
    """fsync a directory so that created, renamed or removed names are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(data: bytes) -> bytes:
    """``data`` followed by its CRC-32 (little-endian)."""
    return data + _CRC.pack(zlib.crc32(data))


def unseal(blob: bytes) -> bytes | None:
    """Inverse of :func:`seal`: the data, or None if the CRC does not match."""
    if len(blob) < 4:
        return None
    data, crc = blob[:-4], _CRC.unpack_from(blob, len(blob) - 4)[0]
    return data if zlib.crc32(data) == crc else None


def atomic_write(path: str, data: bytes, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new
    content, never a mix: write a temp file, fsync, rename, fsync the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_file(path: str) -> bytes | None:
    """The whole file, or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
