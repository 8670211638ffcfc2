"""Small durable-file helpers: atomic replace, checksummed blobs, directory fsync,
and the modes of everything the store writes (file names: :mod:`.names`).

Modes (issue 10 item 15: the commit log was 0644, and lock events carry card ids):
the data directory and ``message.log/`` are ``DIR_MODE`` (0700), every file the
store creates is ``FILE_MODE`` (0600) -- set with ``fchmod``/``chmod`` after
creating, so the umask can neither loosen nor change them. :func:`secure_data_dir`
tightens a data directory left looser by an older version when the store opens.
"""

from __future__ import annotations

import os
import stat
import struct
import zlib

#: Mode of every file the store creates (commit log, indexes, positions, checkpoint).
FILE_MODE = 0o600
#: Mode of the data directory and of the directories the store creates in it.
DIR_MODE = 0o700

_CRC = struct.Struct("<I")


def create_file(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` with the store's :data:`FILE_MODE`, set
    explicitly (whatever the umask, and also on a file that already existed)."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(path: str) -> None:
    """Create ``path`` (and parents) if missing; ``path`` itself gets :data:`DIR_MODE`."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    if stat.S_IMODE(os.stat(path).st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


def secure_data_dir(data_dir: str) -> list[tuple[str, int]]:
    """Create ``data_dir`` with :data:`DIR_MODE`, or tighten an existing one: the
    directory and its subdirectories to ``DIR_MODE``, every file in them with any
    group/other bit or an execute bit to :data:`FILE_MODE`. Symlinks are left alone
    (never followed). Returns ``(path, old mode)`` of what changed, for the log."""
    changed: list[tuple[str, int]] = []
    existed = os.path.isdir(data_dir)
    make_dir(data_dir)
    if not existed:
        return changed
    todo = [data_dir]
    while todo:
        d = todo.pop()
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue
        if stat.S_IMODE(st.st_mode) != DIR_MODE:
            changed.append((d, stat.S_IMODE(st.st_mode)))
            os.chmod(d, DIR_MODE)
        with os.scandir(d) as it:
            for e in it:
                if e.is_symlink():
                    continue
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    mode = stat.S_IMODE(e.stat(follow_symlinks=False).st_mode)
                    if mode & ~FILE_MODE:
                        changed.append((e.path, mode))
                        os.chmod(e.path, FILE_MODE)
    return changed


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
    fd = create_file(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:   # no half-written debris (a full disk: the next try starts clean)
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_file(path: str) -> bytes | None:
    """The whole file, or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
