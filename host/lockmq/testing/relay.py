"""Pieces of TCP relays that stand between a lock and a broker in tests."""

from __future__ import annotations

import socket


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from ``src`` to ``dst`` until ``src`` ends, then close ``dst``
    (run it on a thread per direction)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        dst.close()


class CuttableRelay:
    """A TCP relay on 127.0.0.1 to ``target_port`` that a test can cut like a network
    link: :meth:`cut` silently drops every byte both ways (no FIN, no RST: peers see
    only silence, as behind a dead switch) and holds new connections unanswered;
    :meth:`heal` forwards again. Threads are daemons; :meth:`close` stops accepting."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.target = target_port
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.open = threading.Event()
        self.open.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Drop everything from now on, both ways."""
        self.open.clear()

    def heal(self) -> None:
        """Forward again (bytes dropped meanwhile are gone, as on a real link)."""
        self.open.set()

    def close(self) -> None:
        """Stop accepting."""
        self.srv.close()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                a, _ = self.srv.accept()
            except OSError:
                return
            self.open.wait()   # (a cut link: the connect hangs, as a SYN into a dead switch)
            try:
                b = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                a.close()
                continue
            b.settimeout(None)
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._forward, args=(src, dst), daemon=True).start()

    def _forward(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.open.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
