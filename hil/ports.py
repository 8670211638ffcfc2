"""Ports the rig listens on: any free one, or one from a range the test engineer
gives (``--hil-ports 20000-20999``: a firewall that lets the boards reach the rig
only there, or several rigs on one host kept apart)."""

from __future__ import annotations

import random
import socket


class PortRange:
    """Free ports from ``lo..hi`` (inclusive), or any free port (``None``)."""

    def __init__(self, spec: str | None = None) -> None:
        self.bounds: tuple[int, int] | None = None
        if spec:
            lo, sep, hi = spec.partition("-")
            if not sep or not lo.isdigit() or not hi.isdigit() or not 0 < int(lo) <= int(hi) < 65536:
                raise ValueError(f"--hil-ports must be LO-HI (e.g. 20000-20999), not {spec!r}")
            self.bounds = (int(lo), int(hi))
        self._taken: set[int] = set()

    def take(self, host: str = "127.0.0.1") -> int:
        """A port free on ``host`` now (from the range when one was given), not handed
        out before by this range; OSError when the range has none left."""
        if self.bounds is None:
            return _bind_free(host, 0)
        lo, hi = self.bounds
        start = random.randint(lo, hi)   # rigs sharing a range rarely try the same port first
        for i in range(hi - lo + 1):
            port = lo + (start - lo + i) % (hi - lo + 1)
            if port in self._taken:
                continue
            try:
                _bind_free(host, port)
            except OSError:
                continue
            self._taken.add(port)
            return port
        raise OSError(f"no free port left in {lo}-{hi} on {host}")


def _bind_free(host: str, port: int) -> int:
    with socket.socket() as s:
        s.bind((host, port))
        return int(s.getsockname()[1])
