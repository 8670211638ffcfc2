"""Firmware bundles the broker holds for locks to fetch over their own link.

``lockmq firmware release`` uploads a bundle (admin ops ``fw.put``, resumable by
offset, ``fw.list``); it is kept in ``<data_dir>/firmware/<sha256>.bin`` beside
``<sha256>.json`` (version, size, released_ms), written and fsynced before it is
listed. A lock that got a signed FW_UPDATE command naming a digest asks for the
bundle piece by piece (FW_FETCH -> FW_CHUNK, ``protocol/_firmware.py``), never more
than the frame limit it stated at CONNECT. The bytes need no trust here: the lock
checks them against the digest in the signed command.

Also what ``devices`` shows of a lock's firmware: the version and the last update's
state that it reports in CONNECT's client name (``lockapp/<ver>;ota=<st>[:<why>]``),
and from it each lock's place in an update (:func:`update_state`): the admin op
``fw.status`` (per lock; what ``lockmq firmware rollout`` watches and
``lockmq firmware status`` prints) and the ``lockmq_firmware_*`` gauges on ``/metrics``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from lockmq.protocol import ErrorCode, Flag, Op
from lockmq.protocol import chunk_body, fetch_fields

#: Largest piece sent whatever the lock asks (its frame limit bounds it first).
MAX_CHUNK = 16 * 1024
#: Largest bundle accepted (the lock's own limit, lockapp/ota.py MAX_SIZE).
MAX_BUNDLE = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FRAME_OVERHEAD = 96   # header, SN, chunk header, frame tag: what the lock also leaves


class BundleError(Exception):
    """A refused admin request: ``code`` (an admin error name) and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def lock_firmware(client: str) -> dict[str, Any]:
    """``{"fw": version, "ota": state}`` from a lock's CONNECT client name (empty
    for a client that is not the lock app)."""
    if not client.startswith("lockapp/"):
        return {}
    parts = client[len("lockapp/"):].split(";")
    out: dict[str, Any] = {"fw": parts[0]}
    for p in parts[1:]:
        key, _, value = p.partition("=")
        if key in ("ota", "target"):
            out["ota" if key == "ota" else "ota_target"] = value
    return out


#: A lock's place in an update of its firmware to a version (:func:`update_state`).
UPDATE_STATES = ("fetch", "staged", "trial", "updated", "failed", "running")


def update_state(dev: dict[str, Any]) -> tuple[str, str, str] | None:
    """``(version, state, why)`` of a lock from its ``devices`` entry (and
    ``fetching``: the version the broker is sending it pieces of in this session), or
    None (nothing known yet). States: ``fetch``, ``staged``, ``trial`` (the update
    under way); ``updated`` (it runs the new version, confirmed, or with a heartbeat
    in -- the broker's answer to it is what makes the lock confirm it and drop the
    old app); ``failed`` (it refused the bundle or booted the old app again: ``why``);
    ``running`` (no update recorded: it runs ``fw``, heartbeat in). A lock reports
    its update at CONNECT; one that refuses a bundle within a session reconnects to
    say so (``lockapp/ota.py``)."""
    if dev.get("fetching"):
        return dev["fetching"], "fetch", ""
    fw, target = dev.get("fw", ""), dev.get("ota_target", "")
    st, _, why = str(dev.get("ota", "")).partition(":")
    alive = "uptime_s" in dev
    if target and st in ("failed", "revert"):
        return target, "failed", why
    if target and fw == target and (st == "ok" or alive):
        return target, "updated", ""
    if target and st in ("fetch", "staged", "trial"):
        return target, st, ""
    if fw and alive:
        return fw, "running", ""
    return None


