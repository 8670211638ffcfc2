"""A board on a serial port, opened with pyserial's ``serial_for_url``.

So ``/dev/ttyUSB0``, ``/dev/pts/7``, ``socket://127.0.0.1:7000`` and
``rfc2217://host:port`` all work, as in pytest-embedded's serial service.

Reset: on a USB-UART (``/dev/ttyUSB*``, ``/dev/ttyACM*``) or an RFC 2217 server
(which carries the modem lines) the ESP32 dev-board wiring is used — RTS low pulls EN low, a chip reset, with DTR high so the chip
boots the app rather than the ROM loader (esptool's "hard reset"). Elsewhere the
board is soft-rebooted through its REPL (Ctrl-C, Ctrl-B, Ctrl-D), which reruns
``main.py`` on MicroPython.

Power cut: a shell command given by the test engineer (``--hil-power-cut-cmd``, e.g.
a USB hub port or relay switched by ``uhubctl``) runs with ``{off}`` replaced by
the off time; without one, the RTS chip reset stands in where wired, and
``can_power_cut`` is False otherwise (power-cut scenarios then skip).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
import time

try:
    import serial
except ImportError:  # no firmware extra: the rest of lockmq.hil works without pyserial
    serial = None

from .board import Board, Sink

#: Why a serial board cannot be made here, or None when pyserial is installed.
MISSING_PYSERIAL: str | None = (
    "the serial target needs pyserial: pip install 'lockmq[firmware]'" if serial is None else None)

#: Ports whose RTS line reaches the board's EN pin (USB-UARTs, RFC 2217 servers).
RTS_WIRED = re.compile(r"^/dev/tty(USB|ACM)\d+$|^COM\d+$|^rfc2217://")


class SerialBoard(Board):
    """A MicroPython board reached through a pyserial URL."""

    def __init__(
        self,
        url: str,
        baudrate: int = 115200,
        name: str | None = None,
        reset_mode: str = "auto",
        power_cut_cmd: str | None = None,
        write_delay: float | None = None,
    ) -> None:
        if MISSING_PYSERIAL:
            raise ModuleNotFoundError(MISSING_PYSERIAL, name="serial")
        self.url = url
        self.baudrate = baudrate
        self.name = name or f"serial:{url}"
        if reset_mode == "auto":
            reset_mode = "rts" if RTS_WIRED.match(url) else "repl"
        if reset_mode not in ("rts", "repl"):
            raise ValueError(f"reset_mode must be auto, rts or repl, not {reset_mode!r}")
        self.reset_mode = reset_mode
        self.power_cut_cmd = power_cut_cmd
        self.can_power_cut = bool(power_cut_cmd) or reset_mode == "rts"
        # A real UART loses bytes if code is pushed too fast; sockets and ptys do not.
        self.write_delay = (0.01 if reset_mode == "rts" else 0.0) if write_delay is None else write_delay
        self._ser: serial.SerialBase | None = None
        self._sink: Sink | None = None
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self._wlock = threading.Lock()

    def attach(self, sink: Sink) -> None:
        self._sink = sink
        ser = serial.serial_for_url(self.url, baudrate=self.baudrate, timeout=0.05, do_not_open=True)
        if self.reset_mode == "rts":
            # Open with EN released and IO0 high, or opening the port resets the board.
            ser.rts = False
            ser.dtr = False
        ser.open()
        self._ser = ser
        self._reader = threading.Thread(target=self._read_loop, name=f"serial-{self.url}", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        ser = self._ser
        assert ser is not None
        while not self._stop.is_set():
            try:
                data = ser.read(max(1, ser.in_waiting))
            except (serial.SerialException, OSError, TypeError, AttributeError):
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # a board mid-reset or a socket hiccup: keep listening
                continue
            if data and self._sink is not None:
                self._sink(data)

    def write(self, data: bytes) -> None:
        ser = self._ser
        if ser is None:
            raise RuntimeError(f"{self.name} is not open")
        with self._wlock:
            ser.write(data)
            ser.flush()

    def reset(self) -> None:
        if self.reset_mode == "rts":
            self._rts_reset()
        else:
            self._repl_soft_reset()

    def _rts_reset(self) -> None:
        ser = self._ser
        assert ser is not None
        ser.dtr = False  # IO0 high: boot the app, not the ROM loader
        ser.rts = True  # EN low: chip in reset
        time.sleep(0.1)
        ser.rts = False

    def _repl_soft_reset(self) -> None:
        # Stop the app, go to the friendly REPL, soft-reboot (which reruns main.py).
        # The pauses let the REPL come up: it discards input typed before it starts.
        self.write(b"\r\x03\x03")
        time.sleep(0.3)
        self.write(b"\r\x02")
        time.sleep(0.2)
        self.write(b"\x04")

    def power_cut(self, off_s: float = 0.0) -> None:
        if self.power_cut_cmd:
            cmd = self.power_cut_cmd.replace("{off}", f"{off_s:g}")
            subprocess.run(shlex.split(cmd), check=True, timeout=60)
        elif self.reset_mode == "rts":
            ser = self._ser
            assert ser is not None
            ser.dtr = False
            ser.rts = True
            time.sleep(max(off_s, 0.1))
            ser.rts = False
        else:
            raise NotImplementedError(
                f"{self.name}: no way to cut power (give --hil-power-cut-cmd or use a USB-UART)"
            )

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join(2)
        if self._ser is not None:
            self._ser.close()
            self._ser = None
