"""Persistent MQTT sessions: which filters a client subscribed to, kept across
disconnects and broker restarts.

A session is keyed by its owner (``identity.owner_of``: the token's name) and its
client id, so one token can never resume another's session. What a session *read*
is not kept here: each subscription is a consumer cluster whose committed position
the broker persists (``consume-<cluster>.log``), so a resumed session goes on from
where its clusters stopped. This file holds only the subscriptions and the expiry:
``<data_dir>/mqtt/sessions.json``, written atomically (temp file, fsync, rename,
directory fsync) whenever a persistent session's subscriptions change.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from lockmq.store.files import atomic_write, make_dir

#: MQTT 5's "never expires"
NEVER = 0xFFFFFFFF


@dataclass
class SubRecord:
    """One subscription of a session."""

    filter: str
    qos: int
    #: the MQTT 5 subscription identifier (0: none)
    sub_id: int = 0
    #: topics this subscription already joined (a wildcard filter's clusters): a
    #: topic joined later, after a reconnect, starts from its first record
    topics: list[str] = field(default_factory=list)
    #: per-lock ordering asked for (MQTT 5 user property ``ordered=true``) for the
    #: clusters this subscription creates
    ordered: bool = False


@dataclass
class Session:
    """One client's session state."""

    owner: str
    client_id: str
    #: seconds the session outlives a disconnect (0: it ends with the connection)
    expiry_s: int = 0
    subs: dict[str, SubRecord] = field(default_factory=dict)
    #: wall time of the last disconnect (0: connected, or never disconnected)
    disconnected_ms: int = 0

    @property
    def key(self) -> str:
        """The session's key: owner and client id."""
        return session_key(self.owner, self.client_id)

    def expired(self, now_ms: float) -> bool:
        """True once a disconnected session has outlived its expiry."""
        if not self.disconnected_ms or self.expiry_s == NEVER:
            return False
        return now_ms - self.disconnected_ms >= self.expiry_s * 1000


def session_key(owner: str, client_id: str) -> str:
    """The key of ``client_id``'s session under ``owner``."""
    return f"{owner}\n{client_id}"


class SessionStore:
    """The persistent sessions of one broker (see the module docstring)."""

    def __init__(self, data_dir: str) -> None:
        self.dir = os.path.join(data_dir, "mqtt")
        self.path = os.path.join(self.dir, "sessions.json")
        self.sessions: dict[str, Session] = {}

    def load(self) -> None:
        """Read the saved sessions (none if the file does not exist)."""
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read() or b"{}")
        except FileNotFoundError:
            return
        for raw in data.get("sessions", []):
            subs = {k: SubRecord(**v) for k, v in raw.pop("subs", {}).items()}
            s = Session(subs=subs, **raw)
            self.sessions[s.key] = s

    def get(self, owner: str, client_id: str) -> Session | None:
        """The saved session of ``client_id`` under ``owner``, if any."""
        return self.sessions.get(session_key(owner, client_id))

    def put(self, s: Session) -> None:
        """Keep ``s`` (a persistent session) and save."""
        self.sessions[s.key] = s
        self.save()

    def drop(self, s: Session) -> None:
        """Forget ``s`` and save (if it was kept)."""
        if self.sessions.pop(s.key, None) is not None:
            self.save()

    def save(self) -> None:
        """Write every persistent session atomically and durably."""
        make_dir(self.dir)
        body: dict[str, Any] = {"version": 1, "saved_ms": int(time.time() * 1000),
                                "sessions": [asdict(s) for s in self.sessions.values()]}
        atomic_write(self.path, json.dumps(body, sort_keys=True).encode())
