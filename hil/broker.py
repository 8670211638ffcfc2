"""The broker the boards talk to: ``lockmq broker`` as a real process, on 127.0.0.1.

Started, killed (SIGKILL: a crash) or stopped (SIGTERM) and restarted on the same
port and data directory. Locks are provisioned with ``lockmq devices add`` (the
key goes into the broker's registry and into the lock's config), services get a
token with ``lockmq tokens create``. After ``stop()`` the stored records are read
back with :mod:`lockmq.store`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lockmq.testing.ports import free_port
from lockmq.testing.process import kill_process, stop_process


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


class BrokerProcess:
    """One ``lockmq broker`` process; survives restarts with the same port and data."""

    def __init__(self, workdir: Path, port: int | None = None, host: str = "127.0.0.1",
                 extra_args: list[str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.host = host
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.log_path = self.workdir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect."""
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
            self._cli("devices", "add", *batch, "--data-dir", str(self.data_dir),
                      "--out", str(out), "--broker", f"{host}:{port}")
        for sn in sns:
            doc = json.loads((outdir / f"{sn}.json").read_text())
            keys[sn] = doc["key"]
        return keys

    def service_token(self, name: str, *perms: str) -> str:
        """Create a service token with the given ``lockmq tokens create`` flags."""
        out = self._cli("tokens", "create", name, *perms, "--json", "--data-dir", str(self.data_dir))
        doc = json.loads(out)
        return str(doc.get("token") or doc.get("secret"))

    # -- life cycle -----------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        """Start and wait until the port accepts connections."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("broker already running")
        log = open(self.log_path, "ab")
        log.write(f"\n==== start #{self.starts + 1} {time.strftime('%H:%M:%S')} ====\n".encode())
        log.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [*lockmq_cli(), "broker", "--host", self.host, "--port", str(self.port),
             "--status-port", "0", "--data-dir", str(self.data_dir), "--log-level", "INFO",
             *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env,
        )
        log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with socket.create_connection(self.address, timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"broker did not listen on {self.address} within {timeout} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: the broker crashes (what was acked must survive)."""
        kill_process(self.proc)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM: graceful shutdown. Returns the exit status."""
        return stop_process(self.proc, timeout)

    def restart(self, crash: bool = True, down_s: float = 0.0) -> None:
        """Kill (or stop) and start again on the same port and data directory."""
        self.kill() if crash else self.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def running(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the broker's own log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- what was stored ------------------------------------------------------------
    def records(self, topic: str, sn: str | None = None) -> list[Any]:
        """Every stored record of ``topic`` (optionally one lock's), in log order.

        Reads with :mod:`lockmq.store`; the broker must be stopped (the store is
        single-process)."""
        if self.running():
            raise RuntimeError("stop the broker before reading its store")
        from lockmq.store import Store, StoreConfig

        store = Store.open(StoreConfig(data_dir=str(self.data_dir), min_free_bytes=0))
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
