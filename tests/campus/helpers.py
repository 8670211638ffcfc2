"""The campus tests' helpers: a ``lockmq registry`` process, gateways that register."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from lockmq.client.registry import registry_request
from lockmq.testing import BrokerProcess

TOKEN = "campus.s3cret-registry-token"


class RegistryProcess(BrokerProcess):
    """One ``lockmq registry`` process: BrokerProcess's log, kill, stop and restart,
    with the registry's command line (``flags``) instead of a broker config."""

    def __init__(self, workdir: str | os.PathLike[str], flags: list[str] | None = None,
                 token: str | None = TOKEN) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tokens_path = self.workdir / "registry.tokens"
        self.tokens_path.write_text(f"# accepted tokens\n{token}\n" if token else "")
        self.flags = ["--host", "127.0.0.1", "--state", str(self.workdir / "registry.json"),
                      *(["--tokens", str(self.tokens_path)] if token else ["--no-auth"]),
                      *(flags or [])]
        self.port = 0   # bound by the registry, read from registry_started (kept on restart)
        self._init_log(self.workdir / "registry.log")
        self.start()

    def start(self, timeout: float = 30.0) -> "RegistryProcess":
        """Start and return once the registry logged ``registry_started``."""
        self._launch(["registry", "--port", str(self.port), *self.flags],
                     r"registry_started", timeout)
        return self


def request(registry: str, op: str, token: str | None = TOKEN, **args: Any) -> dict[str, Any]:
    """One registry op from a test (blocking)."""
    return asyncio.run(registry_request(registry, op, token=token, **args))


def names(registry: str, **query: Any) -> list[str]:
    """The names of the gateways a lookup returns."""
    return [g["name"] for g in request(registry, "registry.lookup", **query)["gateways"]]


def gateway(data_dir: str | os.PathLike[str], registry: str, name: str,
            heartbeat_s: float = 0.3, **registry_table: Any) -> BrokerProcess:
    """A broker (auth off) registering as ``name`` with ``registry``."""
    table = {"addresses": [registry], "token": TOKEN, "name": name, "building": name,
             "heartbeat_s": heartbeat_s, **registry_table}
    return BrokerProcess(data_dir, {"broker": {"auth": "off"}, "registry": table})
