"""A LittleFS v2 image of a flash folder, as MicroPython's ESP32 port mounts it."""

from __future__ import annotations

import os
from pathlib import Path

from .build import SECRET_MODE, BuildError, folder_files

BLOCK_SIZE = 4096
#: The generic ESP32 4 MiB layout (MicroPython's partitions-4MiB.csv): vfs partition.
FS_OFFSET = 0x200000
FS_SIZE = 0x200000
#: MicroPython's lfs2 settings for the ESP32 block device.
READ_SIZE = 32
PROG_SIZE = 32
LOOKAHEAD = 32


def check_size(fs_size: int, block_size: int = BLOCK_SIZE) -> None:
    """Refuse a file-system size LittleFS cannot use."""
    if fs_size % block_size or fs_size < 8 * block_size:
        raise BuildError(f"fs size {fs_size} must be a multiple of {block_size} and >= 8 blocks")


def make_image(folder: str | os.PathLike[str], image: str | os.PathLike[str],
               fs_size: int = FS_SIZE, block_size: int = BLOCK_SIZE) -> Path:
    """Write a LittleFS image holding every file of ``folder``; returns its path."""
    check_size(fs_size, block_size)
    try:
        from littlefs import LittleFS, LittleFSError
    except ImportError:
        raise BuildError("littlefs-python is not installed (pip install -e '.[firmware]'), "
                         "or build with --no-image") from None

    fs = LittleFS(block_size=block_size, block_count=fs_size // block_size,
                  read_size=READ_SIZE, prog_size=PROG_SIZE, lookahead_size=LOOKAHEAD)
    root = Path(folder)
    try:
        _fill(fs, root)
    except LittleFSError as e:
        if e.code == LittleFSError.Error.LFS_ERR_NOSPC:
            raise BuildError(f"the files of {root} do not fit a {fs_size}-byte file system") from None
        raise
    out = Path(image)
    tmp = out.with_name(out.name + ".tmp")
    # the image holds config.json, i.e. the device key: owner-only, whatever the umask
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_MODE)
    try:
        os.fchmod(fd, SECRET_MODE)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(bytes(fs.context.buffer))
            f.flush()
            os.fsync(f.fileno())
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, out)
    return out


def _fill(fs, root: Path) -> None:
    for rel in folder_files(root):
        parent = ""
        for part in rel.parts[:-1]:
            parent = f"{parent}/{part}"
            try:
                fs.mkdir(parent)
            except FileExistsError:
                pass
        with fs.open("/" + rel.as_posix(), "wb") as f:
            f.write((root / rel).read_bytes())


def list_image(image: str | os.PathLike[str], block_size: int = BLOCK_SIZE) -> dict[str, bytes]:
    """Every file in an image, path -> bytes (for checks and tests)."""
    from littlefs import LittleFS

    data = Path(image).read_bytes()
    fs = LittleFS(block_size=block_size, block_count=len(data) // block_size,
                  read_size=READ_SIZE, prog_size=PROG_SIZE, lookahead_size=LOOKAHEAD, mount=False)
    fs.context.buffer[:] = data
    fs.mount()
    out: dict[str, bytes] = {}
    for root, _dirs, files in fs.walk("/"):
        for name in files:
            path = f"{root.rstrip('/')}/{name}"
            with fs.open(path, "rb") as f:
                out[path] = f.read()
    return out
