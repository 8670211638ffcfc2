"""A firmware bundle: the lock app's ``lib/`` (lockapp and the lock's protocol
modules, ``.mpy``) in one file, what an over-the-air update installs.

Format (read by the lock, ``firmware/lockapp/ota.py``; all integers big-endian)::

    b"LKB1" | u8 len, version | u16 n | n x (u8 len, path under lib/ | u32 size | bytes)

A bundle is named by its SHA-256: the signed FW_UPDATE command carries the digest,
version and size, so the lock trusts the bytes it fetched only when they hash to
the digest in the signed command (docs/firmware.md, "Updates over the air").
"""

from __future__ import annotations

import hashlib
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .build import BuildError

MAGIC = b"LKB1"
#: The lock's limit (ota.MAX_SIZE).
MAX_SIZE = 1 << 20


@dataclass(frozen=True)
class BundleInfo:
    """What a FW_UPDATE command names."""

    version: str
    size: int
    sha256: str

    def command_args(self) -> dict[str, object]:
        """The JSON object of the FW_UPDATE command's args."""
        return {"version": self.version, "size": self.size, "sha256": self.sha256}


def pack(version: str, files: dict[str, bytes]) -> bytes:
    """The bundle of ``files`` (path under lib/ -> bytes)."""
    v = version.encode()
    if not 0 < len(v) <= 32 or b" " in v or b";" in v:
        raise BuildError("a bundle version is 1..32 characters without spaces or ';'")
    out = [MAGIC, bytes([len(v)]), v, struct.pack(">H", len(files))]
    for path in sorted(files):
        p = path.encode()
        if not p or p.startswith(b"/") or b".." in p or len(p) > 255:
            raise BuildError(f"bad path in a bundle: {path!r}")
        out += [bytes([len(p)]), p, struct.pack(">I", len(files[path])), files[path]]
    data = b"".join(out)
    if len(data) > MAX_SIZE:
        raise BuildError(f"the bundle is {len(data)} bytes; a lock takes at most {MAX_SIZE}")
    return data


def unpack(data: bytes) -> tuple[str, dict[str, bytes]]:
    """(version, files) of a bundle; :class:`BuildError` if it is not one."""
    try:
        if data[:4] != MAGIC:
            raise ValueError("not a lockmq firmware bundle")
        n = data[4]
        version = data[5:5 + n].decode()
        pos = 5 + n
        (count,) = struct.unpack_from(">H", data, pos)
        pos += 2
        files = {}
        for _ in range(count):
            n = data[pos]
            path = data[pos + 1:pos + 1 + n].decode()
            pos += 1 + n
            (size,) = struct.unpack_from(">I", data, pos)
            pos += 4
            files[path] = data[pos:pos + size]
            pos += size
        if pos != len(data):
            raise ValueError("trailing bytes")
    except (ValueError, IndexError, struct.error) as e:
        raise BuildError(f"bad bundle: {e}") from None
    return version, files


def info(data: bytes) -> BundleInfo:
    """The bundle's version, size and digest."""
    version, _ = unpack(data)
    return BundleInfo(version, len(data), hashlib.sha256(data).hexdigest())


def from_lib(lib: str | Path, version: str) -> bytes:
    """A bundle of a flash folder's ``lib/``; its ``lockapp/_version`` must say ``version``."""
    root = Path(lib)
    files = {p.relative_to(root).as_posix(): p.read_bytes()
             for p in sorted(root.rglob("*")) if p.is_file()}
    if not any(k.startswith("lockapp/_version.") for k in files):
        raise BuildError(f"{root} has no lockapp/_version: not a built lib/")
    return pack(version, files)


def build_bundle(version: str, source: bool = False) -> bytes:
    """This install's app compiled (as ``lockmq firmware build`` does) and stamped ``version``."""
    from .build import write_modules

    with tempfile.TemporaryDirectory(prefix="lockmq-bundle-") as tmp:
        lib = Path(tmp) / "lib"
        write_modules(lib, source, version=version)
        return from_lib(lib, version)
