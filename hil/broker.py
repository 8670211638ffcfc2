"""The broker the boards talk to: ``lockmq broker`` as a real process, started the one
way the test harness starts it (:class:`lockmq.testing.BrokerProcess`).

Started, killed (SIGKILL: a crash) or stopped (SIGTERM) and restarted on the same
port and data directory. Locks are provisioned with ``lockmq devices add`` (the
key goes into the broker's registry and into the lock's config), services get a
token with ``lockmq tokens create``. After ``stop()`` the stored records are read
back with :mod:`lockmq.store`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lockmq import testing
from lockmq.config import BrokerSection
from lockmq.testing.ports import free_port
from lockmq.testing.tables import Tables, merge_tables


def lockmq_cli() -> list[str]:
    """The command that runs the ``lockmq`` CLI of this environment."""
    exe = Path(sys.executable).with_name("lockmq")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from lockmq.cli import main; sys.exit(main())"]


def broker_available() -> str | None:
    """None when ``lockmq broker`` exists here, else the reason it does not."""
    try:
        import lockmq.broker  # noqa: F401
        from lockmq.cli import GROUPS
    except ImportError as exc:
        return f"the broker (lockmq.broker) is not importable: {exc}"
    for group in ("broker", "devices"):
        if group not in GROUPS:
            return f"`lockmq {group}` is not in the CLI yet"
    return None


class BrokerProcess(testing.BrokerProcess):
    """The harness's :class:`lockmq.testing.BrokerProcess` as the boards need it: data
    in ``workdir/data``, listening on ``host`` (the address boards reach), started by
    :meth:`start`; adds provisioning through the CLI and reading back what was stored.
    ``tables`` add config (e.g. ``{"security": {"lock_message_rate": 100.0}}``)."""

    def __init__(self, workdir: Path, port: int | None = None, host: str = "127.0.0.1",
                 tables: Tables | None = None) -> None:
        self.host = host
        # boards on a real link get the production handshake time, not the harness's 2 s
        super().__init__(Path(workdir) / "data", merge_tables(
            {"broker": {"host": host, "port": port or free_port(),
                        "handshake_timeout_s": BrokerSection.handshake_timeout_s}},
            tables or {}), start=False)

    @property  # type: ignore[override]
    def address(self) -> tuple[str, int]:
        """Where boards connect: ``(host, port)``."""
        return (self.host, self.port)

    def _cli(self, *args: str, timeout: float = 60) -> str:
        out = subprocess.run([*lockmq_cli(), *args], capture_output=True, text=True,
                             timeout=timeout, cwd=self.workdir)
        if out.returncode != 0:
            raise RuntimeError(f"lockmq {' '.join(args)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        return out.stdout

    # -- provisioning ---------------------------------------------------------------
    def provision(self, sns: list[str], board_address: tuple[str, int] | None = None) -> dict[str, str]:
        """Register locks in the broker's registry; return ``{sn: key_hex}``."""
        host, port = board_address or self.address
        outdir = self.workdir / "provisioning"
        outdir.mkdir(exist_ok=True)
        keys: dict[str, str] = {}
        for i in range(0, len(sns), 200):
            batch = sns[i : i + 200]
            out = outdir if len(batch) > 1 else outdir / f"{batch[0]}.json"
            self._cli("devices", "add", *batch, "--data-dir", self.data_dir,
                      "--out", str(out), "--broker", f"{host}:{port}")
        for sn in sns:
            doc = json.loads((outdir / f"{sn}.json").read_text())
            keys[sn] = doc["key"]
        return keys

    def service_token(self, name: str, *perms: str) -> str:
        """Create a service token with the given ``lockmq tokens create`` flags."""
        out = self._cli("tokens", "create", name, *perms, "--json", "--data-dir", self.data_dir)
        doc = json.loads(out)
        return str(doc.get("token") or doc.get("secret"))

    # -- what was stored ------------------------------------------------------------
    def records(self, topic: str, sn: str | None = None) -> list[Any]:
        """Every stored record of ``topic`` (optionally one lock's), in log order.

        Reads with :mod:`lockmq.store`; the broker must be stopped (the store is
        single-process)."""
        if self.running():
            raise RuntimeError("stop the broker before reading its store")
        from lockmq.store import Store, StoreConfig

        store = Store.open(StoreConfig(data_dir=self.data_dir, min_free_bytes=0))
        try:
            out: list[Any] = []
            if topic not in store.topics():
                return out
            pos = store.queue_start(topic)
            end = store.queue_end(topic)
            while pos < end:
                batch = store.read(topic, pos, 1000)
                if not batch:
                    break
                out.extend(r for r in batch if sn is None or r.sn == sn)
                pos = batch[-1].queue_offset + 1
            return out
        finally:
            store.close_sync()
