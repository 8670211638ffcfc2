"""``lockmq broker``: run the message broker on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

HELP = """\
Run the lockmq broker. With no options it listens on port 6800 (the lockmq
protocol) and 6801 (HTTP status page on 127.0.0.1), stores data in ./data with
durable acks (fsync before each ack, group commit), and requires every peer to
authenticate. One TOML file (--config) changes any setting; the flags below
override the file. `lockmq broker --print-config` prints every setting with its
default. Stop it with SIGTERM or Ctrl-C: it stops accepting, answers the
publishes it already took, saves consumer positions and closes the store.
SIGHUP (systemctl reload) re-reads the file and applies what can change live,
logging what needs a restart; a file it refuses changes nothing.

Main settings (table.key in the TOML file):
  broker.port (6800)               broker.status_port (6801, 0 = off)
  broker.data_dir ("./data")       broker.auth ("required" | "off")
  broker.max_frame (1 MiB)         broker.max_conn_buffer_bytes (4 MiB)
  broker.max_connections (0 = open-file limit)   broker.backlog (4096)
  devices.heartbeat_s (30)         devices.evict_after_s (120)
  consumers.visibility_timeout_ms (30000)  consumers.max_retries (16)
  consumers.retry_levels_s (1s 5s 10s 30s 1m ... 2h)  consumers.time_scale (1.0)
  consumers.max_inflight_per_member (1024) consumers.max_inflight_per_cluster (16384)
  store.flush ("sync" | "async")   store.retention_ms (7 days)
  store.min_free_bytes (256 MiB)   store.max_pending_bytes (64 MiB)
