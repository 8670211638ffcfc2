"""Serve a virtual board on a serial-like port: a pty (with a stable link) or TCP.

    python -m lockmq.hil.vboard FLASH_DIR --pty /tmp/lock1.tty
    python -m lockmq.hil.vboard FLASH_DIR --tcp 7000      # socket://127.0.0.1:7000
    python -m lockmq.hil.vboard FLASH_DIR --rfc2217 7000  # rfc2217://127.0.0.1:7000

The board behaves like a MicroPython board on a UART: ``mpremote connect
/tmp/lock1.tty ...`` works unmodified (soft reboots respawn the interpreter), and
so does the rig's ``--hil-target serial:/tmp/lock1.tty`` or ``serial:socket://...``.
SIGUSR1 cuts the board's power and powers it on again (what ``--hil-power-cut-cmd
"kill -USR1 PID"`` uses); SIGTERM/SIGINT stop the server. Over RFC 2217 the modem
lines are wired like an ESP32 dev board's auto-reset circuit: RTS asserted with
DTR not asserted holds the board in reset (EN low), releasing it boots the board
(esptool's and the rig's hard reset work; a plain open asserting both does not).
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
from typing import Any

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
            # A UART sends each byte as it comes: without this, Nagle holds the board's
            # second small write for the client's delayed ACK (~40 ms a raw-REPL round
            # trip: mpremote's copy of an app took ~25 s instead of ~2).
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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


class _Rfc2217Port(_TcpPort):
    """RFC 2217 (telnet serial control) on 127.0.0.1:port, with RTS as the EN line."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self._mgr: Any = None
        self._wlock = threading.Lock()

    def send(self, data: bytes) -> None:
        c, mgr = self.client, self._mgr
        if c is not None and mgr is not None:
            try:
                with self._wlock:
                    c.sendall(b"".join(mgr.escape(data)))
            except OSError:
                pass

    def serve(self, board: VirtualBoard, stop: threading.Event) -> None:
        import serial
        import serial.rfc2217

        port = self

        class _Conn:
            def write(self, data: bytes) -> None:
                c = port.client
                if c is not None:
                    with port._wlock:
                        c.sendall(data)

        while not stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                break
            lines = serial.serial_for_url("loop://")  # holds the settings and RTS/DTR state
            lines.rts = False  # EN released until the client asserts RTS
            self.client = conn
            self._mgr = serial.rfc2217.PortManager(lines, _Conn())
            held = False
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    break
                payload = b"".join(self._mgr.filter(data))
                # The dev-board auto-reset circuit: EN is low only while RTS is
                # asserted and DTR is not (both asserted, as a plain open does, is no reset).
                if (lines.rts and not lines.dtr) != held:
                    held = not held
                    if held:
                        board.power_off()  # EN low: the chip is held in reset
                    else:
                        board.power_on()  # EN released: it boots
                if payload:
                    board.write(payload)
            self.client = None
            self._mgr = None
            conn.close()
            lines.close()


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT."""
    ap = argparse.ArgumentParser(prog="python -m lockmq.hil.vboard", description=__doc__.split("\n")[0])
    ap.add_argument("flash_dir")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--pty", metavar="LINK", help="create a pty and link its path here")
    where.add_argument("--tcp", metavar="PORT", type=int, help="listen on 127.0.0.1:PORT (0: any)")
    where.add_argument("--rfc2217", metavar="PORT", type=int, help="RFC 2217 on 127.0.0.1:PORT (0: any)")
    ap.add_argument("--heapsize", default="128K")
    ap.add_argument("--micropython", metavar="EXE",
                    help="the interpreter (default: the unix port on PATH; e.g. the 32-bit "
                         "frozen one of `lockmq firmware interpreter`)")
    args = ap.parse_args(argv)

    port: _PtyPort | _TcpPort
    if args.pty:
        port = _PtyPort(args.pty)
    elif args.rfc2217 is not None:
        port = _Rfc2217Port(args.rfc2217)
    else:
        port = _TcpPort(args.tcp)
    board = VirtualBoard(args.flash_dir, heapsize=args.heapsize, micropython=args.micropython)
    stop = threading.Event()

    def _stop(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=board.power_cut, daemon=True).start())
    board.attach(port.send)
    threading.Thread(target=port.serve, args=(board, stop), daemon=True).start()
    if isinstance(port, _PtyPort):
        where_txt = str(port.link)
    else:
        scheme = "rfc2217" if isinstance(port, _Rfc2217Port) else "socket"
        where_txt = f"{scheme}://127.0.0.1:{port.port}"
    print(f"vboard ready {where_txt} pid={os.getpid()}", flush=True)
    while not stop.wait(0.2):
        pass
    board.close()
    port.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
