"""Checks shared by the scenarios: what the broker stored against what the lock queued."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from .broker import BrokerProcess
from .lock import Lock

TOPIC = "lock.events"

#: The stages of an update over the air, each by the log line that starts it and how
#: long it lasts on a virtual board (~48 KB bundle): where a seeded power cut falls
#: (hil/test_ota.py, a few; bench/firmware_ota_heap.py --cuts, many).
OTA_STAGES = {"fetch": (r"I ota fetch v=", 0.15), "verify": (r"I ota verified v=", 0.04),
              "switch": (r"I sys reboot reason=ota", 0.1), "trial": (r"I ota trial v=", 0.03)}


def stored_seqs(broker: BrokerProcess, sn: str, topic: str = TOPIC) -> list[int]:
    """The sequence numbers of ``sn``'s records in the broker's log, in log order
    (the broker must be stopped)."""
    return [r.seq for r in broker.records(topic, sn)]


def assert_exactly_once_in_order(lock: Lock, stored: list[int], expect_count: int | None = None,
                                 unlogged_ok: int = 0, ordered: bool = True) -> None:
    """Every event the lock durably queued is stored exactly once, in sequence order,
    and nothing else is stored for it.

    ``unlogged_ok``: how many stored events may lack their ``I evt queued`` line —
    a power cut between the durable append and the print loses the line, not the
    event (one per cut at most). ``ordered=False`` skips the order check (and
    prints where the order broke)."""
    queued = lock.queued_seqs()
    log = lock.full_log()
    dropped = re.findall(r"W evt dropped seq=(\d+)", log)
    if dropped:
        raise lock.fail(f"{lock.sn}: the offline queue overflowed: {len(dropped)} events dropped "
                        f"(reported by the lock), first seq {dropped[0]}")
    if "E evt rejected" in log:
        raise lock.fail(f"{lock.sn}: the broker refused events for good")
    dupes = sorted(s for s, n in Counter(stored).items() if n > 1)
    if dupes:
        raise lock.fail(f"{lock.sn}: stored more than once: {dupes[:20]} ({len(dupes)} in all)")
    reused = sorted(s for s, n in Counter(queued).items() if n > 1)
    if reused:
        raise lock.fail(f"{lock.sn}: sequence numbers reused by the lock: {reused[:20]}")
    missing = sorted(set(queued) - set(stored))
    if missing:
        raise lock.fail(f"{lock.sn}: queued but never stored (lost): {missing[:20]} ({len(missing)} in all)")
    extra = sorted(set(stored) - set(queued))
    if len(extra) > unlogged_ok:
        raise lock.fail(f"{lock.sn}: stored but never queued by the lock: {extra[:20]}")
    if stored != sorted(stored):
        bad = next(i for i in range(1, len(stored)) if stored[i] < stored[i - 1])
        text = f"{lock.sn}: stored out of order at #{bad}: ...{stored[max(0, bad - 3):bad + 3]}..."
        if ordered:
            raise lock.fail(text)
        print(text)
    if expect_count is not None and len(stored) != expect_count:
        raise lock.fail(f"{lock.sn}: {len(stored)} records stored, expected {expect_count}")


def summary(stored: list[int]) -> dict[str, Any]:
    """A short description for logs."""
    return {"count": len(stored), "first": stored[:1], "last": stored[-1:]}