See docs/operators.md for all of them.
"""


def register(subparsers: Any) -> None:
    """Add the ``broker`` command."""
    p = subparsers.add_parser("broker", help="run the message broker",
                              description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", metavar="FILE", help="TOML configuration file")
    p.add_argument("--host", help="address to listen on (broker.host, default 0.0.0.0)")
    p.add_argument("--port", type=int, help="protocol port (broker.port, default 6800)")
    p.add_argument("--status-port", type=int,
                   help="HTTP status page port (broker.status_port, default 6801; 0 = off, "
                        "-1 = any free port, logged in broker_started)")
    p.add_argument("--data-dir", help="data directory (broker.data_dir, default ./data)")
    p.add_argument("--auth", choices=("required", "off"),
                   help="authentication (broker.auth; 'off' only for tests/development)")
    p.add_argument("--flush", choices=("sync", "async"),
                   help="durability (store.flush): ack after fsync (sync) or after write")
    p.add_argument("--time-scale", type=float,
                   help="multiply retry delays (consumers.time_scale; 0.001 for tests)")
    p.add_argument("--visibility-timeout-ms", type=int,
                   help="lease time of a delivered message (consumers.visibility_timeout_ms)")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="log level (broker.log_level)")
    p.add_argument("--log-format", choices=("kv", "json"), help="log line format")
    p.add_argument("--print-config", action="store_true",
                   help="print every setting with its default as TOML and exit")
    p.add_argument("--check-config", action="store_true",
                   help="run the checks the broker runs at start (every setting, the TLS "
                        "and key files they name), then exit: 0 = the broker would start")
    p.add_argument("--as-user", metavar="USER",
                   help="with --check-config: run the checks as USER, the user the service "
                        "runs as (files readable, data_dir writable by it); run as root, "
                        f"the default is the unit's User= ({UNIT_USER}) when that user "
                        "exists; '' checks as the user running the command")
    p.set_defaults(func=main)


#: the user the shipped unit (dist/lockmq.service) runs the broker as
UNIT_USER = "lockmq"

def check_as(args: argparse.Namespace) -> int | None:
    """Run ``--check-config`` again as the service's user (``--as-user``, or the
    unit's user when run as root); its exit status, or None to check as this user."""
    import pwd

    me = pwd.getpwuid(os.geteuid()).pw_name
    user = args.as_user
    if user is None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(UNIT_USER)
        except KeyError:   # said after the result (a refusal stays one line)
            args.check_note = (f"no user {UNIT_USER!r} here (the unit's User=): give "
                               "--as-user USER to check as the service's user")
            return None
        user = UNIT_USER
    if not user or user == me:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        print(f"lockmq broker: --as-user {user}: no such user", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print(f"lockmq broker: --as-user {user} needs root (or run the check as {user})",
              file=sys.stderr)
        return 2
    return _forked_as(pw, lambda: _check(args, as_user=user))


def _check(args: argparse.Namespace, as_user: str = "") -> int:
    """The check itself (the validator the broker's start runs): its exit status;
    ``as_user`` is named in a refusal (the check ran as that user)."""
    import pwd

    from lockmq.config import load_config

    try:
        load_config(args.config, overrides_from_args(args), check_files=True)
    except (OSError, ValueError) as exc:
        who = f" (checked as user {as_user})" if as_user else ""
        print(f"lockmq broker: bad configuration: {exc}{who}", file=sys.stderr)
        return 2
    print("configuration ok")
    note = getattr(args, "check_note", "")
    print(f"(checked as user {pwd.getpwuid(os.geteuid()).pw_name}{'; ' + note if note else ''})",
          file=sys.stderr)
    return 0


def _forked_as(pw: Any, check: Callable[[], int]) -> int:
    """Run ``check`` in a child process that has become user ``pw`` (its groups
    too): what that user can open is what the broker, run by it, could open. The
    child forks from this process rather than starting Python again, so the check
    works wherever the interpreter itself is not readable by that user."""
    import ssl  # noqa: F401 -- loaded before the child gives up root's file access

    import lockmq.preflight  # noqa: F401
    import lockmq.replication.settings  # noqa: F401
    import lockmq.security.config  # noqa: F401
    import lockmq.security.keys  # noqa: F401
    import lockmq.store.config  # noqa: F401

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:   # the child: never returns into the caller
        code = 70
        try:
            os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.environ.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
            code = check()
        except BaseException as exc:  # noqa: BLE001 -- reported, then the child exits
            print(f"lockmq broker: the check as user {pw.pw_name} failed: {exc}",
                  file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def overrides_from_args(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The flags given on the command line, as config tables."""
    o: dict[str, dict[str, Any]] = {"broker": {}, "store": {}, "consumers": {}}
    for flag, table, key in (("host", "broker", "host"), ("port", "broker", "port"),
                             ("status_port", "broker", "status_port"),
                             ("data_dir", "broker", "data_dir"), ("auth", "broker", "auth"),
                             ("flush", "store", "flush"),
                             ("time_scale", "consumers", "time_scale"),
                             ("visibility_timeout_ms", "consumers", "visibility_timeout_ms"),
                             ("log_level", "broker", "log_level"),
                             ("log_format", "broker", "log_format")):
        v = getattr(args, flag, None)
        if v is not None:
            o[table][key] = v
    return {k: v for k, v in o.items() if v}


def main(args: argparse.Namespace) -> int:
    """Run the broker (or print / check the configuration)."""
    from lockmq.config import default_toml, load_config

    if args.print_config:
        sys.stdout.write(default_toml())
        return 0
    if args.as_user is not None and not args.check_config:
        print("lockmq broker: --as-user goes with --check-config (the broker itself runs "
              "as the user that starts it: the unit's User=)", file=sys.stderr)
        return 2
    if args.check_config:
        status = check_as(args)
        if status is not None:
            return status
    # --check-config and a real start run the same validator (lockmq.config.
    # validate_config): a file that passes the check is a file the broker starts with.
    if args.check_config:
        return _check(args)
    try:
        config = load_config(args.config, overrides_from_args(args), check_files=True)
    except (OSError, ValueError) as exc:
        print(f"lockmq broker: bad configuration: {exc}", file=sys.stderr)
        return 2
    from lockmq.broker.server import run

    overrides = overrides_from_args(args)
    return run(config, reload=lambda: load_config(args.config, overrides, check_files=True))
