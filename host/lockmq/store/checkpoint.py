"""The ``checkpoint`` file: where recovery may start.

It says: every commit-log byte before ``log_end`` is durable, every topic index
holds (durably) all its entries below the listed queue end, and the dedup table
below is the state after exactly the records before ``log_end``. Written with
an atomic replace; a checkpoint that fails its CRC is ignored (full rebuild).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from .files import atomic_write, read_file, seal, unseal
from .names import CHECKPOINT

MAGIC = b"LMQC"
VERSION = 1
_HEAD = struct.Struct("<4sHHQQII")  # magic, version, reserved, log_end, created_us, n_topics, dedup_len
_TOPIC = struct.Struct("<BQ")  # topic length, queue end (topic follows)


@dataclass
class Checkpoint:
    """Contents of the checkpoint file."""

    log_end: int
    created_us: int
    queue_ends: dict[str, int] = field(default_factory=dict)
    dedup: bytes = b""


def encode(cp: Checkpoint) -> bytes:
    """Serialise a checkpoint (with trailing CRC)."""
    parts = [_HEAD.pack(MAGIC, VERSION, 0, cp.log_end, cp.created_us,
                        len(cp.queue_ends), len(cp.dedup))]
    for topic, end in cp.queue_ends.items():
        tb = topic.encode("ascii")
        parts.append(_TOPIC.pack(len(tb), end))
        parts.append(tb)
    parts.append(cp.dedup)
    return seal(b"".join(parts))


def decode(blob: bytes) -> Checkpoint | None:
    """Parse a checkpoint; None if it is damaged or of another version."""
    data = unseal(blob)
    if data is None or len(data) < _HEAD.size:
        return None
    magic, ver, _res, log_end, created, ntop, dlen = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or ver != VERSION:
        return None
    pos = _HEAD.size
    ends = {}
    try:
        for _ in range(ntop):
            tlen, end = _TOPIC.unpack_from(data, pos)
            pos += _TOPIC.size
            ends[data[pos:pos + tlen].decode("ascii")] = end
            pos += tlen
    except (struct.error, UnicodeDecodeError):
        return None
    if pos + dlen != len(data):
        return None
    return Checkpoint(log_end, created, ends, bytes(data[pos:]))


def load(data_dir: str) -> Checkpoint | None:
    """Read the checkpoint of ``data_dir`` (None if missing or damaged)."""
    blob = read_file(os.path.join(data_dir, CHECKPOINT))
    return None if blob is None else decode(blob)


def save(data_dir: str, cp: Checkpoint) -> None:
    """Write the checkpoint durably (atomic replace)."""
    atomic_write(os.path.join(data_dir, CHECKPOINT), encode(cp))
