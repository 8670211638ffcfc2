"""100 virtual locks at once against one broker (virtual target only).

Each lock is the real firmware in its own unix-port process with the test heap
(``lockmq.testing.lock.HEAP``, 144K: the session layer and frame MACs, on by default
on plain TCP, left too little room at 128K on this 64-bit build, where objects take
about twice what they take on an ESP32 -- the 32-bit figure is bench_firmware's);
all connect, authenticate with their own key, publish a few
events each, and every event is stored exactly once, in order per lock.
"""

from __future__ import annotations

import time

import pytest

from lockmq.hil.broker import BrokerProcess
from lockmq.hil.plugin import LockFactory
from lockmq.hil.scenario import assert_exactly_once_in_order
from lockmq.testing.lock import HEAP

pytestmark = [pytest.mark.hil, pytest.mark.virtual_only]

LOCKS = 100
EVENTS_EACH = 5
HEAP_KB = int(HEAP.rstrip("K"))


@pytest.mark.slow  # 100 boards; the scenarios run one lock each by default
def test_hundred_locks_against_one_broker(broker: BrokerProcess, lock_factory: LockFactory) -> None:
    sns = [f"FLEET{i:04d}" for i in range(LOCKS)]
    keys = broker.provision(sns)
    locks = [lock_factory(sn, keys[sn], [broker.address], heapsize=f"{HEAP_KB}K", heartbeat_s=30)
             for sn in sns]
    deadline = time.monotonic() + 120  # the whole fleet comes up within this
    for lock in locks:
        lock.wait_online(timeout=max(1.0, deadline - time.monotonic()))
    for lock in locks:
        lock.events("unlock", EVENTS_EACH)
    for lock in locks:
        lock.wait_drained(timeout=max(5.0, deadline + 60 - time.monotonic()))
    peaks = []
    for lock in locks:
        lock.command("mem")
        peaks.append(int(lock.expect(r"I mem peak=(\d+)").group(1)))
    broker.stop()
    by_sn: dict[str, list[int]] = {sn: [] for sn in sns}
    for rec in broker.records("lock.events"):
        by_sn[rec.sn].append(rec.seq)
    for lock in locks:
        assert_exactly_once_in_order(lock, by_sn[lock.sn], expect_count=EVENTS_EACH)
    assert max(peaks) < HEAP_KB * 1024  # it ran inside the heap it was given
    print(f"{LOCKS} locks: peak heap max {max(peaks)} B, min {min(peaks)} B")
