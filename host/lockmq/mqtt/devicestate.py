"""Each lock's online state as a retained MQTT message: ``lockmq/devices/<SN>``.

The state is derived from the broker's durable ``[devices] events_topic``
(``$devices``: online, offline, evicted ...), never kept twice: at start the topic is
read from its first retained record, then followed every ``topic_scan_ms``. A new
subscription to ``lockmq/devices/+`` (or one SN) gets the current state of every lock
it matches at once (retain flag set), then each change as it happens; the right to
subscribe is the consume right on the events topic. The payload is JSON:
``{"sn", "state": "online" | "offline", "event", "ts_ms"}``.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from . import topics as t

PREFIX = "lockmq/devices/"


class DeviceStates:
    """The last state of every lock seen in the events topic."""

    def __init__(self, core: Any, events_topic: str) -> None:
        self.core = core
        self.topic = events_topic
        self.next = 0
        #: MQTT name -> its retained payload
        self.states: dict[str, bytes] = {}

    def follow(self) -> list[tuple[str, bytes]]:
        """Read the events stored since the last call; the (name, payload) that changed."""
        core = self.core
        end = core.queue_end(self.topic)
        self.next = max(self.next, core.store.queue_start(self.topic))
        changed: dict[str, bytes] = {}
        while self.next < end:
            recs = core.read(self.topic, self.next, 512)
            if not recs:
                break
            for rec in recs:
                self.next = rec.queue_offset + 1
                try:
                    ev = json.loads(rec.payload)
                except ValueError:
                    continue
                sn = ev.get("sn") if isinstance(ev, dict) else None
                if not sn or not isinstance(sn, str):
                    continue
                event = str(ev.get("event", ""))
                state = "online" if event == "online" else "offline"
                payload = json.dumps({"sn": sn, "state": state, "event": event,
                                      "ts_ms": ev.get("ts_ms", 0)},
                                     separators=(",", ":")).encode()
                changed[PREFIX + sn] = payload
        self.states.update(changed)
        return list(changed.items())

    def matching(self, flt: str) -> Iterator[tuple[str, bytes]]:
        """(name, payload) of every lock state ``flt`` matches."""
        for name, payload in list(self.states.items()):
            if t.matches(flt, name):
                yield name, payload
