"""Which modules go where: the lock gets only the code it runs.

The protocol package (``protocol/``) is shared, but much of it is the host's: the
broker's side of the session, the consumer and transaction bodies, the body classes,
the CPython fast paths. A board's flash folder and its frozen manifest take the
protocol package without those modules (:data:`HOST_ONLY`): flash and, as ``.mpy``
in ``lib/``, heap the lock would never use. ``tests/firmware/test_targets.py`` runs
every lock module under MicroPython and checks that what it imports is exactly
what ships, so a module the lock starts to import cannot be left out unnoticed.
"""

from __future__ import annotations

from pathlib import Path

#: Protocol modules only the host imports (never shipped to a lock).
HOST_ONLY = frozenset({
    "batch",            # the batch API: the core's pure-Python twins (host)
    "_server_session",  # the broker's side of the session
    "_identity",        # the broker's identity rules
    "_consume",         # consumer opcodes' bodies: a lock never consumes
    "txn",              # transactional publish bodies (services)
    "schedule",         # scheduled delivery bodies (services)
    "compiled",         # where a host's compiled core plugs in (lockmq.accel)
    "_bodies",          # body classes; the lock builds and reads bodies with _lockbodies
    "_constants",       # the constant classes; lock modules fold them as const() copies
    "table",            # the protocol table: scripts/gen_protocol.py's and the host's source
})


def lock_modules(package_dir: Path) -> list[Path]:
    """The ``.py`` files of ``package_dir`` (the protocol package) a lock ships."""
    return [p for p in sorted(package_dir.glob("*.py")) if p.stem not in HOST_ONLY]
