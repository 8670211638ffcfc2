"""Devices: the online list, heartbeats, eviction and the ``$devices`` topic.

Like RocketMQ's NameServer with brokers: every connection is expected to send
something (any frame counts, HEARTBEAT at least every ``heartbeat_s``); one silent
for ``evict_after_s`` is closed. For locks, every change is published as one JSON
record on the system topic ``$devices`` (consumable by any cluster)::

    {"sn": "LOCK-0001", "event": "online" | "offline" | "evicted",
     "ts_ms": 1763780000000, "peer": "10.0.0.7:51234", "reason": "..."}

``reason`` is present on ``offline`` (``"disconnected"``, ``"replaced"`` when the
same SN connected again, ``"broker shutdown"``) and ``evicted`` (``"silent 120 s"``).
When the broker starts it writes ``{"event": "broker_start", "ts_ms": ..., "peer": ""}``
(no ``sn``): every lock is offline until its own ``online`` event (after a crash no
``offline`` events could be written).

A lock's HEARTBEAT is also written to ``heartbeats_topic`` (``$heartbeats``;
empty = off) as ``{"sn", "ts_ms", "uptime_s", "queued", "dropped", "battery_pct",
"free_heap"}`` with the lock's clock (``ts_ms``) as the record's lock time -- the
sightings the Spark offline report reads -- at most one record per lock per
``heartbeat_record_gap_s`` (default: the heartbeat interval), whatever it sends.
Heartbeats also count inside the per-lock message rate (``Guard.check_heartbeat``):
a lock flooding heartbeats gets RATE_LIMITED answers, keeps its connection, and its
events flow again as soon as its budget refills. Without these two bounds 5,000
heartbeats were 5,000 stored records (issue 10 item 8).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from .firmware_bundles import lock_firmware
from lockmq.config import DevicesSection
from lockmq.protocol import Disconnect, Flag, Heartbeat, Op
from lockmq.security import BrokerGuard, SecurityError

from .logs import EventLog, Stats
from .peer import Connections, Handler, Peer
from .periodic import start_periodic, stop_task


#: ``publish_system(topic, payload, lock_ts_ms=0)``: store a broker record
#: (``BrokerCore.publish_system``)
PublishSystem = Callable[..., None]


_DEBUG = 10   # logging.DEBUG: the level of the per-lock event lines
#: events logged whatever the level (the others only at DEBUG)
_ALWAYS_LOGGED = frozenset(("evicted", "broker_start"))
#: JSON string literal of a str, the C encoder ``json.dumps`` itself uses (ASCII)
_json_str = json.encoder.encode_basestring_ascii


def event_json(sn: str, event: str, ts_ms: int, peer: str, reason: str = "") -> bytes:
    """The ``$devices`` record of one event: the bytes of ``json.dumps(body,
    separators=(",", ":"))`` for the body in the module docstring (``sn`` and
    ``reason`` left out when empty), built without a dict: a storm writes two per
    lock."""
    head = '{"sn":%s,"event":%s,' % (_json_str(sn), _json_str(event)) if sn else \
        '{"event":%s,' % _json_str(event)
    tail = ',"reason":%s}' % _json_str(reason) if reason else "}"
    return ('%s"ts_ms":%d,"peer":%s%s' % (head, ts_ms, _json_str(peer), tail)).encode()


#: locks remembered as offline (with their last-seen time) at most
MAX_GONE = 100_000


class Devices:
    """The locks online now, keyed by SN (one connection per SN)."""

    def __init__(self, cfg: DevicesSection, stats: Stats, log: EventLog, guard: BrokerGuard,
                 publish_system: PublishSystem, connections: Connections) -> None:
        self.cfg = cfg
        self.stats = stats
        self.log = log
        self.guard = guard
        self.publish_system = publish_system
        #: every open connection (the silence sweep closes any of them)
        self.connections = connections
        self.online_by_sn: dict[str, Peer] = {}
        #: locks that went offline since the broker started: SN -> (wall time, reason),
        #: the oldest first; at most MAX_GONE (an SN flood must not grow it forever)
        self.gone: dict[str, tuple[float, str]] = {}
        self._task: asyncio.Task[Any] | None = None
        #: heartbeat records: at most one per lock per slot of this many seconds
        self.record_gap_s = cfg.heartbeat_record_gap_s or cfg.heartbeat_s
        #: SN -> the slot (monotonic time // record_gap_s) of its last stored record;
        #: kept across reconnects so that reconnecting does not buy extra records
        self._hb_slot: dict[str, int] = {}
        for name in ("heartbeats", "heartbeats_refused", "heartbeat_records",
                     "heartbeat_records_skipped"):
            stats.c.setdefault(name, 0)

    def handlers(self) -> dict[int, Handler]:
        """This feature's part of the connection's dispatch table."""
        return {Op.HEARTBEAT: self.on_heartbeat}

    def on_heartbeat(self, peer: Peer, frame: Any) -> None:
        """A HEARTBEAT frame: counted inside the per-lock rate, recorded, answered."""
        peer.heartbeat = hb = Heartbeat.decode(frame.body)
        try:   # heartbeats count inside the per-lock rate (issue 10 item 8)
            self.check_heartbeat(peer)
        except SecurityError as exc:   # RateLimited: answer it, keep the link
            if not frame.flags & Flag.ONEWAY:
                peer.refused(exc, frame.opaque)
            return
        if peer.is_device and frame.body:
            self.heartbeat(peer, hb)
        if not frame.flags & Flag.ONEWAY:
            peer.send_frame(Op.HEARTBEAT, b"", frame.opaque, Flag.RESPONSE)

    def start(self) -> None:
        """Start the silence sweep."""
        self._task = start_periodic("lockmq-devices", self.cfg.sweep_interval_s,
                                    self.evict_silent, self.log)

    async def stop(self) -> None:
        """Stop the sweep."""
        await stop_task(self._task)

    def _event(self, sn: str, event: str, peer: str, reason: str = "") -> None:
        self.publish_system(self.cfg.events_topic,
                            event_json(sn, event, int(time.time() * 1000), peer, reason))
        # one line per lock event only at DEBUG (a storm of 10,000 locks would flood
        # the log); evictions and broker events are always logged
        if self.log.level > _DEBUG and event not in _ALWAYS_LOGGED:
            return   # (the call and its fields cost ~1 µs per event in a storm)
        self.log("device_" + event, sn=sn or None, peer=peer, reason=reason or None,
                 online=len(self.online_by_sn),
                 level="info" if event in _ALWAYS_LOGGED else "debug")

    def online(self, conn: Peer) -> None:
        """A lock authenticated: register it (closing an older connection of its SN)."""
        sn = conn.principal.name
        old = self.online_by_sn.get(sn)
        if old is not None and old is not conn:
            old.is_device = False
            self._event(sn, "offline", old.peer, "replaced")
            self.stats.inc("devices_offline_events")
            old.send_frame(Op.DISCONNECT, Disconnect(0, "replaced by a new connection of "
                                                        "this SN").encode())
            old.close("replaced")
        self.online_by_sn[sn] = conn
        self.gone.pop(sn, None)
        conn.is_device = True
        self.stats.inc("devices_online_events")
        self._event(sn, "online", conn.peer)

    def broker_started(self) -> None:
        """Tell ``$devices`` consumers that every lock is offline until it reconnects
        (after a crash no ``offline`` events were written)."""
        self._event("", "broker_start", "")

    def offline(self, conn: Peer, event: str = "offline", reason: str = "") -> None:
        """A lock's connection ended (``event`` is ``offline`` or ``evicted``)."""
        if not conn.is_device:
            return
        conn.is_device = False
        sn = conn.principal.name
        if self.online_by_sn.get(sn) is conn:
            del self.online_by_sn[sn]
        if event == "evicted":
            self.stats.inc("devices_evicted")
            reason = f"silent {self.cfg.evict_after_s:g} s"
        else:
            self.stats.inc("devices_offline_events")
            reason = reason or "disconnected"
        if sn not in self.online_by_sn:   # (not when a new connection replaced it)
            self.gone.pop(sn, None)
            self.gone[sn] = (time.time(), reason)
            if len(self.gone) > MAX_GONE:
                del self.gone[next(iter(self.gone))]
        self._event(sn, event, conn.peer, reason)

    def evict_silent(self) -> None:
        """Close every connection silent for longer than ``evict_after_s``."""
        cfg = self.cfg
        limit = time.monotonic() - cfg.evict_after_s
        for conn in list(self.connections.by_id.values()):
            if conn.last_seen < limit and conn.established:
                conn.send_frame(Op.DISCONNECT, Disconnect(
                    0, f"no heartbeat for {cfg.evict_after_s:g} s").encode())
                conn.close("evicted")

    def check_heartbeat(self, conn: Peer) -> None:
        """Count a HEARTBEAT inside its sender's per-lock rate, or raise the guard's
        RATE_LIMITED error (the caller answers it; the connection stays).

        The heartbeat the lock's interval calls for (none answered in the last half
        interval on this connection) is never refused, so a lock busy at its rate
        limit is not cut off; every extra one takes from the budget its events use.
        """
        self.stats.c["heartbeats"] += 1
        if conn.principal is None:
            return
        now = time.monotonic()
        last = conn.heartbeat_answered_at
        due = last is None or now - last >= self.cfg.heartbeat_s / 2
        try:
            self.guard.check_heartbeat(conn.principal, due=due)
        except SecurityError:
            self.stats.c["heartbeats_refused"] += 1
            raise
        conn.heartbeat_answered_at = now

    def heartbeat(self, conn: Peer, hb: Any) -> None:
        """A lock's HEARTBEAT: publish it to the heartbeats topic (if set), at most one
        record per lock per ``heartbeat_record_gap_s``."""
        topic = self.cfg.heartbeats_topic
        if not topic or not conn.is_device:
            return
        sn = conn.principal.name
        slot = int(time.monotonic() // self.record_gap_s)
        if self._hb_slot.get(sn) == slot:
            self.stats.c["heartbeat_records_skipped"] += 1
            return
        if len(self._hb_slot) > 2 * len(self.online_by_sn) + 1024:
            # only this slot's entries still matter: a later heartbeat is in a later slot
            self._hb_slot = {k: v for k, v in self._hb_slot.items() if v == slot}
        self._hb_slot[sn] = slot
        self.stats.c["heartbeat_records"] += 1
        body = {"sn": conn.principal.name, "ts_ms": hb.ts_ms, "uptime_s": hb.uptime_s,
                "queued": hb.queued, "dropped": hb.dropped,
                "battery_pct": None if hb.battery_pct == 255 else hb.battery_pct,
                "free_heap": hb.free_heap}
        self.publish_system(topic, json.dumps(body, separators=(",", ":")).encode(),
                                        lock_ts_ms=hb.ts_ms)

    def online_lock(self, sn: str) -> Peer | None:
        """The connection of lock ``sn`` if it is online now."""
        return self.online_by_sn.get(sn)

    def offline_info(self) -> list[dict[str, Any]]:
        """The ``devices.offline`` admin op: locks that went offline since the broker
        started and are not back, longest gone first, with when and why."""
        now = time.time()
        return [{"sn": sn, "last_seen_ms": int(t * 1000), "offline_s": round(now - t, 1),
                 "reason": reason} for sn, (t, reason) in self.gone.items()]

    def info(self, sn: str | None = None) -> list[dict[str, Any]]:
        """The ``devices`` admin op: locks online now (only lock ``sn`` when given)."""
        out = []
        now = time.monotonic()
        if sn is None:
            online = sorted(self.online_by_sn.items())
        else:               # one dict lookup: no copy of a fleet to check one lock
            conn = self.online_by_sn.get(sn)
            online = [(sn, conn)] if conn is not None else []
        for sn, conn in online:
            hb = conn.heartbeat
            d: dict[str, Any] = {"sn": sn, "peer": conn.peer,
                                 "since_ms": int(conn.connected_at * 1000),
                                 "idle_s": round(now - conn.last_seen, 3)}
            connect = getattr(conn.session, "connect", None)   # what it said at CONNECT
            if connect is not None:
                d.update(lock_firmware(connect.client))
            if hb is not None:
                d.update({"uptime_s": hb.uptime_s, "queued": hb.queued, "dropped": hb.dropped,
                          "battery_pct": None if hb.battery_pct == 255 else hb.battery_pct,
                          "free_heap": hb.free_heap})
            out.append(d)
        return out
