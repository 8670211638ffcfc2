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
