"""Admin operations: ADMIN_REQUEST ``{"op": name, "args": {...}}`` -> ADMIN_RESPONSE.

Every reply is a JSON object with ``"ok": true`` and the op's fields, or
``{"ok": false, "error": CODE_NAME, "message": "..."}``. The ops and their replies
are documented in docs/operators.md ("Admin operations"). Every op needs an admin
principal (the connection asks ``guard.check_admin`` first); locks get none.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Callable, Mapping

from lockmq.admin_error import AdminError
from lockmq.config import Config
from lockmq.protocol import Flag, Op, decode_json, encode_json
from lockmq.security import BrokerGuard, SecurityError
from lockmq.store import NewRecord

from .acceptq import accept_queue, tcp_ext_counters
from .clusters import DLQ_PREFIX, RETRY_PREFIX
from .commands import Commands
from .core import BrokerCore
from .devices import Devices
from .logs import EventLog, Stats
from .peer import Connections, Handler, Peer


MAX_LIST = 1000


def _int(args: dict[str, Any], key: str, default: int, lo: int = 0, hi: int = 1 << 62) -> int:
    v = args.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise AdminError("INVALID_ARGUMENT", f"{key} must be an integer in [{lo}, {hi}]")
    return v


def _str(args: dict[str, Any], key: str) -> str:
    v = args.get(key)
    if not isinstance(v, str) or not v:
        raise AdminError("INVALID_ARGUMENT", f"{key} (a non-empty string) is required")
    return v


class Admin:
    """Dispatches admin requests to the broker's views."""

    def __init__(self, config: Config, stats: Stats, log: EventLog, guard: BrokerGuard,
                 core: BrokerCore, devices: Devices, commands: Commands,
                 connections: Connections,
                 listeners: Callable[[], list[socket.socket]] = list,
                 admission: Any = None) -> None:
        """``admission``: the one rights decision (admission.py; None: the guard's
        check alone). More ops are declared with :meth:`declare` while the broker is
        built."""
        # (named apart from the ops of the same names below)
        self.cfg = config
        self.counters = stats
        self.log = log
        self.guard = guard
        self.core = core
        self.online_devices = devices
        self.pending_commands = commands
        self.open_connections = connections
        self.admission = admission
        #: the protocol listeners' sockets (their accept queue, in ``stats``)
        self.listeners = listeners
        self.ops: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": self.ping,
            "stats": self.stats,
            "topics": self.topics,
            "clusters": self.clusters,
            "devices": self.devices,
            "devices.offline": self.devices_offline,
            "connections": self.connections,
            "commands": self.commands,
            "config": self.config,
            "dlq.list": self.dlq_list,
            "dlq.replay": self.dlq_replay,
            "clusters.reset": self.clusters_reset,
            "clusters.delete": self.clusters_delete,
        }

    def declare(self, ops: Mapping[str, Callable[[dict[str, Any]], Any]]) -> None:
        """Add a feature's ops (``scheduled.*``, ``txn.*``, ``fw.*``, ``replica.*``)
        while the broker is built; an op name declared twice is a wiring bug."""
        taken = sorted(set(ops) & set(self.ops))
        if taken:
            raise ValueError(f"admin ops declared twice: {', '.join(taken)}")
        self.ops.update(ops)

    def handlers(self) -> dict[int, Handler]:
        """This feature's part of the connection's dispatch table."""
        return {Op.ADMIN_REQUEST: self.on_request}

    def on_request(self, peer: Peer, frame: Any) -> None:
        """An ADMIN_REQUEST frame: the rights checked, the op run, ADMIN_RESPONSE (once
        the op's awaitable is done, for a write op)."""
        req = decode_json(frame.body)
        self.counters.c["admin_requests"] += 1
        principal = peer.principal
        try:
            (self.admission or self.guard).check_admin(principal, str(req.get("op", "")))
        except SecurityError as exc:
            peer.send_frame(Op.ADMIN_RESPONSE, encode_json(
                {"ok": False, "error": "FORBIDDEN",
                 "message": exc.public_message or str(exc)}),
                frame.opaque, Flag.RESPONSE)
            return
        reply = self.handle(principal, req)
        if asyncio.isfuture(reply) or asyncio.iscoroutine(reply):
            async def later() -> None:
                out = await reply
                peer.send_frame(Op.ADMIN_RESPONSE, encode_json(out), frame.opaque,
                                Flag.RESPONSE)
            asyncio.ensure_future(later())
            return
        peer.send_frame(Op.ADMIN_RESPONSE, encode_json(reply), frame.opaque, Flag.RESPONSE)

    def handle(self, principal: Any, req: dict[str, Any]) -> Any:
        """Answer one request (a dict, or an awaitable of one for write ops)."""
        op = req.get("op")
        args = req.get("args") or {}
        try:
            if principal is None or getattr(principal, "kind", "") == "lock":
                raise AdminError("FORBIDDEN", "locks may not use admin operations")
            # (the connection already asked guard.check_admin)
            if not isinstance(op, str) or op not in self.ops:
                raise AdminError("INVALID_ARGUMENT",
                                 f"unknown op {op!r}; ops: {', '.join(sorted(self.ops))}")
            if not isinstance(args, dict):
                raise AdminError("INVALID_ARGUMENT", "args must be a JSON object")
            out = self.ops[op](args)
        except AdminError as exc:
            return {"ok": False, "error": exc.code, "message": exc.message}
        if hasattr(out, "__await__"):
            return self._finish(out)
        return out

    async def _finish(self, aw: Any) -> dict[str, Any]:
        try:
            return await aw
        except AdminError as exc:
            return {"ok": False, "error": exc.code, "message": exc.message}
        except Exception as exc:  # noqa: BLE001 -- e.g. StoreBusy
            return {"ok": False, "error": "BUSY" if "Busy" in type(exc).__name__ else "INTERNAL",
                    "message": str(exc)}

    # -- read-only ops ----------------------------------------------------------------

    def ping(self, args: dict[str, Any]) -> dict[str, Any]:
        """``ping``: liveness and server time."""
        return {"ok": True, "server_time_ms": int(time.time() * 1000)}

    def stats(self, args: dict[str, Any]) -> dict[str, Any]:
        """``stats``: broker counters, store counters, per-cluster counters, gauges."""
        store = self.core.store
        return {"ok": True, "broker": self.counters.snapshot(),
                "store": dict(store.stats) if store else {},
                "log_bytes": (store.log_end - store.log_start) if store else 0,
                "connections": len(self.open_connections),
                "max_connections": self.open_connections.limit,
                "devices_online": len(self.online_devices.online_by_sn),
                "accept_queue": self._accept_queue(),
                "auth": self.guard.auth_mode,
                "security": self.guard.status(),
                "clusters": {c.name: dict(c.stats, inflight=len(c.leases),
                                          backlog=c.backlog(), capped=c.capped)
                             for c in self.core.clusters.values()}}

    def _accept_queue(self) -> dict[str, int]:
        """Connections the kernel holds for the listeners to accept now, their queues'
        size, and the handshakes the host dropped because a queue was full (its
        ``ListenOverflows``: every listener of the host, since boot); -1 where the
        kernel cannot tell (see ``acceptq``)."""
        queue = accept_queue(self.listeners())
        host = tcp_ext_counters(("ListenOverflows",))
        return {"waiting": queue[0] if queue else -1, "size": queue[1] if queue else -1,
                "host_listen_overflows": host["ListenOverflows"] if host else -1}

    def topics(self, args: dict[str, Any]) -> dict[str, Any]:
        """``topics``: every topic, its queue range and its clusters."""
        return {"ok": True, "topics": self.core.topics_info()}

    def clusters(self, args: dict[str, Any]) -> dict[str, Any]:
        """``clusters`` [cluster]: members, in-flight, backlog/lag per cluster."""
        out = self.core.clusters_info()
        name = args.get("cluster")
        if name:
            out = [c for c in out if c["name"] == name]
        return {"ok": True, "clusters": out}

    def devices(self, args: dict[str, Any]) -> dict[str, Any]:
        """``devices`` [sn]: locks online now, or only lock ``sn`` (none when offline)."""
        d = self.online_devices.info(_str(args, "sn") if "sn" in args else None)
        return {"ok": True, "count": len(d), "devices": d}

    def devices_offline(self, args: dict[str, Any]) -> dict[str, Any]:
        """``devices.offline``: locks that went offline since the broker started and
        have not come back, longest gone first (``sn``, ``last_seen_ms``,
        ``offline_s``, ``reason``)."""
        d = self.online_devices.offline_info()
        return {"ok": True, "count": len(d), "devices": d[:MAX_LIST],
                "truncated": len(d) > MAX_LIST}

    def connections(self, args: dict[str, Any]) -> dict[str, Any]:
        """``connections``: every open connection."""
        conns = [c.info() for c in list(self.open_connections.by_id.values())[:MAX_LIST]]
        return {"ok": True, "count": len(self.open_connections), "connections": conns}

    def commands(self, args: dict[str, Any]) -> dict[str, Any]:
        """``commands``: downlink commands waiting per lock."""
        return {"ok": True, **self.pending_commands.info()}

    def config(self, args: dict[str, Any]) -> dict[str, Any]:
        """``config``: the settings in force (security settings left out)."""
        d = self.cfg.to_dict()
        d.pop("security", None)
        return {"ok": True, "config": d}

    async def clusters_reset(self, args: dict[str, Any]) -> dict[str, Any]:
        """``clusters.reset`` {cluster, to: "earliest" | "latest" | queue offset,
        or time_ms, or shift_by (+/- messages from its position); dry_run: answer
        what it would do and change nothing}: move a cluster's position (replay a
        topic, or skip a backlog). The cluster must have no members connected."""
        name = _str(args, "cluster")
        core = self.core
        store = core.store
        assert store is not None
        live = core.clusters.get(name)
        if live is not None and live.members:
            raise AdminError("INVALID_ARGUMENT", f"cluster {name!r} has {len(live.members)} "
                             "members connected: stop them first")
        if live is not None:
            topic = live.topic
        else:
            saved = {t: p for t, p in store.load_positions(name).items()
                     if not t.startswith(RETRY_PREFIX)}
            if name not in store.clusters() or not saved:
                raise AdminError("INVALID_ARGUMENT", f"no cluster {name!r}")
            topic = next(iter(saved))
        before = live.main.committed if live is not None else \
            store.load_positions(name).get(topic, 0)
        if "shift_by" in args:   # kafka-consumer-groups --shift-by: relative to now
            shift = _int(args, "shift_by", 0, -(1 << 62))
            target = min(max(before + shift, store.queue_start(topic)),
                         store.queue_end(topic))
        elif "time_ms" in args:
            target = store.queue_offset_at_time(topic, _int(args, "time_ms", 0))
        else:
            to = args.get("to")
            if to == "earliest":
                target = store.queue_start(topic)
            elif to == "latest":
                target = store.queue_end(topic)
            elif isinstance(to, int) and not isinstance(to, bool) and to >= 0:
                target = min(max(to, store.queue_start(topic)), store.queue_end(topic))
            else:
                raise AdminError("INVALID_ARGUMENT",
                                 'to must be "earliest", "latest" or a queue offset '
                                 '(or give time_ms)')
        if args.get("dry_run") is True:   # what the reset would do, nothing changed
            return {"ok": True, "cluster": name, "topic": topic, "before": before,
                    "after": target, "dry_run": True}
        if live is not None:
            live.reset_to(target)
        await store.save_positions(name, {topic: target})
        self.log("cluster_reset", cluster=name, topic=topic, before=before, after=target)
        return {"ok": True, "cluster": name, "topic": topic, "before": before,
                "after": target}

    def clusters_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        """``clusters.delete`` {cluster}: forget a cluster -- its position, its owner,
        its topic binding -- so that the name is free again (e.g. taken by the wrong
        principal). No members may be connected. Its retry and dead-letter records
        stay until retention (``dlq.list`` still shows them); a new cluster of that
        name starts after them."""
        name = _str(args, "cluster")
        core = self.core
        live = core.clusters.get(name)
        if live is not None and live.members:
            raise AdminError("INVALID_ARGUMENT", f"cluster {name!r} has {len(live.members)} "
                             "members connected: stop them first")
        owner = core.cluster_owners.get(name, "")
        try:
            found = core.forget_cluster(name)
        except ValueError as exc:   # not a cluster name
            raise AdminError("INVALID_ARGUMENT", str(exc)) from None
        if not found:
            raise AdminError("INVALID_ARGUMENT", f"no cluster {name!r}")
        self.log("cluster_deleted", cluster=name, owner=owner,
                        topic=live.topic if live is not None else None)
        return {"ok": True, "cluster": name, "owner": owner}

    # -- dead letters -----------------------------------------------------------------

    def dlq_list(self, args: dict[str, Any]) -> dict[str, Any]:
        """``dlq.list`` {cluster, offset=0, limit=100}: dead letters of a cluster."""
        cluster = _str(args, "cluster")
        offset = _int(args, "offset", 0)
        limit = _int(args, "limit", 100, 1, MAX_LIST)
        store = self.core.store
        assert store is not None
        topic = DLQ_PREFIX + cluster
        recs = store.read(topic, offset, limit)
        msgs = []
        for r in recs:
            h = r.headers or {}
            payload = bytes(r.payload)
            msgs.append({
                "dlq_offset": r.queue_offset,
                "msg_id": f"{h.get('orig_sn', r.sn)}:{h.get('orig_seq', r.seq)}",
                "topic": h.get("orig_topic"), "sn": h.get("orig_sn"), "seq": h.get("orig_seq"),
                "reason": h.get("reason"), "deliveries": h.get("deliveries"),
                "retries": h.get("retries"), "dead_ms": h.get("dead_ms"),
                "lock_ts_ms": r.lock_ts_ms, "broker_ts_us": h.get("orig_broker_ts_us"),
                "payload_len": len(payload), "payload_hex": payload[:256].hex(),
            })
        end = store.queue_end(topic)
        return {"ok": True, "cluster": cluster, "queue_start": store.queue_start(topic),
                "queue_end": end, "messages": msgs,
                "next_offset": (recs[-1].queue_offset + 1) if recs else max(offset, end)}

    async def dlq_replay(self, args: dict[str, Any]) -> dict[str, Any]:
        """``dlq.replay`` {cluster, offset, count=1} or {cluster, offsets: [...]}: send dead
        letters back to the cluster (through ``$retry.<cluster>``, due now, retries 0)."""
        cluster = _str(args, "cluster")
        store = self.core.store
        assert store is not None
        topic = DLQ_PREFIX + cluster
        if "offsets" in args:
            offs = args["offsets"]
            if not isinstance(offs, list) or not all(isinstance(o, int) for o in offs) \
                    or len(offs) > MAX_LIST:
                raise AdminError("INVALID_ARGUMENT", "offsets must be a list of integers")
            wanted = sorted(set(offs))
        else:
            start = _int(args, "offset", 0)
            count = _int(args, "count", 1, 1, MAX_LIST)
            wanted = list(range(start, start + count))
        recs = []
        for o in wanted:
            got = store.read(topic, o, 1)
            if got and got[0].queue_offset == o and not (got[0].headers or {}).get("damaged"):
                recs.append(got[0])   # (a damaged record's entry has nothing to replay)
        if not recs:
            raise AdminError("INVALID_ARGUMENT", f"no dead letters at those offsets of {topic}")
        now = int(time.time() * 1000)
        out = []
        for r in recs:
            h = dict(r.headers or {})
            # due now on the steady scale retry due times are judged on (lockmq.clock)
            h.update({"due_ms": int(self.core.steady_ms()), "retries": 0, "deliveries": 0,
                      "reason": f"replayed from {topic}@{r.queue_offset}",
                      "replayed_ms": now})
            h["level"] = 0
            out.append(NewRecord(f"{RETRY_PREFIX}{cluster}.0", "", 0, r.lock_ts_ms,
                                 bytes(r.payload), h))
        live = self.core.clusters.get(cluster)
        if live is not None:
            for rec in out:
                live.replay_record(rec)
        res = await self.core.append_system(out)
        if any(a.duplicate for a in res):   # never report a replay that was not stored
            raise AdminError("INTERNAL", "the store took replayed records as duplicates")
        self.log("dlq_replay", cluster=cluster, count=len(out))
        return {"ok": True, "cluster": cluster, "replayed": len(out),
                "offsets": [r.queue_offset for r in recs]}
