# Exponential backoff with full jitter: the delay before attempt k is uniform in
# [min_ms, min(max_ms, min_ms * 2**k)]. A thousand locks that lost the same broker
# spread their reconnects over the whole window instead of arriving together.
import random


class Backoff:
    def __init__(self, min_ms=500, max_ms=60000, rand=None):
        if min_ms < 1 or max_ms < min_ms:
            raise ValueError("backoff: need 1 <= min_ms <= max_ms")
        self.min_ms = min_ms
        self.max_ms = max_ms
        self.attempt = 0
        # rand(n) -> integer in [0, n); injectable for tests.
        self._rand = rand or _randbelow

    def cap_ms(self):
        cap = self.min_ms
        k = self.attempt
        while k > 0 and cap < self.max_ms:
            cap *= 2
            k -= 1
        return min(cap, self.max_ms)

    def next_ms(self, floor_ms=0):
        # Delay for the next attempt; floor_ms (a broker's retry-after) is honoured up
        # to max_ms: a number from the network never keeps the lock away longer than
        # its own limit (one forged ERROR said 2^32-1 ms: 49.7 days offline).
        cap = self.cap_ms()
        self.attempt += 1
        if floor_ms > self.max_ms:
            floor_ms = self.max_ms
        d = self.min_ms + self._rand(cap - self.min_ms + 1)
        if d < floor_ms:
            d = floor_ms + self._rand(self.min_ms + 1)
            if d > self.max_ms:
                d = self.max_ms
        return d

    def reset(self):
        self.attempt = 0


def _randbelow(n):
    if n <= 1:
        return 0
    return random.getrandbits(30) % n


def seed(extra=b""):
    # Seed from the OS/hardware RNG (and the lock's id) so locks never share a
    # jitter sequence; the unix port's default seed is fixed.
    try:
        import os
        b = os.urandom(4)
    except Exception:
        b = b"\x00\x00\x00\x00"
    s = 0
    for c in b + extra:
        s = (s * 131 + c) & 0x3FFFFFFF
    random.seed(s)
