"""Reconnect backoff under MicroPython: exponential cap, full jitter, floor from a
broker's retry-after, per-lock seeding (no two locks share a jitter sequence)."""

from __future__ import annotations

import json


def test_cap_doubles_to_the_maximum_and_jitter_spreads(run_app, tmp_path):
    out = run_app("""
import json
from lockapp.backoff import Backoff, seed
seed(b"LOCK0001")
b = Backoff(500, 60000)
caps, samples = [], []
for k in range(10):
    caps.append(b.cap_ms())
    samples.append(b.next_ms())
lo = Backoff(500, 8000, rand=lambda n: 0)
hi = Backoff(500, 8000, rand=lambda n: n - 1)
lows = [lo.next_ms() for _ in range(6)]
highs = [hi.next_ms() for _ in range(6)]
f = Backoff(500, 8000, rand=lambda n: 0)
floor = f.next_ms(floor_ms=3000)
f.reset()
many = Backoff(1000, 1000000)
for _ in range(6):
    many.next_ms()
spread = [many.next_ms() for _ in range(200)]
print(json.dumps([caps, samples, lows, highs, floor, f.attempt, min(spread), max(spread),
                  len(set(spread))]))
""", tmp_path)
    caps, samples, lows, highs, floor, attempt, smin, smax, distinct = json.loads(out)
    assert caps == [500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
    assert all(500 <= s <= c for s, c in zip(samples, caps))
    assert lows == [500] * 6                      # the floor of the window
    assert highs == [500, 1000, 2000, 4000, 8000, 8000]
    assert 3000 <= floor <= 3500 and attempt == 0  # retry-after honoured; reset
    assert smin >= 1000 and smax <= 1000000 and distinct > 150


def test_two_locks_draw_different_delays(run_app, tmp_path):
    script = """
import sys
from lockapp.backoff import Backoff, seed
seed(b"%s")
b = Backoff(500, 60000)
for _ in range(5):
    b.next_ms()
print([b.next_ms() for _ in range(8)])
"""
    a = run_app(script % "LOCK0001", tmp_path)
    b = run_app(script % "LOCK0002", tmp_path)
    assert a != b


def test_timeout_errnos_are_timeouts(run_app, tmp_path):
    out = run_app("""
import errno, asyncio
from lockapp.link import reason_of, LinkError
print([reason_of(OSError(n)) for n in (11, 110, 116, errno.ECONNREFUSED, errno.ECONNRESET, 5)])
print(reason_of(asyncio.TimeoutError()), reason_of(LinkError("silent")), reason_of(KeyError("x")))
""", tmp_path)
    assert out.splitlines() == ["['timeout', 'timeout', 'timeout', 'refused', 'reset', 'oserror5']",
                                "timeout silent bug_KeyError"]


def test_a_retry_hint_from_the_network_is_bounded_by_the_locks_own_maximum(run_app, tmp_path):
    """One forged ERROR(BUSY, retry_after_ms = 2^32-1) made a lock wait 49.7 days."""
    out = run_app("""
from lockapp.backoff import Backoff
b = Backoff(500, 8000)
print([b.next_ms(floor_ms=0xFFFFFFFF) for _ in range(5)], b.next_ms(floor_ms=7000))
""", tmp_path)
    hinted, near = out.rsplit("]", 1)
    assert all(d == 8000 for d in eval(hinted + "]"))   # capped at backoff_max_ms
    assert 7000 <= int(near) <= 8000
