"""Write MicroPython and the app's file system to an ESP32 with esptool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .build import BuildError
from .lfsimage import FS_OFFSET, FS_SIZE

#: Where MicroPython's generic ESP32 image (bootloader included) goes.
FW_OFFSET = 0x1000


def esptool_argv(port: str, firmware: str | None, fs_image: str | None, *,
                 fw_offset: int = FW_OFFSET, fs_offset: int = FS_OFFSET, baud: int = 460800,
                 chip: str = "esp32", before: str | None = None, after: str | None = None,
                 no_stub: bool | None = None, compress: bool = True) -> list[str]:
    """The esptool command line that writes ``firmware`` and/or ``fs_image``.

    A ``socket://`` or ``rfc2217://`` port has no reset lines and usually no flasher
    stub behind it: unless told otherwise, those get ``--before no-reset --after
    no-reset --no-stub``.
    """
    if firmware is None and fs_image is None:
        raise BuildError("nothing to flash: give --firmware and/or a file-system image")
    for label, path in (("firmware", firmware), ("file-system image", fs_image)):
        if path is not None and not Path(path).is_file():
            raise BuildError(f"{label} {path} does not exist")
    if fs_image is not None and Path(fs_image).stat().st_size > FS_SIZE and fs_offset == FS_OFFSET:
        raise BuildError(f"{fs_image} is larger than the vfs partition ({FS_SIZE:#x} bytes)")
    if firmware is not None and fs_image is not None:
        fw_end = fw_offset + Path(firmware).stat().st_size
        if fw_offset < fs_offset < fw_end:
            raise BuildError(f"{firmware} ends at {fw_end:#x}, past the file system at {fs_offset:#x}")
    network = "://" in port
    before = before or ("no-reset" if network else "default-reset")
    after = after or ("no-reset" if network else "hard-reset")
    if no_stub is None:
        no_stub = network
    argv = [sys.executable, "-m", "esptool", "--chip", chip, "--port", port, "--baud", str(baud),
            "--before", before, "--after", after]
    if no_stub:
        argv.append("--no-stub")
    argv += ["write-flash", "--flash-size", "keep"]
    argv.append("--compress" if compress else "--no-compress")
    if firmware is not None:
        argv += [hex(fw_offset), str(firmware)]
    if fs_image is not None:
        argv += [hex(fs_offset), str(fs_image)]
    return argv


def flash(port: str, firmware: str | None, fs_image: str | None, **kw) -> int:
    """Run esptool; returns its exit status (its output goes to ours)."""
    return subprocess.call(esptool_argv(port, firmware, fs_image, **kw))
