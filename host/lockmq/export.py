"""``lockmq export``: ship a gateway's closed commit-log segments to the data platform.

The destination is a directory (or an uncompressed ``.tar`` archive) laid out like
a broker data directory, so the Spark data source reads it as it is::

    DEST/
      manifest.json                 identity + one entry per exported segment
      message.log/<base>.log        byte-for-byte copies of closed segments

``manifest.json`` holds the format version, ``broker_id`` and ``gateway_id``, and
per segment its size, SHA-256, record count and when it was exported. A segment
already in the manifest with the same size is not copied again, so exporting
twice exports nothing new. The newest segment is the one the broker is still
writing and is skipped unless ``include_active`` is set (then its complete
records are copied, and copied again later once it has grown).

With ``parquet`` set, the newly exported records are also decoded -- with pyarrow
and numpy only, no Java -- into ``<parquet>/date=YYYY-MM-DD/<base>.parquet``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
import time
from dataclasses import dataclass, field

from lockmq.clock import SYSTEM_CLOCK, Clock
from lockmq.store.files import fsync_dir
from lockmq.spark.layout import MANIFEST, SEGMENT_DIR, Segment, complete_end, list_segments, read_identity, walk_boundaries

MANIFEST_VERSION = 1
_CHUNK = 1 << 20


class ExportError(Exception):
    """The export cannot be done (bad source, foreign destination...)."""


@dataclass
class ExportResult:
    """What one export run did."""

    dest: str
    gateway_id: str
    exported: list[str] = field(default_factory=list)
    skipped: int = 0
    bytes: int = 0
    records: int = 0
    parquet_files: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    #: the segment the broker is writing: left out (no ``include_active``), copied,
    #: or already there unchanged since the last export
    active: str = "left out"
    #: complete records in the active segment (counted when it decides the message)
    active_records: int = 0

    def summary(self) -> str:
        """What happened, and what to do when nothing did."""
        if self.exported:
            extra = " (the active segment's complete records included)" if self.active == "copied" else ""
            return (f"exported {len(self.exported)} segment(s), {self.records} records, {self.bytes} bytes "
                    f"from gateway {self.gateway_id} to {self.dest}{extra}")
        there = f"{self.skipped} segment(s) already there"
        if self.active == "unchanged":
            return (f"nothing new to export to {self.dest}: {there}, the active segment unchanged "
                    f"since the last export ({self.active_records} records)")
        if self.active_records:
            return (f"nothing new to export to {self.dest}: no closed segment that is not already there "
                    f"({there}); the active segment, which the broker is still writing, holds "
                    f"{self.active_records} record(s): pass --include-active to copy them now, or export "
                    f"again once it is closed ([store] segment_ms)")
        return f"nothing new to export to {self.dest} ({there})"


def _identity(src: str, gateway_id: str | None) -> tuple[str, str]:
    ident = read_identity(src)
    broker = str(ident.get("broker_id") or ident.get("id") or ident.get("gateway_id") or socket.gethostname())
    gw = gateway_id or str(ident.get("gateway_id") or broker)
    return broker, gw


def _segment_bytes(seg: Segment, active: bool) -> bytes:
    with open(seg.path, "rb") as f:
        data = f.read()
    if active:
        data = data[: complete_end(data, 0, len(data))]
    return data


def _new_manifest(broker: str, gateway: str) -> dict:
    return {"format": MANIFEST_VERSION, "kind": "lockmq-export", "broker_id": broker,
            "gateway_id": gateway, "segments": {}, "exports": []}


def _check_manifest(doc: dict, gateway: str, where: str) -> dict:
    if doc.get("kind") != "lockmq-export" or doc.get("format") != MANIFEST_VERSION:
        raise ExportError(f"{where} is not a lockmq export manifest (version {MANIFEST_VERSION})")
    if doc.get("gateway_id") != gateway:
        raise ExportError(f"{where} holds gateway {doc.get('gateway_id')!r}, not {gateway!r}: "
                          "use one destination per gateway")
    return doc


def _plan(src: str, manifest: dict, include_active: bool,
          res: ExportResult) -> list[tuple[Segment, bytes | None]]:
    """The segments to copy, each with its bytes when already read (the active one).

    The active segment is compared by its complete records, not its file size
    (the store preallocates it): unchanged since the last export, it is skipped."""
    segs = list_segments(src)
    if not segs:
        raise ExportError(f"{src} holds no commit-log segments ({SEGMENT_DIR}/*.log)")
    todo: list[tuple[Segment, bytes | None]] = []
    for i, seg in enumerate(segs):
        active = i == len(segs) - 1
        have = manifest["segments"].get(os.path.basename(seg.path))
        if not active:
            if have and have["bytes"] == seg.size:
                res.skipped += 1
            else:
                todo.append((seg, None))
            continue
        data = _segment_bytes(seg, True) if include_active or not todo else None
        if data is not None:
            res.active_records = walk_boundaries(data, 0, len(data))[1]
        if not include_active:
            continue
        if have and have["bytes"] >= len(data):
            res.active = "unchanged"
        elif data:
            res.active = "copied"
            todo.append((seg, data))
    return todo


def _stamp(clock: Clock) -> str:
    """Now on ``clock``, as the manifest writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.wall_ms() / 1000))


def _describe(data: bytes, seg: Segment, clock: Clock) -> dict:
    _, n, _, _ = walk_boundaries(data, 0, len(data))
    return {"base": seg.base, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "records": n, "exported_at": _stamp(clock)}


