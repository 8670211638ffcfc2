"""Retained messages: the last retained PUBLISH of each MQTT topic, sent to a new
subscription whose filter matches it (MQTT 3.3.1.3).

A retained PUBLISH is first a record like any other (stored before its PUBACK); it
is also kept here, by MQTT topic name, in ``<data_dir>/mqtt/retained.json`` (written
atomically with fsync at each change), and a retained PUBLISH with an empty payload
removes it. Shared subscriptions get no retained messages (MQTT 5 4.8.2).
"""

from __future__ import annotations

import base64
import json
import os
from typing import Iterator

from lockmq.store.files import atomic_write, make_dir

from . import topics as t


class RetainedStore:
    """Retained messages by MQTT topic name (see the module docstring)."""

    def __init__(self, data_dir: str, max_messages: int = 10_000) -> None:
        self.dir = os.path.join(data_dir, "mqtt")
        self.path = os.path.join(self.dir, "retained.json")
        self.max_messages = max_messages
        self.messages: dict[str, tuple[bytes, int]] = {}

    def load(self) -> None:
        """Read the saved retained messages (none if there is no file)."""
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read() or b"{}")
        except FileNotFoundError:
            return
        for name, (payload, qos) in data.get("retained", {}).items():
            self.messages[name] = (base64.b64decode(payload), int(qos))

    def put(self, name: str, payload: bytes, qos: int) -> bool:
        """Retain ``payload`` for ``name`` (empty: forget it); False if the cap is
        reached for a new topic (then nothing changes)."""
        if not payload:
            if self.messages.pop(name, None) is None:
                return True
        else:
            if name not in self.messages and len(self.messages) >= self.max_messages:
                return False
            self.messages[name] = (bytes(payload), qos)
        self._save()
        return True

    def matching(self, flt: str) -> Iterator[tuple[str, bytes, int]]:
        """``(name, payload, qos)`` of every retained message ``flt`` matches."""
        for name, (payload, qos) in list(self.messages.items()):
            if t.matches(flt, name):
                yield name, payload, qos

    def _save(self) -> None:
        make_dir(self.dir)
        body = {"version": 1, "retained": {
            n: [base64.b64encode(p).decode("ascii"), q] for n, (p, q) in self.messages.items()}}
        atomic_write(self.path, json.dumps(body, sort_keys=True).encode())
