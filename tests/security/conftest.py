"""Fixtures for the security tests: a real registry in a temp dir, a fake clock."""

from __future__ import annotations

import os

import pytest

from lockmq.security import Guard, SecurityConfig


class FakeClock:
    """A monotonic clock the test moves by hand (no sleeps, no timed asserts)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(1_800_000_000.0)


@pytest.fixture
def cfg(tmp_path) -> SecurityConfig:
    return SecurityConfig(data_dir=str(tmp_path / "data"), limit_exempt_addresses=[],
                          allow_plain_tokens_from=["127.0.0.1"])


@pytest.fixture
def guard(cfg, clock, wall):
    os.makedirs(cfg.data_dir, exist_ok=True)
    g = Guard(cfg, clock=clock, wall=wall)
    yield g
    g.close()


# -- a real `lockmq broker` process with auth required ---------------------------------

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

# LOCKMQ_SECTEST_UVLOOP=0 hides uvloop from the broker process (plain asyncio loop).
_RUN_BROKER = (
    "import os, sys\n"
    "if os.environ.get('LOCKMQ_SECTEST_UVLOOP', '1') == '0': sys.modules['uvloop'] = None\n"
    "from lockmq.cli import main\n"
    "sys.exit(main(sys.argv[1:]))   # exactly the `lockmq` command\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


class BrokerProcess:
    """``lockmq broker`` in a child process on 127.0.0.1, its log lines collected."""

    def __init__(self, data_dir: str, tables: dict) -> None:
        self.data_dir = data_dir
        self.status_port = free_port()
        base = {"broker": {"host": "127.0.0.1", "port": 0, "status_port": self.status_port,
                           "data_dir": data_dir, "auth": "required", "log_level": "INFO",
                           "handshake_timeout_s": 2.0},
                "store": {"min_free_bytes": 0}}
        for name, t in tables.items():
            base.setdefault(name, {}).update(t)
        self.config_path = os.path.join(data_dir, "..", "broker.toml")
        with open(self.config_path, "w") as fh:
            for name, t in base.items():
                fh.write(f"[{name}]\n")
                for k, v in t.items():
                    fh.write(f"{k} = {_toml(v)}\n")
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_BROKER, "broker", "--config", self.config_path],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._pump, daemon=True).start()
        line = self.wait_log(r"broker_started", timeout=30)
        self.port = int(re.search(r"\bport=(\d+)", line).group(1))

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_log(self, pattern: str, timeout: float = 15.0, start: int = 0) -> str:
        """The first log line from index ``start`` matching ``pattern`` (regex)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    if rx.search(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = "\n".join(self.lines[-30:])
                    raise AssertionError(f"no log line matching {pattern!r}; last lines:\n{tail}")
                self._cond.wait(left)

    def mark(self) -> int:
        with self._cond:
            return len(self.lines)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_broker(tmp_path, tables: dict | None = None) -> BrokerProcess:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return BrokerProcess(str(data), tables or {})
