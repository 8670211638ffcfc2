"""`lockmq store check|dump|damage DIR`, `lockmq store salvage DIR OFFSET --out F`
(offline tools for the data directory) and
`lockmq store backup DEST` / `lockmq store restore SRC DATA_DIR` (online backup)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

from lockmq.client.cliargs import TIME_FORMS, time_arg


def _iso_us(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).isoformat(timespec="microseconds")


def _check(args: argparse.Namespace) -> int:
    from lockmq.store.inspect import check_dir
    try:
        rep = check_dir(args.dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.dir}: {rep.segments} segments, {rep.log_bytes} bytes, {rep.records} records "
          f"with a valid checksum")
    for topic, n in sorted(rep.topics.items()):
        print(f"  topic {topic}: {n} records")
    for note in rep.notes:
        print(f"note: {note}")
    for prob in rep.problems:
        print(f"CORRUPT: {prob}")
    print("OK" if rep.ok else f"FAILED: {len(rep.problems)} problem(s)")
    return 0 if rep.ok else 1


def decode_payload(payload: bytes) -> tuple[str, object]:
    """What a stored payload is, for people: ``("json", object)`` (system records,
    dead-letter bodies, services' JSON), ``("event", "unlock method=card ...")`` (a
    lock's LockEvent), ``("text", str)`` (printable UTF-8) or ``("hex", str)``."""
    from lockmq.client.cliargs import describe_event

    if payload[:1] in (b"{", b"["):
        try:
            return "json", json.loads(payload)
        except ValueError:
            pass
    event = describe_event(payload)
    if event is not None:
        return "event", event
    try:
        text = payload.decode()
    except UnicodeError:
        text = ""
    if text and text.isprintable():
        return "text", text
    return "hex", payload.hex()


def _dump(args: argparse.Namespace) -> int:
    from lockmq.store.errors import CorruptRecord
    from lockmq.store.inspect import iter_records
    since_us = None if args.since is None else args.since * 1000
    until_us = None if args.until is None else args.until * 1000
    shown = 0
    damaged: list[str] = []

    def on_damage(lo: int, hi: int, why: str) -> None:
        damaged.append(f"[{lo}, {hi})")
        print(f"DAMAGED: bytes [{lo}, {hi}): {why} (skipped; `lockmq store damage` and "
              "`lockmq store check` say more)", file=sys.stderr)
    try:
        for rec in iter_records(args.dir, on_damage=on_damage):
            if args.topic is not None and rec.topic != args.topic:
                continue
            if args.sn is not None and rec.sn != args.sn:
                continue
            if since_us is not None and rec.broker_ts_us < since_us:
                continue
            if until_us is not None and rec.broker_ts_us >= until_us:
                continue
            payload = bytes(rec.payload)
            kind, value = ("hex", payload.hex()) if args.hex else decode_payload(payload)
            if args.json:   # "payload" stays the hex bytes; the decoded form is beside it
                obj = {"offset": rec.offset, "topic": rec.topic, "sn": rec.sn, "seq": rec.seq,
                       "lock_ts_ms": rec.lock_ts_ms, "broker_ts_us": rec.broker_ts_us,
                       "headers": rec.headers, "payload": payload.hex()}
                if kind != "hex":
                    obj[kind] = value
                print(json.dumps(obj, ensure_ascii=False))
            else:
                lock_t = _iso_us(rec.lock_ts_ms * 1000) if rec.lock_ts_ms else "-"
                decoded = {"json": lambda v: "json=" + json.dumps(v, ensure_ascii=False),
                         "event": lambda v: f"event={v}",
                         "text": lambda v: "text=" + json.dumps(v, ensure_ascii=False),
                         "hex": lambda v: f"payload={v}"}[kind](value)
                line = (f"offset={rec.offset} topic={rec.topic} id={rec.sn}:{rec.seq} "
                        f"broker_ts={_iso_us(rec.broker_ts_us)} lock_ts={lock_t} {decoded}")
                if rec.headers is not None:
                    line += " headers=" + json.dumps(rec.headers, ensure_ascii=False)
                print(line)
            shown += 1
            if args.limit is not None and shown >= args.limit:
                break
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CorruptRecord as exc:
        print(f"CORRUPT: {exc} (dump stops here; run `lockmq store check`)", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 1 if damaged else 0


def _damage(args: argparse.Namespace) -> int:
    """List the quarantined ranges (the broker's ``damage`` file)."""
    from lockmq.store.damage import load_items
    if not os.path.isdir(os.path.join(args.dir, "message.log")):
        print(f"error: {args.dir} is not a lockmq data directory", file=sys.stderr)
        return 2
    items = load_items(args.dir)
    for d in items:
        if args.json:
            print(json.dumps(vars(d), sort_keys=True))
        else:
            print(d.describe() + f" [found by {d.found}]")
    if not args.json:
        lost = sum(max(d.records, d.queue_offsets()) for d in items)
        print(f"{len(items)} quarantined ranges, {lost} records" if items
              else "no quarantined damage (run `lockmq store check` to look for new damage)")
    return 1 if items else 0


def _salvage(args: argparse.Namespace) -> int:
    """Copy one quarantined range's bytes out (and show what still decodes in them)."""
    from lockmq.store.damage import load_items
    from lockmq.store.names import SEGMENT_DIR, segment_name
    from lockmq.store.records import HEADER, HEADER_SIZE
    found = [d for d in load_items(args.dir) if d.start <= args.offset < d.end]
    if not found:
        print(f"error: no quarantined range holds offset {args.offset} "
              "(see `lockmq store damage DIR`)", file=sys.stderr)
        return 2
    d = found[0]
    path = os.path.join(args.dir, SEGMENT_DIR, segment_name(d.segment))
    try:
        with open(path, "rb") as f:
            f.seek(d.start - d.segment)
            data = f.read(d.end - d.start)
    except FileNotFoundError:
        print(f"error: segment {d.segment} is gone (retention, or it was lost)",
              file=sys.stderr)
        return 1
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"{len(data)} bytes of [{d.start}, {d.end}) written to {args.out}"
          + ("" if len(data) == d.end - d.start else
             f" ({d.end - d.start - len(data)} bytes are missing from the disk)"))
    if len(data) >= HEADER_SIZE:   # what the (unverified) first header says
        (length, _c, _f, _fl, tlen, slen, _r, _h, seq, _p, _l, bts) = HEADER.unpack_from(data)
        body = data[HEADER_SIZE:HEADER_SIZE + tlen + slen]
        print(f"first header, unverified: length {length}, topic "
              f"{body[:tlen].decode('ascii', 'replace')!r}, sn "
              f"{body[tlen:].decode('ascii', 'replace')!r}, seq {seq}, broker time "
              f"{_iso_us(bts) if 0 < bts < 1 << 62 else bts}")
    return 0


def _data_dir(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The broker's data directory (``--data-dir``, else the config's) and the
    security files that its config keeps outside of it (not in a backup)."""
    from lockmq.config import load_config
    from lockmq.security import SecurityConfig

    overrides = {"broker": {"data_dir": args.data_dir}} if args.data_dir else None
    cfg = load_config(args.config, overrides)
    data_dir = os.path.abspath(cfg.broker.data_dir)
    sec = SecurityConfig.from_broker_config(cfg)
    outside = [p for p in (sec.registry_path, sec.master_key_path)
               if os.path.commonpath([data_dir, os.path.abspath(p)]) != data_dir]
    return data_dir, outside


def _describe(rep) -> str:
    topics = ", ".join(f"{t} {q0}..{q1}" for t, (q0, q1) in rep.topics.items()) or "none"
    return (f"  {rep.files} files, {rep.bytes} bytes, log {rep.log_start}..{rep.log_end}\n"
            f"  topics (queue offsets): {topics}\n"
            f"  clusters: {', '.join(rep.clusters) or 'none'}\n"
            f"  other files: {', '.join(rep.side_files) or 'none'}")


def _backup(args: argparse.Namespace) -> int:
    from lockmq.config import ConfigError
    from lockmq.store.backup import BackupError, backup
    try:
        data_dir, outside = _data_dir(args)
        rep = backup(data_dir, args.dest)
    except (BackupError, ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"backup of {rep.source} in {rep.path} ({rep.seconds} s):\n{_describe(rep)}")
    if rep.bytes_cut:
        print(f"  ({rep.bytes_cut} bytes of a record being written were left out)")
    for path in outside:
        print(f"warning: {path} is outside the data directory and NOT in the backup; "
              "keep a copy of it too", file=sys.stderr)
    return 0


def _restore(args: argparse.Namespace) -> int:
    from lockmq.store.backup import BackupError, restore
    try:
        rep = restore(args.src, args.data_dir)
    except (BackupError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"restored the backup of {rep.created} from {rep.source} into {rep.path}:\n"
          f"{_describe(rep)}\nstart the broker with [broker] data_dir = \"{rep.path}\"")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `store` command group."""
    p = subparsers.add_parser("store", help="inspect, back up and restore a broker data "
                                            "directory")
    sub = p.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    c = sub.add_parser("check", help="verify every checksum; exit 1 on corruption")
    c.add_argument("dir", help="data directory (the one holding message.log/)")
    c.set_defaults(func=_check)
    q = sub.add_parser("damage", help="list the quarantined damaged ranges (exit 1 if any)")
    q.add_argument("dir", help="data directory (the one holding message.log/)")
    q.add_argument("--json", action="store_true", help="one JSON object per range")
    q.set_defaults(func=_damage)
    v = sub.add_parser("salvage", help="copy the bytes of a quarantined range to a file")
    v.add_argument("dir", help="data directory (the one holding message.log/)")
    v.add_argument("offset", type=int, help="a commit-log offset inside the range")
    v.add_argument("--out", required=True, help="file to write the raw bytes to")
    v.set_defaults(func=_salvage)
    d = sub.add_parser("dump", help="print records, oldest first")
    d.add_argument("dir", help="data directory (the one holding message.log/)")
    d.add_argument("--topic", help="only this topic")
    d.add_argument("--sn", help="only this lock serial number / producer id")
    d.add_argument("--since", type=time_arg("--since/--until"),
                   help=f"broker time at or after (epoch ms or {TIME_FORMS})")
    d.add_argument("--until", type=time_arg("--since/--until"), help="broker time before (same forms)")
    d.add_argument("--limit", type=int, help="stop after this many records")
    d.add_argument("--json", action="store_true",
                   help="one JSON object per line (payload as hex, plus json/event/text "
                        "when it decodes)")
    d.add_argument("--hex", action="store_true",
                   help="payloads as hex only (by default JSON records, lock events and "
                        "printable text are shown decoded)")
    d.set_defaults(func=_dump)
    b = sub.add_parser("backup", help="copy the data directory, while the broker runs, "
                                      "into a new directory usable as a data directory")
    b.add_argument("dest", help="new (or empty) directory for the backup")
    b.add_argument("--config", "-c", metavar="FILE",
                   help="broker config (TOML): its [broker] data_dir is backed up")
    b.add_argument("--data-dir", metavar="DIR",
                   help="the data directory (overrides the config's; default ./data)")
    b.set_defaults(func=_backup)
    r = sub.add_parser("restore", help="restore a backup into a new (or empty) data "
                                       "directory; the broker must not run on it")
    r.add_argument("src", help="a directory made by `lockmq store backup`")
    r.add_argument("data_dir", help="the data directory to create")
    r.set_defaults(func=_restore)
