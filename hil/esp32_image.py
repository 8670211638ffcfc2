"""The 4 MiB flash image Espressif's QEMU boots: MicroPython plus the app's file system.

Layout of MicroPython's generic ESP32 build (partitions-4MiB.csv), as documented
in firmware/README.md: the firmware image at ``0x1000``, the ``vfs`` partition
(LittleFS v2, 4096-byte blocks) at ``0x200000``, ``0x200000`` bytes long.
"""

from __future__ import annotations

from pathlib import Path

FLASH_SIZE = 4 * 1024 * 1024
FW_OFFSET = 0x1000
FS_OFFSET = 0x200000
FS_SIZE = 0x200000
BLOCK = 4096


def littlefs_image(folder: Path, size: int = FS_SIZE) -> bytes:
    """A LittleFS v2 image holding every file under ``folder``."""
    from littlefs import LittleFS

    fs = LittleFS(block_size=BLOCK, block_count=size // BLOCK)
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_dir():
            fs.makedirs(rel, exist_ok=True)
        else:
            with fs.open(rel, "wb") as fh:
                fh.write(path.read_bytes())
    return bytes(fs.context.buffer)


def build_flash_image(firmware_bin: str, flash_dir: Path | None, out: Path | None = None) -> Path:
    """Write ``flash.bin`` (next to ``flash_dir`` unless ``out``) and return its path."""
    fw = Path(firmware_bin).read_bytes()
    if FW_OFFSET + len(fw) > FS_OFFSET:
        raise ValueError(f"{firmware_bin} ({len(fw)} bytes) overlaps the file system at {FS_OFFSET:#x}")
    image = bytearray(b"\xff" * FLASH_SIZE)
    image[FW_OFFSET : FW_OFFSET + len(fw)] = fw
    if flash_dir is not None:
        lfs = Path(str(flash_dir) + ".lfs")
        fs = lfs.read_bytes() if lfs.exists() else littlefs_image(Path(flash_dir))
        image[FS_OFFSET : FS_OFFSET + len(fs)] = fs[:FS_SIZE]
    target = out or (Path(flash_dir).parent if flash_dir else Path(firmware_bin).parent) / "flash.bin"
    target.write_bytes(bytes(image))
    return target
