"""Fixtures for the firmware tests: a compiled flash folder, a running lock
(the real firmware in the MicroPython unix port, stdin/stdout on pipes), and a
helper to run MicroPython scripts against the shipped .mpy artifacts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lockmq.firmware_tools.build import DeviceConfig, build_folder

MICROPYTHON = str(Path(sys.executable).with_name("micropython"))
SN = "LOCK0001"
KEY = bytes(range(32))
# The 64-bit unix port with the app as .mpy in lib/: objects about twice an ESP32's and
# the code itself on the heap. The shared protocol session (v0.2) added ~4 KiB here, which
# left no room for a TLS handshake at 128K; the ESP32 figure (32-bit, app frozen into
# flash) is what bench/bench_firmware.py and docs/firmware.md report.
HEAP = "144K"


def micropython_env(lib: Path, home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "MICROPYPATH": f"{lib}:.frozen"}


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """One compiled flash folder (no state), the template every test copies."""
    if not Path(MICROPYTHON).exists():
        pytest.skip("the MicroPython unix port is not installed")
    out = tmp_path_factory.mktemp("fw") / "flash"
    build_folder(out, DeviceConfig(sn=SN, key=KEY.hex(), brokers=[("127.0.0.1", 9)], hw="sim"),
                 cards=["0A1B2C3D"])
    return out


@pytest.fixture
def flash(built, tmp_path) -> Path:
    """A fresh board: a copy of the template folder."""
    dst = tmp_path / "board"
    shutil.copytree(built, dst)
    return dst


def set_config(folder: Path, **changes) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


class Lock:
    """The firmware running in a flash folder; its log lines are collected."""

    def __init__(self, folder: Path, heap: str = HEAP) -> None:
        self.folder = folder
        self.heap = heap
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._pos = 0
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        home = self.folder.parent / "home"
        home.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [MICROPYTHON, "-X", f"heapsize={self.heap}", "main.py"], cwd=self.folder,
            env=micropython_env(Path("lib"), home), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, pattern: str, timeout: float = 10.0) -> re.Match:
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
        with self._cond:
            return "\n".join(self.lines[-80:])

    def grep(self, pattern: str) -> list[re.Match]:
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


@pytest.fixture
def lock_factory():
    made: list[Lock] = []

    def make(folder: Path, heap: str = HEAP) -> Lock:
        lk = Lock(folder, heap)
        made.append(lk)
        return lk
    yield make
    for lk in made:
        lk.close()


def run_mpy(script: str, cwd: Path, lib: Path, heap: str = "256K", timeout: float = 60) -> str:
    """Run a MicroPython script (text) in ``cwd`` with ``lib`` on the path; return stdout.
    A non-zero exit raises with the output."""
    home = cwd / ".home"
    home.mkdir(exist_ok=True)
    path = cwd / "_t.py"
    path.write_text(script)
    proc = subprocess.run([MICROPYTHON, "-X", f"heapsize={heap}", str(path)], cwd=cwd,
                          env=micropython_env(lib, home), capture_output=True, timeout=timeout)
    out = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"micropython exited {proc.returncode}:\n{out}{proc.stderr.decode()}")
    return out
