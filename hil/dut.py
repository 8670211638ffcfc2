"""The device under test: one board's UART with pytest-embedded's verbs.

Everything the board prints is appended to an in-memory buffer and to a log file
(each line prefixed with the host time, rig events as ``[hil ...]`` lines).
``expect()`` searches the buffer from a cursor and moves the cursor past the
match, so consecutive ``expect`` calls read the output in order. A timeout
raises :class:`~lockmq.hil.errors.DutTimeout` with the output seen so far.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import IO
from re import Pattern

from . import rawrepl
from .board import Board
from .errors import DutTimeout

PatternLike = str | bytes | Pattern[bytes]

#: Bytes kept in memory per DUT; older output is still in the log file.
MAX_BUFFER = 8 * 1024 * 1024
#: Characters of output attached to a failure.
TAIL_CHARS = 6000


def _compile(pattern: PatternLike) -> Pattern[bytes]:
    if isinstance(pattern, re.Pattern):
        if isinstance(pattern.pattern, str):
            return re.compile(pattern.pattern.encode(), pattern.flags & ~re.UNICODE)
        return pattern
    if isinstance(pattern, str):
        return re.compile(pattern.encode())
    return re.compile(pattern)


class Dut:
    """A device under test: write to it, expect its output, run code on it, cut its power."""

    def __init__(
        self,
        board: Board,
        name: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        default_timeout: float = 10.0,
    ) -> None:
        self.board = board
        self.name = name or board.name
        self.default_timeout = default_timeout
        self._buf = bytearray()
        self._cursor = 0
        self._dropped = 0  # bytes discarded from the front of _buf
        self._cond = threading.Condition()
        self.log_path = Path(log_path) if log_path else None
        self._log: IO[bytes] | None = open(self.log_path, "ab") if self.log_path else None
        self._line_start = True
        self._closed = False
        board.attach(self._on_output)

    # -- output -----------------------------------------------------------------
    def _on_output(self, data: bytes) -> None:
        with self._cond:
            if self._log is not None:
                self._log.write(self._stamp(data))
                self._log.flush()
            self._buf += data
            if len(self._buf) > MAX_BUFFER:  # bounded: the log file keeps everything
                cut = len(self._buf) - MAX_BUFFER // 2
                del self._buf[:cut]
                self._cursor = max(0, self._cursor - cut)
                self._dropped += cut
            self._cond.notify_all()

    def _stamp(self, data: bytes) -> bytes:
        """``data`` with the host time at the start of every line (log file only)."""
        now = time.time()
        stamp = (time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d} ").encode()
        out = bytearray()
        for piece in data.splitlines(keepends=True):
            if self._line_start:
                out += stamp
            out += piece
            self._line_start = piece.endswith(b"\n")
        return bytes(out)

    def _mark(self, text: str) -> None:
        """Write a rig event into the log file (not the expect buffer)."""
        if self._log is not None:
            with self._cond:
                prefix = b"" if self._line_start else b"\n"
                now = time.time()
                when = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
                self._log.write(prefix + f"[hil {when}] {text}\n".encode())
                self._line_start = True
                self._log.flush()

    def log_text(self) -> str:
        """All output still held in memory, decoded."""
        with self._cond:
            return bytes(self._buf).decode("utf-8", "replace")

    def log_tail(self, chars: int = TAIL_CHARS) -> str:
        """The last ``chars`` characters of output (attached to failures)."""
        return self.log_text()[-chars:]

    def pending(self) -> bytes:
        """Output not yet consumed by ``expect``."""
        with self._cond:
            return bytes(self._buf[self._cursor :])

    # -- the verbs --------------------------------------------------------------
    def write(self, data: str | bytes) -> None:
        """Send raw bytes (or text) to the board."""
        self.board.write(data.encode() if isinstance(data, str) else data)

    def writeline(self, line: str) -> None:
        """Send one line (the simulated hardware reads line commands)."""
        self.write(line.rstrip("\n") + "\n")

    def expect(self, pattern: PatternLike, timeout: float | None = None) -> re.Match[bytes]:
        """Wait for ``pattern`` (regex) in the output after the cursor; return the match."""
        rx = _compile(pattern)
        limit = self.default_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cond:
            while True:
                m = rx.search(self._buf, self._cursor)
                if m is not None:
                    self._cursor = m.end()
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    break
                self._cond.wait(min(left, 0.5))
        raise DutTimeout(
            f"{self.name}: no match for {rx.pattern!r} within {limit:g} s",
            self.name,
            self.log_tail(),
        )

    def expect_exact(self, text: str | bytes, timeout: float | None = None) -> re.Match[bytes]:
        """Wait for the literal ``text``."""
        raw = text.encode() if isinstance(text, str) else text
        return self.expect(re.compile(re.escape(raw)), timeout)

    def expect_all(
        self, patterns: list[PatternLike], timeout: float | None = None
    ) -> list[re.Match[bytes]]:
        """Wait for each pattern in order (a convenience over ``expect``)."""
        return [self.expect(p, timeout) for p in patterns]

    def skip_pending(self) -> None:
        """Forget the output received so far (expect only what comes next)."""
        with self._cond:
            self._cursor = len(self._buf)

    # -- REPL -------------------------------------------------------------------
    @property
    def board_write_delay(self) -> float:
        """Pause between code chunks (real UARTs need one, ptys do not)."""
        return float(getattr(self.board, "write_delay", 0.0))

    def exec(self, code: str, timeout: float = 10.0) -> str:
        """Stop the app, run ``code`` in the raw REPL, return its output.

        The board stays at the REPL afterwards; ``reset()`` starts the app again.
        """
        rawrepl.enter_raw(self)
        try:
            return rawrepl.exec_raw(self, code, timeout)
        finally:
            rawrepl.exit_raw(self)

    def put_file(
        self, local: str | os.PathLike[str] | bytes, remote: str, timeout: float = 10.0
    ) -> None:
        """Copy a host file (or bytes) to ``remote`` on the board through the raw REPL."""
        data = local if isinstance(local, bytes) else Path(local).read_bytes()
        self._mark(f"put_file {remote} ({len(data)} bytes)")
        rawrepl.enter_raw(self)
        try:
            rawrepl.put_file(self, data, remote, timeout)
        finally:
            rawrepl.exit_raw(self)

    def put_files(self, files: dict[str, bytes], timeout: float = 10.0) -> None:
        """Copy several files (``{remote: data}``) in one raw-REPL session."""
        self._mark(f"put_files {len(files)} files")
        rawrepl.enter_raw(self)
        try:
            for remote, data in files.items():
                rawrepl.put_file(self, data, remote, timeout)
        finally:
            rawrepl.exit_raw(self)

    def get_file(self, remote: str, timeout: float = 10.0) -> bytes:
        """Read ``remote`` from the board through the raw REPL."""
        rawrepl.enter_raw(self)
        try:
            return rawrepl.get_file(self, remote, timeout)
        finally:
            rawrepl.exit_raw(self)

    # -- power ------------------------------------------------------------------
    def reset(self) -> None:
        """Hard reset: the app starts again from ``main.py``."""
        self._mark("reset")
        self.board.reset()

    def power_cut(self, off_s: float = 0.0) -> None:
        """Cut power now (no flush, no clean-up), stay off ``off_s`` s, power on again."""
        self._mark(f"power cut (off {off_s:g} s)")
        self.board.power_cut(off_s)

    def close(self) -> None:
        """Power off and close the log."""
        if self._closed:
            return
        self.board.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> "Dut":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Dut {self.name}>"
