"""Challenge nonces: fresh, single-use, short-lived, bounded in number."""

from __future__ import annotations

import time

from . import keys
from .limits import LRU, Clock


class NonceBook:
    """Nonces issued by :meth:`issue` and not yet consumed.

    :meth:`consume` succeeds once per nonce and only within ``ttl_s``; a replayed,
    unknown or stale nonce fails. At most ``max_outstanding`` are remembered (the
    oldest are forgotten first — their connections will fail to authenticate).
    """

    def __init__(self, ttl_s: float, max_outstanding: int, clock: Clock = time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._issued: LRU[bytes, float] = LRU(max_outstanding)

    def issue(self) -> bytes:
        """A fresh random 16-byte nonce, remembered as outstanding."""
        nonce = keys.new_nonce()
        self._issued.put(nonce, self._clock())
        return nonce

    def consume(self, nonce: bytes) -> str:
        """Use ``nonce`` up: ``""`` if it was valid, else the reason it is not."""
        issued = self._issued.pop(bytes(nonce))
        if issued is None:
            return "nonce_replayed_or_unknown"
        if self._clock() - issued > self.ttl_s:
            return "nonce_expired"
        return ""

    def discard(self, nonce: bytes) -> None:
        """Forget ``nonce`` (its connection closed before authenticating)."""
        self._issued.pop(bytes(nonce))

    def __len__(self) -> int:
        return len(self._issued)
