"""The broker process: listeners, the pieces wired together, start-up and shutdown.

:class:`Broker` is where the pieces are wired, explicitly and once: each gets the
narrow collaborators it uses (settings, counters, log, the guard, a callback),
never the broker itself; connections get one :class:`~.services.Services`, whose
``handlers`` table each feature contributes its opcodes to, here and once.

The counterpart of the paper's SmartDepBrokerServer (Netty boss/worker): the event
loop (uvloop when installed) accepts connections and runs every connection's
:class:`~lockmq.broker.connection.Connection`; the store's writer thread does the
group-commit fsync. ``run(config)`` is what ``lockmq broker`` calls.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sqlite3
import ssl
import sys
from functools import partial
from typing import Callable

from lockmq.clock import SYSTEM_CLOCK, Clock
from lockmq.config import Config, ConfigError
from lockmq.protocol import Disconnect, ErrorCode, Op
from lockmq.security import BrokerGuard
from lockmq.store import StoreLocked
from lockmq.registry.announce import Announcer, broker_announcer
from lockmq.mqtt import MqttServer, start_mqtt
from lockmq.rlimits import raise_nofile_limit
from lockmq.signals import ignore_stop_signals, reload_on_sighup, stop_on_signals
from lockmq.replication.primary import primary_source
from lockmq.replication.standby import follow_if_standby

from .firmware_bundles import FirmwareBundles
from .admin import Admin
from .admission import Admission
from .auth import make_guard
from .clusters import ClusterError, Member
from .commands import Commands
from .connection import CONNECTION_HANDLERS, Connection
from .consumers import Consumers
from .core import BrokerCore
from .devices import Devices
from .intake import PUBLISH_HANDLERS
from .lane import Lane
from .logs import EventLog, EventLogHandler, Stats
from .peer import Connections, handler_table
from .publish import PublishPath
from .reload import apply_live, plan
from .scheduler import Scheduler
from .services import Services
from .status import StatusPage
from .transactions import Transactions

#: file descriptors kept for the store, logs and the status page
FD_RESERVE = 64


def _somaxconn() -> int | None:
    try:
        with open("/proc/sys/net/core/somaxconn") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


class Broker:
    """One running broker. ``await start()``, then ``await stop()``."""

    def __init__(self, config: Config, log: EventLog | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """``clock`` dates records and ages segments and clusters (lockmq.clock): a
        test or ``bench/soak.py`` passes a ManualClock to a broker in a thread."""
        self.config = config
        #: the broker closes the log (its file) on stop only if it opened it
        self._owns_log = log is None
        self.log = log or EventLog(config.broker.log_level, config.broker.log_format,
                                   log_file=config.broker.log_file)
        log, stats = self.log, Stats()
        self.stats = stats
        self.core = BrokerCore(config, log, stats, clock)
        self.guard: BrokerGuard = make_guard(config, log)
        self.connections = Connections()
        #: the open connections by id (read by the status page and admin views)
        self.conns = self.connections.by_id
        self.devices = Devices(config.devices, stats, log, self.guard,
                               self.core.publish_system, self.connections)
        #: the one rights decision where a message or command takes effect, and the
        #: watcher that ends a revoked principal's sessions and pending work
        self.admission = Admission(self.guard, stats, log, self.connections,
                                   reserve_pct=config.commands.admin_reserve_pct)
        self.commands = Commands(config.commands, stats, log, self.guard,
                                 self.devices.online_lock, admission=self.admission)
        self.admin = Admin(config, stats, log, self.guard, self.core, self.devices,
                           self.commands, self.connections, self.listening_sockets,
                           admission=self.admission)
        self.publisher = PublishPath(self.core, stats, log, config.broker.max_publish_batch)
        self.scheduler = Scheduler(config.scheduled, self.core, self.publisher, self.commands,
                                   self.guard, stats, log, lambda: self.connections.closing)
        self.admin.declare({"scheduled.list": self.scheduler.list_op,
                            "scheduled.result": self.scheduler.result_op,
                            "scheduled.cancel": self.scheduler.cancel_op})
        self.transactions = Transactions(config.transactions, self.core, self.guard, stats, log,
                                         self.commands)
        self.admin.declare({"txn.list": self.transactions.admin_list,
                            "txn.resolve": self.transactions.admin_resolve})
        #: steady publish reads below Python (lane.py); None without the compiled path
        self.lane = Lane(self.publisher, self.connections, stats, config.broker.max_frame) \
            if Lane.available() else None
        #: firmware bundles for over-the-air updates (fw.put / fw.list, FW_FETCH)
        self.firmware = FirmwareBundles(config.broker.data_dir, stats, log, self.devices.info,
                                        lambda: getattr(self.guard, "registry", None))
        self.admin.declare(self.firmware.ops())
        self.consumers = Consumers(config.consumers, stats, log, self.guard, self.core)
        #: the one dispatch table: each opcode served after the handshake, and by whom
        self.handlers = handler_table(
            CONNECTION_HANDLERS, PUBLISH_HANDLERS, self.devices.handlers(),
            self.consumers.handlers(), self.commands.handlers(), self.admin.handlers(),
            self.scheduler.handlers(), self.transactions.handlers(),
            {Op.FW_FETCH: self.firmware.on_fetch})
        self.services = Services(config, stats, log, self.guard, self.core, self.publisher,
                                 self.devices, self.commands, self.consumers,
                                 self.connections, self.admission, self.handlers,
                                 lane=self.lane)
        self.status = StatusPage(config.broker, stats, log, self.admin, self.devices,
                                 authorize=self.guard.authorize_status)
        self.status.firmware = self.firmware.gauges
        self.server: asyncio.base_events.Server | None = None
        self.servers: list[asyncio.base_events.Server] = []
        self.port = 0
        # replication's primary side: the replica.* ops, and in sync mode the core's gate
        self.replication = primary_source(config, self.core, stats, log)
        self.admin.declare(self.replication.ops())
        if self.replication.durable_gate is not None:
            self.core.gate_acks(self.replication.durable_gate)
        self.status.extra_gauges.append(self.replication.gauges)
        self.tls_port = 0
        self.status_port = 0
        self._stopped = asyncio.Event()
        self._store_log: EventLogHandler | None = None
        #: [registry]: registers this gateway once it listens (None: no registries)
        self.announcer: Announcer | None = broker_announcer(
            config, self.core.topics, lambda: (self.port, self.tls_port), log)
        self.mqtt: MqttServer | None = None        # [mqtt]: the MQTT listener (lockmq.mqtt)
        #: the TLS listeners' context (None without TLS); a reload loads a new
        #: certificate into it
        self.tls_context: ssl.SSLContext | None = None
        #: connections the open-file limit allows (set at start)
        self.fd_limit = 0
        self.reloads = 0

    @property
    def max_connections(self) -> int:
        """Most connections the broker holds at once (set at start)."""
        return self.connections.limit

    @property
    def closing(self) -> bool:
        """The broker is shutting down."""
        return self.connections.closing

    # -- life cycle -------------------------------------------------------------------

    def listening_sockets(self) -> list[socket.socket]:
        """The protocol listeners' sockets (plain and TLS; none before :meth:`start`)."""
        return [sock for srv in self.servers for sock in srv.sockets]  # type: ignore[misc]

    async def start(self) -> None:
        """Open the store, listen, and log how many connections the broker can hold."""
        cfg = self.config.broker
        soft, hard = raise_nofile_limit()
        fd_limit = self.fd_limit = max(16, soft - FD_RESERVE)
        self.connections.limit = min(cfg.max_connections, fd_limit) if cfg.max_connections \
            else fd_limit
        self._store_log = EventLogHandler(self.log, "store_log")
        store_logger = logging.getLogger("lockmq.store")
        store_logger.addHandler(self._store_log)
        store_logger.setLevel(logging.INFO)
        self.core.open()
        self.transactions.start()   # pending half messages rebuilt from the log
        await self.scheduler.start()
        loop = asyncio.get_running_loop()
        ctx = self.tls_context = self.guard.tls_context()
        services = self.services
        for lst in self.guard.listeners(cfg.port):
            tls = bool(lst["tls"]) and ctx is not None
            srv = await loop.create_server(
                partial(Connection, services, tls), cfg.host, lst["port"], backlog=cfg.backlog,
                reuse_address=True, ssl=ctx if tls else None,
                ssl_handshake_timeout=cfg.handshake_timeout_s if tls else None)
            port = srv.sockets[0].getsockname()[1]
            for s in srv.sockets:
                try:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            self.guard.log_listener(port, tls)
            self.servers.append(srv)
            if self.server is None:
                self.server, self.port = srv, port
                self.status.title = f"lockmq broker :{port}"
            if tls:
                self.tls_port = port
        if cfg.status_port:   # -1 (ANY_FREE_PORT): the kernel picks; logged below
            self.status_port = await self.status.start(cfg.status_host, max(cfg.status_port, 0))
        if self.lane is not None:
            self.lane.start(loop)
        self.devices.start()
        self.commands.start()
        self.admission.start()
        self.devices.broker_started()
        if self.announcer is not None:
            self.announcer.start()
        self.mqtt = await start_mqtt(self.config, self.core, self.publisher, self.commands,
                                     self.guard, self.log, self.stats, Member, ClusterError)
        if self.mqtt is not None:
            self.status.extra_gauges.append(self.mqtt.gauges)
        smax = _somaxconn()
        self.log("broker_started", host=cfg.host, port=self.port, tls_port=self.tls_port or None,
                 status_port=self.status_port or None, data_dir=cfg.data_dir,
                 max_connections=self.max_connections, nofile_soft=soft, nofile_hard=hard,
                 backlog=min(cfg.backlog, smax) if smax else cfg.backlog,
                 loop=type(loop).__module__.split(".")[0],
                 # what the guard in use does, not what a file said (no silent off)
                 auth=self.guard.auth_mode,
                 flush=self.core.store.config.flush if self.core.store else None)
        if smax is not None and smax < cfg.backlog:
            self.log("backlog_capped", asked=cfg.backlog, somaxconn=smax, level="warning",
                     hint="raise net.core.somaxconn for connection storms")

    def reload(self, load: Callable[[], Config]) -> bool:
        """Read the configuration again (SIGHUP) and apply what can change live
        (lockmq.broker.reload); the rest is logged as ``needs_restart``. A new
        configuration the validator refuses, or whose certificate does not load,
        changes nothing: the broker goes on with the one it has. True if applied."""
        if self.closing:
            return False
        try:
            new = load()
            sec = new.security
            changes = plan(self.config, new)
            tls_live = self.tls_context is not None and bool(sec.get("tls_cert"))
            certificate = sec.get("tls_cert") if tls_live else None
            if not tls_live:   # TLS turned on or off needs new listeners
                moved = [k for k in changes.live if k.startswith("security.")]
                changes.live = [k for k in changes.live if k not in moved]
                changes.needs_restart = sorted(changes.needs_restart + moved)
            else:   # the new pair must load before the running context is touched
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
                    sec["tls_cert"], sec.get("tls_key") or None)
            apply_live(self, new, changes)
        except (OSError, ValueError, ssl.SSLError, sqlite3.Error) as exc:
            error = str(exc) if isinstance(exc, ConfigError) else \
                f"{type(exc).__name__}: {exc}"
            self.log("config_reload_refused", level="error", error=error,
                     hint="the broker keeps running on its previous configuration")
            return False
        self.reloads += 1
        self.log("config_reloaded", level="warning" if changes.needs_restart else "info",
                 changed=",".join(changes.live) or "-",
                 needs_restart=",".join(changes.needs_restart) or None,
                 connections=len(self.conns), certificate_reloaded=certificate,
                 hint="restart the broker to apply needs_restart"
                 if changes.needs_restart else None)
        return True

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting, answer in-flight writes, flush, close."""
        if self.closing:
            await self._stopped.wait()
            return
        self.connections.closing = True
        if self.lane is not None:   # publishes from now on are answered SHUTTING_DOWN
            self.lane.leave_all()
        self.log("broker_stopping", connections=len(self.conns))
        self.replication.release_for_shutdown()   # acks held for a standby go out now
        for srv in self.servers:
            srv.close()
        await self.status.stop()
        if self.mqtt is not None:
            await self.mqtt.stop()
        if self.announcer is not None:
            await self.announcer.stop()
        await self.devices.stop()
        await self.commands.stop()
        await self.admission.stop()
        await self.scheduler.stop()
        await self.transactions.stop()
        # locks go offline with the broker (consumers of $devices see it)
        for conn in list(self.devices.online_by_sn.values()):
            self.devices.offline(conn, "offline", reason="broker shutdown")
        # let publishes already handed to the store finish and be acked
        grace = self.config.broker.shutdown_grace_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline and (self.connections.publishes_pending()
                                          or (self.lane is not None and self.lane.in_flight)):
            await asyncio.sleep(0.01)
        bye = Disconnect(int(ErrorCode.SHUTTING_DOWN), "the broker is shutting down").encode()
        for conn in list(self.conns.values()):
            if conn.established:
                conn.send_frame(Op.DISCONNECT, bye)
            conn.flush()
            conn.close("broker shutdown")
        if self.lane is not None:
            self.lane.stop()
        await self.core.close()
        try:
            self.guard.close()
        except Exception:  # noqa: BLE001
            pass
        for srv in self.servers:
            try:
                await asyncio.wait_for(srv.wait_closed(), 1.0)
            except asyncio.TimeoutError:
                pass
        if self._store_log is not None:
            logging.getLogger("lockmq.store").removeHandler(self._store_log)
        self.log("broker_stopped", stats=None, **{k: self.stats.c[k] for k in (
            "publish_stored", "messages_delivered", "acks")})
        if self._owns_log:
            self.log.close()
        self._stopped.set()


#: gen-0 threshold of the broker process (CPython's default is 700): delivery makes
#: a few short-lived tracked objects per message (leases, lists), so the default
#: runs a young collection every ~200 messages.
GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    """Make the cyclic GC cheap for a long-running broker (process-wide).

    ``gc.freeze()`` moves everything alive after start-up (modules, config, the
    store's recovered tables) out of the collector's reach, so full collections only
    walk what the broker allocated since; a larger gen-0 threshold runs the young
    collections less often. Cyclic garbage is still collected, just in larger steps.
    """
    gc.collect()
    gc.freeze()
    _g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(max(_g0, GC_GEN0_THRESHOLD), g1, g2)


async def serve(config: Config, ready: Callable[[Broker], None] | None = None,
                tune_gc: bool = False, reload: Callable[[], Config] | None = None) -> None:
    """Run a broker until SIGTERM or SIGINT, then shut down gracefully; SIGHUP
    reloads the configuration with ``reload()`` (:meth:`Broker.reload`; without
    ``reload`` it is logged and ignored).

    ``tune_gc`` (set by :func:`run`, which owns the process) applies :func:`_tune_gc`
    once the broker has started."""
    # SIGHUP's default is to end the process: handled before anything else.
    reloads = reload_on_sighup()
    try:
        if not await follow_if_standby(config):   # a standby follows until promoted
            return
        # Handlers first: systemd may send SIGTERM as soon as the port accepts connections.
        stop = stop_on_signals()
        broker = Broker(config)
        try:
            await broker.start()
        except BaseException:
            if broker.core.store is not None:   # started half-way: release the data dir
                await broker.core.close()
            raise
        if ready is not None:
            ready(broker)
        if tune_gc:
            _tune_gc()
        reloader = asyncio.ensure_future(_reload_on_request(broker, reloads, reload))
        await stop.wait()
        reloader.cancel()
        broker.log("signal", action="shutdown")
        await broker.stop()
    finally:   # stopped (or failed): a signal from here to the exit changes nothing
        ignore_stop_signals()


async def _reload_on_request(broker: Broker, requested: asyncio.Event,
                             load: Callable[[], Config] | None) -> None:
    """Reload each time SIGHUP set ``requested`` (one reload for a burst of them)."""
    while True:
        await requested.wait()
        requested.clear()
        if load is None:
            broker.log("signal", action="reload_unavailable", level="warning",
                       hint="this broker was started without a configuration to re-read")
            continue
        broker.log("signal", action="reload")
        broker.reload(load)


def run(config: Config, reload: Callable[[], Config] | None = None) -> int:
    """Run the broker in this process (uvloop when installed); returns an exit code.
    ``reload`` reads the configuration again on SIGHUP (see :func:`serve`)."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        uvloop = None
    try:
        if uvloop is not None:
            if sys.version_info >= (3, 12):
                uvloop.run(serve(config, tune_gc=True, reload=reload))
            else:
                uvloop.install()
                asyncio.run(serve(config, tune_gc=True, reload=reload))
        else:
            asyncio.run(serve(config, tune_gc=True, reload=reload))
    except KeyboardInterrupt:
        return 130
    except (OSError, StoreLocked) as exc:
        # port in use, data directory held by another broker, no permission ...
        log = EventLog(config.broker.log_level, config.broker.log_format,
                       log_file=config.broker.log_file)
        log("broker_failed", level="error", error=str(exc) or repr(exc))
        log.close()
        return 1
    return 0