def _write_atomic(path: str, data: bytes) -> None:
    # Not store.files.atomic_write: an export is handed to other users (Spark, a
    # copy tool), so its files keep the umask's mode, not the store's private 0600.
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def export(src: str, dest: str, gateway_id: str | None = None, include_active: bool = False,
           parquet: str | None = None, clock: Clock = SYSTEM_CLOCK) -> ExportResult:
    """Export the closed segments of the data directory ``src`` to ``dest`` (see module doc).

    ``clock`` dates the manifest's entries (lockmq.clock; a time-scale bench passes
    the broker's). A quiet gateway's records reach a closed segment after ``[store]
    segment_ms`` (1 day by default)."""
    src = os.path.abspath(src)
    if not os.path.isdir(src):
        raise ExportError(f"no such data directory: {src}")
    broker, gateway = _identity(src, gateway_id)
    res = ExportResult(dest=dest, gateway_id=gateway)
    if dest.endswith(".tar"):
        _export_tar(src, dest, broker, gateway, include_active, res, clock)
    else:
        _export_dir(src, dest, broker, gateway, include_active, res, clock)
    if parquet and res.exported:
        res.parquet_files = _to_parquet(src, res, parquet, gateway)
    return res


def _export_dir(src: str, dest: str, broker: str, gateway: str, include_active: bool,
                res: ExportResult, clock: Clock) -> None:
    seg_dir = os.path.join(dest, SEGMENT_DIR)
    os.makedirs(seg_dir, exist_ok=True)
    mpath = os.path.join(dest, MANIFEST)
    if os.path.exists(mpath):
        with open(mpath, encoding="utf-8") as f:
            manifest = _check_manifest(json.load(f), gateway, mpath)
    else:
        manifest = _new_manifest(broker, gateway)
    todo = _plan(src, manifest, include_active, res)
    names = []
    for seg, data in todo:
        data = _segment_bytes(seg, False) if data is None else data
        name = os.path.basename(seg.path)
        _write_atomic(os.path.join(seg_dir, name), data)
        manifest["segments"][name] = _describe(data, seg, clock)
        names.append(name)
        res.sizes[name] = len(data)
        res.bytes += len(data)
        res.records += manifest["segments"][name]["records"]
    if names:
        fsync_dir(seg_dir)
        manifest["exports"].append({"at": _stamp(clock), "segments": names})
        _write_atomic(mpath, json.dumps(manifest, indent=1, sort_keys=True).encode())
        fsync_dir(dest)
    res.exported = names


def _export_tar(src: str, dest: str, broker: str, gateway: str, include_active: bool,
                res: ExportResult, clock: Clock) -> None:
    manifest = _new_manifest(broker, gateway)
    if os.path.exists(dest):
        with tarfile.open(dest, "r:") as tf:
            found = None
            for m in tf.getmembers():
                if m.name == MANIFEST:
                    found = m  # the last copy wins, as when extracting
            if found is not None:
                manifest = _check_manifest(json.load(tf.extractfile(found)), gateway, f"{dest}:{MANIFEST}")
    todo = _plan(src, manifest, include_active, res)
    if not todo:
        return
    names = []
    with tarfile.open(dest, "a:" if os.path.exists(dest) else "w:") as tf:
        for seg, data in todo:
            data = _segment_bytes(seg, False) if data is None else data
            name = os.path.basename(seg.path)
            info = tarfile.TarInfo(f"{SEGMENT_DIR}/{name}")
            info.size, info.mtime = len(data), int(time.time())
            tf.addfile(info, io.BytesIO(data))
            manifest["segments"][name] = _describe(data, seg, clock)
            names.append(name)
            res.sizes[name] = len(data)
            res.bytes += len(data)
            res.records += manifest["segments"][name]["records"]
        manifest["exports"].append({"at": _stamp(clock), "segments": names})
        blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(blob), int(time.time())
        tf.addfile(info, io.BytesIO(blob))
    with open(dest, "rb+") as f:
        os.fsync(f.fileno())
    res.exported = names


def _to_parquet(src: str, res: ExportResult, out: str, gateway: str) -> list[str]:
    """Decode the exported segments into date-partitioned Parquet with pyarrow only."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from lockmq.spark.decoder import SCHEMA, decode_buffer

    files = []
    segs = {os.path.basename(s.path): s for s in list_segments(src)}
    for name in res.exported:
        seg = segs.get(name)
        if seg is None:
            continue
        data = _segment_bytes(seg, False)[: res.sizes.get(name)]
        batches = list(decode_buffer(data, seg.base, gateway))
        if not batches:
            continue
        tab = pa.Table.from_batches(batches, schema=SCHEMA)
        dates = pc.strftime(tab["broker_ts"], format="%Y-%m-%d", locale="C")
        tab = tab.append_column("date", dates)
        for d in pc.unique(dates).to_pylist():
            part = tab.filter(pc.equal(tab["date"], d)) if d is not None else tab.filter(pc.is_null(tab["date"]))
            ddir = os.path.join(out, f"date={d if d is not None else '__HIVE_DEFAULT_PARTITION__'}")
            os.makedirs(ddir, exist_ok=True)
            path = os.path.join(ddir, f"{seg.base:020d}-{part['offset'][0].as_py()}.parquet")
            pq.write_table(part.drop_columns(["date"]), path + ".part", coerce_timestamps="us")
            os.replace(path + ".part", path)
            files.append(path)
    return files
