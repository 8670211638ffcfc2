"""Serve a virtual board on a serial-like port: a pty (with a stable link) or TCP.

    python -m lockmq.hil.vboard FLASH_DIR --pty /tmp/lock1.tty
    python -m lockmq.hil.vboard FLASH_DIR --tcp 7000      # socket://127.0.0.1:7000

The board behaves like a MicroPython board on a UART: ``mpremote connect
/tmp/lock1.tty ...`` works unmodified (soft reboots respawn the interpreter), and
so does the rig's ``--target serial:/tmp/lock1.tty`` or ``serial:socket://...``.
SIGUSR1 cuts the board's power and powers it on again (what ``--power-cut-cmd
"kill -USR1 PID"`` uses); SIGTERM/SIGINT stop the server.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import tty
from pathlib import Path

from .pty_process import open_pty
from .virtual import VirtualBoard


class _PtyPort:
    """The outer pty a client opens; its slave path is linked at ``link``."""

    def __init__(self, link: str) -> None:
        self.master, self._slave = open_pty()
        tty.setraw(self._slave)
        self.link = Path(link)
        if self.link.is_symlink() or self.link.exists():
            self.link.unlink()
        self.link.symlink_to(os.ttyname(self._slave))

    def send(self, data: bytes) -> None:
        try:
            os.write(self.master, data)
        except OSError:
            pass

    def serve(self, board: VirtualBoard, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                data = os.read(self.master, 4096)
            except OSError:
                break
            if data:
                board.write(data)

    def close(self) -> None:
        if self.link.is_symlink():
            self.link.unlink()


class _TcpPort:
    """One client at a time on 127.0.0.1:port; output with no client is lost, as on a UART."""

    def __init__(self, port: int) -> None:
        self.server = socket.create_server(("127.0.0.1", port))
        self.port = self.server.getsockname()[1]
        self.client: socket.socket | None = None

    def send(self, data: bytes) -> None:
        c = self.client
        if c is not None:
            try:
                c.sendall(data)
            except OSError:
                pass

    def serve(self, board: VirtualBoard, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                break
            self.client = conn
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    break
                board.write(data)
            self.client = None
            conn.close()

    def close(self) -> None:
        self.server.close()


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT."""
    ap = argparse.ArgumentParser(prog="python -m lockmq.hil.vboard", description=__doc__.split("\n")[0])
    ap.add_argument("flash_dir")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--pty", metavar="LINK", help="create a pty and link its path here")
    where.add_argument("--tcp", metavar="PORT", type=int, help="listen on 127.0.0.1:PORT (0: any)")
    ap.add_argument("--heapsize", default="128K")
    args = ap.parse_args(argv)

    port: _PtyPort | _TcpPort = _PtyPort(args.pty) if args.pty else _TcpPort(args.tcp)
    board = VirtualBoard(args.flash_dir, heapsize=args.heapsize)
    stop = threading.Event()

    def _stop(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=board.power_cut, daemon=True).start())
    board.attach(port.send)
    threading.Thread(target=port.serve, args=(board, stop), daemon=True).start()
    where_txt = str(port.link) if isinstance(port, _PtyPort) else f"socket://127.0.0.1:{port.port}"
    print(f"vboard ready {where_txt} pid={os.getpid()}", flush=True)
    while not stop.wait(0.2):
        pass
    board.close()
    port.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
