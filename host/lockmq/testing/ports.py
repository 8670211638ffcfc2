"""Free TCP ports on 127.0.0.1."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server that must keep its port
    across restarts, or a second listener named in a config file)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
