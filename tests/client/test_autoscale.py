"""Worker-pool sizing decisions, with an injected clock."""

from __future__ import annotations

import random

import pytest

from lockmq.client.autoscale import Autoscaler
from lockmq.client.backoff import Backoff


def test_grows_with_backlog_at_most_doubling():
    a = Autoscaler(min_workers=1, max_workers=8, target_per_worker=10)
    assert a.decide(1, backlog=1000, busy=1, now=0) == 2
    assert a.decide(2, backlog=1000, busy=2, now=0) == 4
    assert a.decide(4, backlog=1000, busy=4, now=0) == 8
    assert a.decide(8, backlog=1000, busy=8, now=0) == 8


def test_shrinks_one_step_after_idle_period():
    a = Autoscaler(min_workers=2, max_workers=8, target_per_worker=10, idle_shrink_s=5)
    assert a.decide(8, backlog=0, busy=0, now=100.0) == 8
    assert a.decide(8, backlog=0, busy=0, now=104.0) == 8
    assert a.decide(8, backlog=0, busy=0, now=105.0) == 7
    assert a.decide(7, backlog=0, busy=0, now=106.0) == 7
    n = 7
    for t in range(110, 200, 5):
        n = a.decide(n, backlog=0, busy=0, now=float(t))
    assert n == 2


def test_no_shrink_while_all_busy_with_backlog():
    a = Autoscaler(min_workers=1, max_workers=4, target_per_worker=100, idle_shrink_s=1)
    for t in range(10):
        assert a.decide(4, backlog=50, busy=4, now=float(t)) == 4


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        Autoscaler(min_workers=0)
    with pytest.raises(ValueError):
        Autoscaler(min_workers=3, max_workers=2)


def test_backoff_grows_and_caps_and_resets():
    b = Backoff(base_s=0.1, cap_s=1.0, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(10)]
    assert delays[0] <= 0.1
    assert all(d <= 1.0 for d in delays)
    assert delays[-1] >= 0.5
    b.reset()
    assert b.next_delay() <= 0.1
