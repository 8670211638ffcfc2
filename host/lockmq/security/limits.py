"""Rate and count limits with bounded memory.

Every table keyed by something a peer chooses (address, claimed SN) is an LRU of
at most ``max_keys`` entries, so cycling keys cannot grow the broker's memory. The
clock is injectable (``clock=``) so tests need no sleeps.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

from .errors import ConnectionRefused, FrameTooLarge, LimitExceeded, RateLimited

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

    def take_up_to(self, now: float, n: int) -> int:
        """Take as many of ``n`` single tokens as there are (at most ``n``): what ``n``
        calls of ``take(now)`` in a row would grant, in one step."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        k = min(n, int(self.tokens))
        self.tokens -= k
        return k


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
        return self._bucket(key, now).take(now, n)

    def take_up_to(self, key: str, n: int) -> int:
        """How many of ``n`` messages ``key`` may send now (taken from its bucket)."""
        now = self._clock()
        return self._bucket(key, now).take_up_to(now, n)

    def give_back(self, key: str, n: int) -> None:
        """Return ``n`` tokens taken and not used (never above the burst)."""
        b = self._buckets.get(key)
        if b is not None:
            b.tokens = min(b.burst, b.tokens + n)

    def _bucket(self, key: str, now: float) -> TokenBucket:
        b = self._buckets.get(key)
        if b is None:
            b = TokenBucket(self.rate, self.burst, now)
            self._buckets.put(key, b)
        return b

    def forget(self, key: str) -> None:
        """Drop the bucket of ``key``."""
        self._buckets.pop(key)


class SourcePolicy:
    """What counts as one *source*: one prefix policy for IPv4 and IPv6.

    A source is the ``/ipv4_prefix`` network of an IPv4 address and the
    ``/ipv6_prefix`` network of an IPv6 one (IPv4-mapped IPv6 addresses count as
    IPv4). The connection caps, the connect rate and the failed-authentication
    counters all key on :meth:`key`, so that a host cannot get one budget from one
    limit and 2^64 from another.
    """

    def __init__(self, ipv4_prefix: int = 32, ipv6_prefix: int = 64,
                 exempt: list[str] | tuple[str, ...] = ()) -> None:
        self.ipv4_prefix = ipv4_prefix
        self.ipv6_prefix = ipv6_prefix
        self._exempt_ips = frozenset(e for e in exempt if "/" not in e)
        self._exempt_nets = tuple(ipaddress.ip_network(e, strict=False)
                                  for e in exempt if "/" in e)
        # peer ip -> (its source key, exempt?): parsing an address with ``ipaddress``
        # is ~10 µs, paid once per address and not on every connection of a storm
        self._cache: LRU[str, tuple[str, bool]] = LRU(4096)

    @staticmethod
    def _parse(peer_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            ip = ipaddress.ip_address(peer_ip.split("%", 1)[0])   # drop an IPv6 zone id
        except ValueError:
            return None
        if ip.version == 6 and ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        return ip

    def _classify(self, peer_ip: str) -> tuple[str, bool]:
        """``(key, exempt)`` of ``peer_ip``, computed once per address (see key/exempt)."""
        cached = self._cache.get(peer_ip)
        if cached is not None:
            return cached
        ip = self._parse(peer_ip)
        if ip is None:
            got = (peer_ip, peer_ip in self._exempt_ips)
        else:
            bits = self.ipv4_prefix if ip.version == 4 else self.ipv6_prefix
            k = str(ip) if bits == ip.max_prefixlen else \
                str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))
            exempt = peer_ip in self._exempt_ips or str(ip) in self._exempt_ips or \
                any(ip.version == n.version and ip in n for n in self._exempt_nets)
            got = (k, exempt)
        self._cache.put(peer_ip, got)
        return got

    def key(self, peer_ip: str) -> str:
        """The source ``peer_ip`` belongs to (``"10.0.0.7"``, ``"2001:db8:1:2::/64"``)."""
        return self._classify(peer_ip)[0]

    def exempt(self, peer_ip: str) -> bool:
        """Whether ``peer_ip`` is in ``limit_exempt_addresses`` (an address or a network)."""
        return self._classify(peer_ip)[1]


class ConnectionLimiter:
    """Open connections in total and per source, and the connect rate per source.

    ``admit`` counts a connection in (or raises :class:`ConnectionRefused` naming
    the limit); ``release`` counts it out. A source is what ``policy`` says (one
    address, or its IPv4/IPv6 prefix). Exempt addresses skip the per-source limits
    but count toward the total.
    """

    def __init__(self, max_connections: int, per_address: int, rate: float, burst: int,
                 exempt: list[str] | tuple[str, ...] = (), max_keys: int = 65536,
                 clock: Clock = time.monotonic, policy: SourcePolicy | None = None) -> None:
        self.max_connections = max_connections
        self.per_address = per_address
        self.policy = policy or SourcePolicy(exempt=exempt)
        self.total = 0
        self._by_addr: dict[str, int] = {}
        self._rate = KeyedRateLimiter(rate, burst, max_keys, clock)

    def admit(self, addr: str) -> None:
        """Count a new connection from ``addr`` in, or raise ConnectionRefused."""
        if self.max_connections and self.total >= self.max_connections:
            raise ConnectionRefused("max_connections",
                                    f"{self.total} connections open (max {self.max_connections})")
        src = self.policy.key(addr)
        if not self.policy.exempt(addr):
            n = self._by_addr.get(src, 0)
            if n >= self.per_address:
                raise ConnectionRefused("max_connections_per_address",
                                        f"{n} connections open from {src} "
                                        f"(max {self.per_address})")
            wait = self._rate.take(src)
            if wait:
                raise ConnectionRefused("connect_rate", f"{src} connects too fast",
                                        retry_after_ms=int(wait * 1000) + 1)
        self.total += 1
        self._by_addr[src] = self._by_addr.get(src, 0) + 1

    def release(self, addr: str) -> None:
        """Count a closed connection from ``addr`` out (ignored if never admitted)."""
        src = self.policy.key(addr)
        n = self._by_addr.get(src, 0)
        if n <= 0:
            return
        self.total -= 1
        if n == 1:
            del self._by_addr[src]
        else:
            self._by_addr[src] = n - 1

    def open_from(self, addr: str) -> int:
        """Connections currently open from the source of ``addr``."""
        return self._by_addr.get(self.policy.key(addr), 0)


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

    def blocked(self, key: str) -> float:
        """0.0 if ``key`` is under its limit, else the seconds left in its window."""
        entry = self._fails.get(key)
        if entry is None:
            return 0.0
        now = self._clock()
        if now - entry[0] >= self.window_s:
            self._fails.pop(key)
            return 0.0
        if entry[1] >= self.limit:
            return max(self.window_s - (now - entry[0]), 0.001)
        return 0.0

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

    def take(self, sn: str, n: int = 1) -> float:
        """Take ``n`` messages of ``sn``'s budget: 0.0 if granted, else seconds to wait."""
        return self._rate.take(sn, n) if self.enabled else 0.0

    def take_up_to(self, sn: str, n: int) -> int:
        """How many of ``n`` messages in a row ``sn`` may publish now (taken from its
        budget): the first that many pass, as ``n`` calls of :meth:`check` would."""
        return self._rate.take_up_to(sn, n) if self.enabled else n

    def give_back(self, sn: str, n: int) -> None:
        """Return ``n`` messages taken by :meth:`take_up_to` and not sent."""
        if self.enabled and n > 0:
            self._rate.give_back(sn, n)

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
