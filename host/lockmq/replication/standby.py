"""The standby: follows the primary's log until it is promoted, then the process
goes on as an ordinary broker on the copy (``lockmq.broker.server.serve`` calls
:func:`follow_if_standby` first).

While it follows, the standby's client port refuses every CONNECT with an ERROR
(BUSY, "not the primary": :mod:`.refuser`): a lock or client moves on to the next
broker of its list (the firmware and ``lockmq.client`` both do). Promotion: ``lockmq standby promote``
drops the :data:`PROMOTE` file into the data directory; a promoted data directory
keeps a :data:`PROMOTED` marker so a restart never follows an old primary again.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from typing import TYPE_CHECKING, Any

from lockmq.eventlog import EventLog
from lockmq.signals import stop_on_signals
from lockmq.store.files import create_file, fsync_dir

from .logcopy import LogCopy, LogMismatch
from .registry_copy import MasterKeyMismatch, RegistryCopy
from .refuser import open_refuser
from .settings import FENCE_MARGIN_S, ReplicationSettings

if TYPE_CHECKING:   # (types only: lockmq.config aggregates this package's table)
    from lockmq.config import Config

#: dropped into the data directory by ``lockmq standby promote``
PROMOTE = "PROMOTE"
#: left in a promoted data directory: it is a primary from now on
PROMOTED = "PROMOTED"
#: pause between attempts while the primary is unreachable
RETRY_S = 0.1


def request_promotion(data_dir: str) -> None:
    """Ask the standby on ``data_dir`` to promote itself (what the CLI does)."""
    fd = create_file(os.path.join(data_dir, PROMOTE), os.O_WRONLY)
    os.fsync(fd)
    os.close(fd)


def is_promoted(data_dir: str) -> bool:
    """True once the standby on ``data_dir`` has been promoted."""
    return os.path.exists(os.path.join(data_dir, PROMOTED))


class Follower:
    """Fetches the primary's log into a :class:`LogCopy` until promotion or stop."""

    def __init__(self, config: Config, settings: ReplicationSettings, log: Any) -> None:
        self.config = config
        self.settings = settings
        self.log = log
        self.data_dir = config.broker.data_dir
        self.copy = LogCopy(config.store_config())
        sec = config.security_config()
        self.registry = RegistryCopy(sec.registry_path, sec.master_key_path)
        self._registry_due = 0.0
        self._admin: Any = None
        self._unreachable_since: float | None = None
        #: when the primary last answered a fetch (the fence's clock starts there)
        self._last_ok: float | None = None
        #: the primary's ``fence_after_s`` from its last answer (0: not fenced)
        self.primary_fence_s = 0.0
        #: the primary said in_sync in an answer since this standby started
        self.was_in_sync = False
        self.primary_log_end = 0
        self.promote_reason = ""
        self._unsafe_logged = False
        #: the standby's status page port (0: none), set before :meth:`run`
        self.status_port = 0

    def auto_promote_safe(self) -> str:
        """Why promoting by ``promote_after_s`` could serve beside a primary that still
        acks, or "" when it cannot: the primary is fenced, this standby was in sync,
        and the wait is longer than the fence by FENCE_MARGIN_S."""
        if not self.primary_fence_s:
            return "the primary has no fence ([replication] fence_after_s on the primary)"
        if not self.was_in_sync:
            return "this standby has not been in sync with the primary since it started"
        if self.settings.promote_after_s < self.primary_fence_s + FENCE_MARGIN_S:
            return (f"promote_after_s {self.settings.promote_after_s:g} is not at least the "
                    f"primary's fence_after_s {self.primary_fence_s:g} + {FENCE_MARGIN_S:g} s")
        return ""

    def _promotion_due(self) -> bool:
        if os.path.exists(os.path.join(self.data_dir, PROMOTE)):
            self.promote_reason = "requested"
            return True
        after = self.settings.promote_after_s
        if not after or self._unreachable_since is None:
            return False
        since = self._last_ok if self._last_ok is not None else self._unreachable_since
        if time.monotonic() - since < after:
            return False
        unsafe = self.auto_promote_safe()
        if unsafe and self.primary_fence_s:
            # a fenced primary but not safe to take over (not in sync, too short a
            # wait): waiting is the safe side; `lockmq standby promote` still works
            if not self._unsafe_logged:
                self._unsafe_logged = True
                self.log("standby_not_promoting", level="error", reason=unsafe,
                         hint="promote by hand (lockmq standby promote) once the "
                              "primary is known to be down")
            return False
        self.promote_reason = f"primary unreachable for {after} s" + (
            "" if not unsafe else " (unfenced primary: split brain possible)")
        return True

    async def _connect(self) -> Any:
        from lockmq.client.admin import AsyncAdmin
        from lockmq.client.session import Endpoint

        # one attempt per loop turn: the loop retries, and checks for promotion between
        endpoint = Endpoint.parse(self.settings.primary)
        endpoint.connect_retry_s = 0
        endpoint.connect_timeout_s = 5.0
        admin = AsyncAdmin(endpoint, token=self.settings.token or None,
                           client_id="standby", timeout_s=self.settings.fetch_wait_ms / 1000 + 5)
        await admin.connect()
        return admin

    async def _drop(self) -> None:
        if self._admin is not None:
            try:
                await self._admin.close()
            except Exception:  # noqa: BLE001 -- the link is gone anyway
                pass
            self._admin = None

    async def fetch_once(self) -> int:
        """One fetch: write what came; returns the bytes written."""
        if self._admin is None:
            self._admin = await self._connect()
            self.log("standby_connected", primary=self.settings.primary, log_end=self.copy.end)
            self._registry_due = 0.0   # (first: check the master key, copy the registry)
        if time.monotonic() >= self._registry_due:
            await self.sync_registry()
        resp = await self._admin.request("replica.fetch", **{
            "from": self.copy.end, "max_bytes": self.settings.fetch_max_bytes,
            "wait_ms": self.settings.fetch_wait_ms})
        self._last_ok = time.monotonic()
        self.primary_fence_s = float(resp.get("fence_after_s") or 0)
        self.primary_log_end = int(resp.get("log_end") or 0)
        if resp.get("in_sync"):
            self.was_in_sync = True
        data = base64.b64decode(resp.get("data") or "")
        if data:
            self.copy.append(int(resp["base"]), data, resp.get("qstart"))
        if resp.get("clusters"):
            self.copy.save_clusters(resp["clusters"])
        return len(data)

    async def sync_registry(self) -> None:
        """Copy the primary's security registry if it changed (connected)."""
        self._registry_due = time.monotonic() + self.settings.registry_every_s
        if await self.registry.sync(self._admin):
            self.log("standby_registry_installed", version=self.registry.version,
                     path=self.registry.db_path)

    async def _last_registry_sync(self) -> None:
        """Before promotion: one more registry copy if the primary still answers."""
        try:
            if self._admin is None:
                self._admin = await self._connect()
            await asyncio.wait_for(self.sync_registry(), 3.0)
        except MasterKeyMismatch:
            raise
        except Exception as exc:  # noqa: BLE001 -- the primary is usually dead by now
            self.log("standby_registry_not_refreshed", level="warning",
                     version=self.registry.version, error=str(exc) or repr(exc),
                     hint="serving the registry copied last (see registry_every_s)")

    async def run(self, stop: asyncio.Event) -> bool:
        """Follow until promoted (True) or ``stop`` is set (False)."""
        self.log("standby_following", primary=self.settings.primary, log_end=self.copy.end,
                 port=self.config.broker.port, status_port=self.status_port or None,
                 data_dir=self.data_dir, promote_after_s=self.settings.promote_after_s or None)
        try:
            while not stop.is_set():
                if self._promotion_due():
                    await self._last_registry_sync()
                    return True
                try:
                    await self.fetch_once()
                    if self._unreachable_since is not None:
                        self.log("standby_primary_back", log_end=self.copy.end)
                    self._unreachable_since = None
                except LogMismatch as exc:   # not this primary's log: never write over it
                    self.log("standby_log_mismatch", level="error", error=str(exc),
                             hint="start the standby from an empty data directory")
                    raise
                except MasterKeyMismatch as exc:   # its registry would be useless here
                    self.log("standby_master_key_mismatch", level="error", error=str(exc))
                    raise
                except Exception as exc:  # noqa: BLE001 -- link, refusal, timeout: retry
                    await self._drop()
                    if self._unreachable_since is None:
                        self._unreachable_since = time.monotonic()
                        self.log("standby_primary_unreachable", level="warning",
                                 error=str(exc) or repr(exc), log_end=self.copy.end)
                    try:
                        await asyncio.wait_for(stop.wait(), RETRY_S)
                    except asyncio.TimeoutError:
                        pass
            return False
        finally:
            await self._drop()
            self.copy.close()

    def mark_promoted(self) -> None:
        """Make the promotion durable (the PROMOTED marker), clear the request."""
        fd = create_file(os.path.join(self.data_dir, PROMOTED), os.O_WRONLY)
        os.write(fd, f"{time.time():.3f} {self.promote_reason}\n".encode())
        os.fsync(fd)
        os.close(fd)
        try:
            os.unlink(os.path.join(self.data_dir, PROMOTE))
        except FileNotFoundError:
            pass
        fsync_dir(self.data_dir)


