"""A child process attached to a fresh pseudo-terminal, as a board's UART.

The child gets the pty slave as stdin/stdout/stderr *and as its controlling
terminal*, so a Ctrl-C byte written to the master becomes SIGINT in the child
(a KeyboardInterrupt in MicroPython), exactly as on a board's REPL. Local echo
is switched off so that commands written to the simulated hardware do not show
up in the captured log.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import termios
import threading
from typing import Callable, Mapping, Sequence

Sink = Callable[[bytes], None]


def open_pty(echo: bool = False) -> tuple[int, int]:
    """Open a pty pair; return ``(master_fd, slave_fd)`` with echo set as asked."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    if echo:
        attrs[3] |= termios.ECHO
    else:
        attrs[3] &= ~termios.ECHO
    attrs[1] &= ~termios.ONLCR  # bytes pass as the board wrote them: no \n -> \r\n
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def _take_controlling_tty() -> None:  # runs in the child, after setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtyProcess:
    """One process on one pty; its output is pushed to ``sink`` from a thread.

    ``on_exit(returncode)`` is called from the reader thread once the child has
    gone and all of its output has been delivered.
    """

    def __init__(
        self,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        sink: Sink,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self._sink = sink
        self._on_exit = on_exit
        self._master, slave = open_pty()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=cwd,
                env=dict(env),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=_take_controlling_tty,
                close_fds=True,
            )
        except BaseException:
            os.close(self._master)
            raise
        finally:
            os.close(slave)
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._read_loop, name=f"pty-{self.proc.pid}", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def _read_loop(self) -> None:
        while True:
            try:
                data = os.read(self._master, 4096)
            except OSError as exc:  # EIO: every slave end is closed
                if exc.errno not in (errno.EIO, errno.EBADF):
                    raise
                break
            if not data:
                break
            self._sink(data)
        rc = self.proc.wait()
        with self._write_lock:
            os.close(self._master)
            self._master = -1
        if self._on_exit is not None:
            self._on_exit(rc)

    def write(self, data: bytes) -> None:
        """Write bytes to the child's terminal (its stdin)."""
        with self._write_lock:
            view = memoryview(data)
            while view and self._master >= 0:
                try:
                    n = os.write(self._master, view)
                except OSError as exc:
                    if exc.errno in (errno.EIO, errno.EBADF):
                        return  # the child is gone: bytes to a dead board are lost
                    raise
                view = view[n:]

    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the child's whole session (no clean-up runs on SIGKILL)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the child to end and its output to be drained."""
        rc = self.proc.wait(timeout)
        self._reader.join(timeout)
        return rc
