"""Rate and count limits with bounded memory.

Every table keyed by something a peer chooses (address, claimed SN) is an LRU of
at most ``max_keys`` entries, so cycling keys cannot grow the broker's memory. The
clock is injectable (``clock=``) so tests need no sleeps.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

from .errors import AuthRateLimited, ConnectionRefused, FrameTooLarge, LimitExceeded, RateLimited

Clock = Callable[[], float]
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A dict bounded to ``max_keys`` entries; the least recently used goes first."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value of ``key`` (marking it recently used) or None."""
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: K, value: V) -> None:
        """Set ``key``, evicting the oldest entry when full."""
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.max_keys:
            self._d.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Remove and return ``key``'s value (None if absent)."""
        return self._d.pop(key, None)

    def __len__(self) -> int:
        return len(self._d)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float, n: float = 1.0) -> float:
        """Take ``n`` tokens: 0.0 if granted, else seconds until they would be."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate if self.rate > 0 else float("inf")


class KeyedRateLimiter:
    """One token bucket per key (an address or an SN), in a bounded LRU."""

    def __init__(self, rate: float, burst: float, max_keys: int, clock: Clock = time.monotonic):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: LRU[str, TokenBucket] = LRU(max_keys)

    def take(self, key: str, n: float = 1.0) -> float:
        """0.0 if ``key`` may go on, else the seconds to wait."""
        now = self._clock()
        b = self._buckets.get(key)
        if b is None:
            b = TokenBucket(self.rate, self.burst, now)
            self._buckets.put(key, b)
        return b.take(now, n)

    def forget(self, key: str) -> None:
        """Drop the bucket of ``key``."""
        self._buckets.pop(key)


class ConnectionLimiter:
    """Open connections in total and per address, and the connect rate per address.

    ``admit`` counts a connection in (or raises :class:`ConnectionRefused` naming
    the limit); ``release`` counts it out. Exempt addresses skip the per-address
    limits but count toward the total.
    """

    def __init__(self, max_connections: int, per_address: int, rate: float, burst: int,
                 exempt: list[str] | tuple[str, ...] = (), max_keys: int = 65536,
                 clock: Clock = time.monotonic) -> None:
        self.max_connections = max_connections
        self.per_address = per_address
        self.exempt = frozenset(exempt)
        self.total = 0
        self._by_addr: dict[str, int] = {}
        self._rate = KeyedRateLimiter(rate, burst, max_keys, clock)

    def admit(self, addr: str) -> None:
        """Count a new connection from ``addr`` in, or raise ConnectionRefused."""
        if self.max_connections and self.total >= self.max_connections:
            raise ConnectionRefused("max_connections",
                                    f"{self.total} connections open (max {self.max_connections})")
        if addr not in self.exempt:
            n = self._by_addr.get(addr, 0)
            if n >= self.per_address:
                raise ConnectionRefused("max_connections_per_address",
                                        f"{n} connections open from {addr} "
                                        f"(max {self.per_address})")
            wait = self._rate.take(addr)
            if wait:
                raise ConnectionRefused("connect_rate", f"{addr} connects too fast",
                                        retry_after_ms=int(wait * 1000) + 1)
        self.total += 1
        self._by_addr[addr] = self._by_addr.get(addr, 0) + 1

    def release(self, addr: str) -> None:
        """Count a closed connection from ``addr`` out (ignored if never admitted)."""
        n = self._by_addr.get(addr, 0)
        if n <= 0:
            return
        self.total -= 1
        if n == 1:
            del self._by_addr[addr]
        else:
            self._by_addr[addr] = n - 1

    def open_from(self, addr: str) -> int:
        """Connections currently open from ``addr``."""
        return self._by_addr.get(addr, 0)


class FailureLimiter:
    """Failed authentications counted per key in a fixed window.

    After ``limit`` failures within ``window_s`` the key is blocked until the window
    that started with its first failure ends.
    """

    def __init__(self, limit: int, window_s: float, max_keys: int,
                 clock: Clock = time.monotonic) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._fails: LRU[str, list[float]] = LRU(max_keys)  # [window_start, count]

    def check(self, key: str, label: str) -> None:
        """Raise :class:`AuthRateLimited` if ``key`` is blocked now."""
        entry = self._fails.get(key)
        if entry is None:
            return
        now = self._clock()
        if now - entry[0] >= self.window_s:
            self._fails.pop(key)
            return
        if entry[1] >= self.limit:
            wait = self.window_s - (now - entry[0])
            raise AuthRateLimited(f"too many failed authentications for {label}",
                                  reason="auth_rate_limited", retry_after_ms=int(wait * 1000) + 1)

    def fail(self, key: str) -> None:
        """Count one failure of ``key``."""
        now = self._clock()
        entry = self._fails.get(key)
        if entry is None or now - entry[0] >= self.window_s:
            self._fails.put(key, [now, 1.0])
        else:
            entry[1] += 1

    def succeed(self, key: str) -> None:
        """Forget the failures of ``key`` (after a successful authentication)."""
        self._fails.pop(key)


class MessageRateLimiter:
    """Per-lock publish rate (``rate`` msg/s, ``burst``); 0 disables it."""

    def __init__(self, rate: float, burst: int, max_keys: int, clock: Clock = time.monotonic):
        self.enabled = rate > 0
        self._rate = KeyedRateLimiter(rate, burst, max_keys, clock)

    def check(self, sn: str, n: int = 1) -> None:
        """Take ``n`` messages of ``sn``'s budget or raise :class:`RateLimited`."""
        if not self.enabled:
            return
        wait = self._rate.take(sn, n)
        if wait:
            raise RateLimited("lock_message_rate", f"lock {sn} publishes faster than allowed",
                              retry_after_ms=int(wait * 1000) + 1)


def check_buffered(nbytes: int, limit: int) -> None:
    """Raise :class:`LimitExceeded` (closing) if a connection buffers over ``limit``."""
    if nbytes > limit:
        raise LimitExceeded("max_buffered_bytes",
                            f"{nbytes} bytes buffered for one connection (max {limit})",
                            close=True)


def check_frame_size(nbytes: int, limit: int) -> None:
    """Raise :class:`LimitExceeded` (closing) for a frame larger than ``limit``."""
    if nbytes > limit:
        raise FrameTooLarge(f"frame of {nbytes} bytes (max {limit})")