async def follow_if_standby(config: Config) -> bool:
    """For a standby: follow the primary until promoted. Returns True when the broker
    should start serving (a primary, or a standby just promoted), False when a
    signal stopped the standby."""
    settings = ReplicationSettings.from_table(config.replication)
    if settings.role != "standby":
        return True
    b = config.broker
    log = EventLog(b.log_level, b.log_format, log_file=b.log_file)
    try:
        os.makedirs(b.data_dir, exist_ok=True)
        if is_promoted(b.data_dir):
            log("standby_already_promoted", level="warning", data_dir=b.data_dir,
                hint="this data directory was promoted: it serves as a primary; "
                     "remove it to make this machine a standby again")
            return True
        follower = Follower(config, settings, log)
        t0 = time.monotonic()
        counts: dict[str, int] = {}
        refuser = await open_refuser(b.host, b.port, settings.primary, counts) \
            if b.port else None
        from .standby_status import StandbyStatus

        status = StandbyStatus(follower) if b.status_port else None
        try:
            if status is not None:   # -1: any free port, named in standby_following
                follower.status_port = await status.start(b.status_host, max(b.status_port, 0))
            followed = await follower.run(stop_on_signals())
        finally:
            if status is not None:
                await status.stop()
            if refuser is not None:
                refuser.close()
                await refuser.wait_closed()
        if not followed:
            log("standby_stopped", log_end=follower.copy.end,
                clients_refused=counts.get("refused", 0))
            return False
        follower.mark_promoted()
        log("standby_promoted", level="warning", reason=follower.promote_reason,
            log_end=follower.copy.end, after_s=round(time.monotonic() - t0, 3))
        return True
    finally:
        log.close()