class FirmwareBundles:
    """The bundle store, the FW_FETCH handler, and what the fleet's locks report of
    their updates.

    ``devices``: the broker's online locks (``Devices.info``); ``registry``: the
    device registry now (tags), None without one (``auth = off``)."""

    def __init__(self, data_dir: str | os.PathLike[str], stats: Any, log: Any,
                 devices: Callable[[], list[dict[str, Any]]] = list,
                 registry: Callable[[], Any] = lambda: None) -> None:
        self.root = Path(data_dir) / "firmware"
        self.stats = stats
        self.log = log
        self.devices = devices
        self.registry = registry
        self._open: dict[str, bytes] = {}    # digest -> bytes, read once (a fleet fetches one)
        self._open_version = ""
        #: SN -> (when its session began, ms: ``devices``' since_ms, the version it is
        #: fetching), for that session only; no reference to the connection is kept
        self._fetching: dict[str, tuple[int, str]] = {}

    # -- admin -------------------------------------------------------------------------
    def ops(self) -> dict[str, Any]:
        """The admin ops, by name."""
        return {"fw.put": self.put_op, "fw.list": self.list_op, "fw.status": self.status_op}

    def lock_states(self) -> list[dict[str, Any]]:
        """Every online lock's firmware and :func:`update_state`, by SN."""
        out = []
        for dev in self.devices():
            sn = dev["sn"]
            held = self._fetching.get(sn)
            if held is not None:
                if held[0] != dev.get("since_ms"):
                    del self._fetching[sn]      # that session ended: its CONNECT says more
                else:
                    dev = dict(dev, fetching=held[1])
            st = update_state(dev)
            out.append({"sn": sn, "fw": dev.get("fw", ""), "version": st[0] if st else "",
                        "state": st[1] if st else "", "why": st[2] if st else ""})
        return out

    def status_op(self, args: dict[str, Any]) -> dict[str, Any]:
        """``fw.status`` [version] [tag]: per lock, its firmware and its last update
        (``version``, ``state``, ``why``); with ``version`` only the locks whose update
        (or running version) is that one; with ``tag`` every registered lock that
        carries it, ``state`` ``offline`` for those not connected."""
        rows = self.lock_states()
        tag = args.get("tag")
        if tag is not None:
            reg = self.registry()
            if reg is None:
                return {"ok": False, "error": "INVALID_ARGUMENT",
                        "message": "no device registry (auth = off): no tags"}
            try:
                tagged = reg.tagged(str(tag))
            except ValueError as e:
                return {"ok": False, "error": "INVALID_ARGUMENT", "message": str(e)}
            by_sn = {r["sn"]: r for r in rows}
            rows = [by_sn.get(sn) or {"sn": sn, "fw": "", "version": "", "state": "offline",
                                      "why": ""} for sn in tagged]
        version = args.get("version")
        if version is not None:
            rows = [r for r in rows if version in (r["version"], r["fw"])]
        return {"ok": True, "locks": rows}

    def gauges(self) -> dict[str, Any]:
        """What ``/metrics`` shows (``lockmq_firmware_*``): online locks by the version
        they run, and by the version and state of their last update."""
        running: dict[str, int] = {}
        updates: dict[tuple[str, str], int] = {}
        for r in self.lock_states():
            if r["fw"]:
                running[r["fw"]] = running.get(r["fw"], 0) + 1
            if r["state"]:
                key = (r["version"], r["state"])
                updates[key] = updates.get(key, 0) + 1
        return {"running": running, "updates": updates}

    def put_op(self, args: dict[str, Any]) -> dict[str, Any]:
        """``fw.put`` {sha256, size, version, offset, data (base64)}: append a piece;
        the last one verifies the digest and releases the bundle."""
        try:
            return self._put(args)
        except BundleError as e:
            return {"ok": False, "error": e.code, "message": e.message}

    def _put(self, args: dict[str, Any]) -> dict[str, Any]:
        sha = str(args.get("sha256", "")).lower()
        size, offset, version = args.get("size"), args.get("offset"), args.get("version")
        if not _HEX64.fullmatch(sha):
            raise BundleError("INVALID_ARGUMENT", "sha256 must be 64 hex digits")
        if not isinstance(size, int) or not 0 < size <= MAX_BUNDLE:
            raise BundleError("INVALID_ARGUMENT", f"size must be 1..{MAX_BUNDLE}")
        if not isinstance(version, str) or not 0 < len(version) <= 32:
            raise BundleError("INVALID_ARGUMENT", "version must be 1..32 characters")
        if not isinstance(offset, int) or offset < 0:
            raise BundleError("INVALID_ARGUMENT", "offset must be a non-negative integer")
        try:
            data = base64.b64decode(str(args.get("data", "")), validate=True)
        except ValueError:
            raise BundleError("INVALID_ARGUMENT", "data must be base64") from None
        if self._meta(sha) is not None:
            return {"ok": True, "released": True, "have": size}
        self.root.mkdir(parents=True, exist_ok=True)
        part = self.root / f"{sha}.part"
        have = part.stat().st_size if part.exists() else 0
        if offset != have:      # resumable: the uploader continues from what is here
            return {"ok": True, "released": False, "have": have}
        if have + len(data) > size:
            raise BundleError("INVALID_ARGUMENT", "more data than size")
        with open(part, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        have += len(data)
        if have < size:
            return {"ok": True, "released": False, "have": have}
        blob = part.read_bytes()
        if hashlib.sha256(blob).hexdigest() != sha:
            part.unlink()
            raise BundleError("INVALID_ARGUMENT", "the uploaded bytes do not hash to sha256")
        _write_synced(self.root / f"{sha}.bin", blob)
        part.unlink()
        _write_synced(self.root / f"{sha}.json", json.dumps(
            {"sha256": sha, "version": version, "size": size,
             "released_ms": int(time.time() * 1000)}).encode())
        self.stats.inc("fw_bundles_released")
        self.log("fw_released", sha256=sha, version=version, size=size)
        return {"ok": True, "released": True, "have": have}

    def list_op(self, args: dict[str, Any]) -> dict[str, Any]:
        """``fw.list`` [version]: the released bundles, newest first."""
        out = []
        if self.root.is_dir():
            for p in self.root.glob("*.json"):
                meta = self._meta(p.stem)
                if meta is not None and args.get("version") in (None, meta["version"]):
                    out.append(meta)
        out.sort(key=lambda m: m["released_ms"], reverse=True)
        return {"ok": True, "bundles": out}

    def _meta(self, sha: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.root / f"{sha}.json").read_text())
        except (OSError, ValueError):
            return None

    # -- the lock's fetch ------------------------------------------------------------
    def on_fetch(self, conn: Any, frame: Any) -> None:
        """FW_FETCH: answer the piece asked for, or ERROR INVALID_ARGUMENT."""
        digest, offset, max_len = fetch_fields(frame.body)
        sha = digest.hex()
        blob = self._open.get(sha)
        if blob is None:
            try:
                blob = (self.root / f"{sha}.bin").read_bytes()
            except OSError:
                self.stats.inc("fw_fetch_refused")
                conn.send_error(ErrorCode.INVALID_ARGUMENT, f"no firmware bundle {sha}",
                                frame.opaque)
                return
            self._open = {sha: blob}          # the bundle a rollout is sending
            self._open_version = (self._meta(sha) or {}).get("version", "")
        principal = getattr(conn, "principal", None)
        if principal is not None:
            self._fetching[principal.name] = (int(conn.connected_at * 1000), self._open_version)
        if offset > len(blob):
            conn.send_error(ErrorCode.INVALID_ARGUMENT, "offset beyond the bundle", frame.opaque)
            return
        limit = conn.peer_max_frame - _FRAME_OVERHEAD if conn.peer_max_frame else MAX_CHUNK
        n = max(0, min(max_len, MAX_CHUNK, limit))
        piece = blob[offset:offset + n]
        self.stats.inc("fw_chunks_sent")
        self.stats.inc("fw_bytes_sent", len(piece))
        conn.send_frame(Op.FW_CHUNK, chunk_body(offset, len(blob), piece), frame.opaque,
                        Flag.RESPONSE)


def _write_synced(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
