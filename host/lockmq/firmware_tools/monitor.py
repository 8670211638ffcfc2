"""Show a board's log (its UART), optionally until a line matches."""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

import serial


def monitor(port: str, *, baud: int = 115200, until: str | None = None,
            timeout: float | None = None, send: list[str] | None = None,
            out: TextIO = sys.stdout) -> int:
    """Print the board's lines to ``out``.

    Returns 0 when ``until`` (a regex) matched a line, 1 when ``timeout`` seconds
    passed first, 0 on Ctrl-C or end of stream when no ``until`` was given.
    ``send`` lines are written to the board first (simulated-hardware commands).
    """
    rx = re.compile(until) if until else None
    end = None if timeout is None else time.monotonic() + timeout
    with serial.serial_for_url(port, baudrate=baud, timeout=0.2) as ser:
        for line in send or []:
            ser.write(line.encode() + b"\r\n")
        buf = b""
        while end is None or time.monotonic() < end:
            data = ser.read(4096)
            if not data:
                continue
            buf += data
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode(errors="replace").rstrip("\r")
                out.write(line + "\n")
                out.flush()
                if rx is not None and rx.search(line):
                    return 0
    return 1 if rx is not None else 0
