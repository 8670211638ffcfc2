"""A board emulated by QEMU, its UART on a pty opened through the serial path.

Two machines are known:

* ``esp32`` — Espressif's fork, ``qemu-system-xtensa -nographic -machine esp32
  -drive file=<flash.bin>,if=mtd,format=raw`` (what pytest-embedded's QEMU service
  runs); the flash image holds MicroPython and the app's file system, and QEMU
  writes to it, so a power cut (killing QEMU) keeps what the app wrote.
* ``microbit`` — Debian's ``qemu-system-arm -M microbit`` with the
  ``firmware-microbit-micropython`` image: MicroPython 1.9.2 with a serial REPL (no
  file system, no network). It exercises this plumbing where Espressif's QEMU is
  not installed.

QEMU is started with ``-serial pty``; the pty path it announces is opened with
:class:`~lockmq.hil.serial_board.SerialBoard`, so the bytes take the same path as
a real board's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from .board import Board, Sink
from .serial_board import SerialBoard

MICROBIT_HEX = "/usr/share/firmware-microbit-micropython/firmware.hex"
PTY_LINE = re.compile(rb"char device redirected to (/dev/pts/\d+)")


def qemu_argv(qemu: str, machine: str, image: str) -> list[str]:
    """The QEMU command line for ``machine`` booting ``image``, UART on a new pty."""
    if machine == "esp32":
        return [qemu, "-nographic", "-monitor", "none", "-machine", "esp32",
                "-drive", f"file={image},if=mtd,format=raw", "-serial", "pty"]
    if machine == "microbit":
        return [qemu, "-M", "microbit", "-display", "none", "-monitor", "none",
                "-device", f"loader,file={image}", "-serial", "pty"]
    raise ValueError(f"unknown QEMU machine {machine!r} (esp32 or microbit)")


def find_qemu(machine: str, path: str | None = None) -> str | None:
    """The QEMU binary for ``machine``: ``path`` if given, else the usual name on PATH."""
    if path:
        return path if os.access(path, os.X_OK) else shutil.which(path)
    if machine == "esp32":
        return None  # Espressif's fork must be given explicitly (--hil-qemu-path)
    return shutil.which("qemu-system-arm")


class QemuBoard(Board):
    """One QEMU process; power cut and reset restart it on the same flash image."""

    def __init__(self, qemu: str, machine: str, image: str, name: str | None = None,
                 boot_timeout: float = 30.0) -> None:
        self.qemu = qemu
        self.machine = machine
        self.image = str(Path(image))
        self.name = name or f"qemu-{machine}"
        self.boot_timeout = boot_timeout
        self.write_delay = 0.002  # an emulated UART has a small receive FIFO
        self._proc: subprocess.Popen[bytes] | None = None
        self._serial: SerialBoard | None = None
        self._sink: Sink | None = None
        self._stderr = bytearray()

    def _start(self) -> None:
        assert self._sink is not None
        self._stderr = bytearray()
        self._proc = subprocess.Popen(
            qemu_argv(self.qemu, self.machine, self.image),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        path = self._wait_for_pty()
        self._serial = SerialBoard(path, name=self.name, reset_mode="repl", write_delay=self.write_delay)
        self._serial.attach(self._sink)
        threading.Thread(target=self._drain, args=(self._proc,), daemon=True).start()

    def _wait_for_pty(self) -> str:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.boot_timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            self._stderr += line
            m = PTY_LINE.search(line)
            if m:
                return m.group(1).decode()
        self._stop()
        raise RuntimeError(f"{self.name}: QEMU did not open a serial pty: {bytes(self._stderr).decode(errors='replace')}")

    @staticmethod
    def _drain(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            pass

    def _stop(self) -> None:
        if self._serial is not None:
            self._serial.close()
            self._serial = None
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(10)
            self._proc = None

    def attach(self, sink: Sink) -> None:
        self._sink = sink
        self._start()

    def write(self, data: bytes) -> None:
        if self._serial is None:
            raise RuntimeError(f"{self.name} is off")
        self._serial.write(data)

    def reset(self) -> None:
        self.power_cut(0.0)

    def power_cut(self, off_s: float = 0.0) -> None:
        self._stop()
        if off_s > 0:
            time.sleep(off_s)
        self._start()

    def close(self) -> None:
        self._stop()
