"""``lockmq broker`` in a child process on 127.0.0.1, as an operator runs it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from lockmq.config import ANY_FREE_PORT

from .tables import Tables, merge_tables, to_toml

# Exactly the `lockmq` command; LOCKMQ_TEST_UVLOOP=0 hides uvloop (plain asyncio loop).
_RUN_BROKER = (
    "import os, sys\n"
    "if os.environ.get('LOCKMQ_TEST_UVLOOP', '1') == '0': sys.modules['uvloop'] = None\n"
    "from lockmq.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)

#: The ``lockmq`` command in a child process of this interpreter: ``[*LOCKMQ_COMMAND,
#: "store", "backup", ...]`` (no installed script needed; uvloop as for the broker).
LOCKMQ_COMMAND: list[str] = [sys.executable, "-c", _RUN_BROKER]


def proc_status_kib(pid: int, key: str = "VmRSS") -> int | None:
    """A memory line of ``/proc/PID/status`` in KiB (``VmRSS`` now, ``VmHWM`` the
    peak); None where /proc cannot tell (the process is gone, or no such line).
    (bench/machine.py keeps its own reader: the benchmarks also run against older
    trees' lockmq, see ``proc_status_mb`` there.)"""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def pin_bound_ports(tables: Tables, port: int, tls_port: int | None) -> None:
    """Write the ports a broker bound into ``tables`` where they say "any" (main port
    0, TLS port ``ANY_FREE_PORT``): started again from them, a broker keeps the ports
    its clients know. (The status page may move: nobody keeps its number.)"""
    broker = tables.setdefault("broker", {})
    if port and not broker.get("port"):
        broker["port"] = port
    security = tables.get("security", {})
    if tls_port and security.get("tls_port") == ANY_FREE_PORT:
        security["tls_port"] = tls_port


def kill_process(proc: subprocess.Popen[Any] | None) -> None:
    """SIGKILL ``proc`` if it runs and reap it (a crash, a power cut)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 30.0) -> int:
    """SIGTERM ``proc`` and wait (SIGKILL after ``timeout``); its exit status (0 if
    it never ran)."""
    if proc is None:
        return 0
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_process(proc)
    return int(proc.returncode or 0)


def signal_until_exit(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM,
                      every_s: float = 0.002, timeout: float = 30.0) -> int:
    """Send ``sig`` to ``proc`` every ``every_s`` until it exits (SIGKILL after
    ``timeout``): a service must exit with its own status however often it is
    signalled while it shuts down. Returns the exit status."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(sig)
        time.sleep(every_s)
    return stop_process(proc, timeout)


class BrokerProcess:
    """One ``lockmq broker`` process, its log lines collected.

    The config is written from ``tables`` to ``broker.toml`` beside ``data_dir``
    (auth required, INFO logs and a status page on a free port unless the tables say
    otherwise). The broker is started at once unless ``start=False``; it can be
    killed (SIGKILL: a crash), stopped (SIGTERM) and started again on the same port
    and data directory.

    Ports written as 0 or -1 (``ANY_FREE_PORT``) are bound by the broker itself (no
    number picked here that another process could take first) and learned from its
    ``broker_started`` line: :attr:`port`, :attr:`status_port`, :attr:`tls_port`. A
    restart keeps the main and TLS ports (clients know them); the status page may
    move (:meth:`metrics` follows it).
    """

    def __init__(self, data_dir: str | os.PathLike[str], tables: Tables | None = None,
                 start: bool = True) -> None:
        self.data_dir = str(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.workdir = Path(self.data_dir).parent
        self.tables = merge_tables(
            {"broker": {"host": "127.0.0.1", "port": 0, "status_port": ANY_FREE_PORT,
                        "data_dir": self.data_dir, "auth": "required", "log_level": "INFO",
                        "handshake_timeout_s": 2.0},
             "store": {"min_free_bytes": 0}},
            tables or {})
        self.port = int(self.tables["broker"]["port"])
        #: the status page's port (0: none), the TLS listener's (None: none); both
        #: known once the broker has started
        self.status_port = max(int(self.tables["broker"]["status_port"]), 0)
        self.tls_port: int | None = None
        self.config_path = str(self.workdir / "broker.toml")
        self._init_log(self.workdir / "broker.log")
        if start:
            self.start()

    def _init_log(self, log_path: Path) -> None:
        """The process and log state (for a subclass that runs another command)."""
        self.log_path = log_path
        self.lines: list[str] = []
        #: True while a thread is still reading the process's output
        self._reading = False
        self.starts = 0
        self.proc: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()

    # -- life cycle ---------------------------------------------------------------------
    def start(self, timeout: float = 30.0, ready: str = r"broker_started") -> "BrokerProcess":
        """Start and return once the broker logged ``ready`` (a regex: a standby
        logs ``standby_following``)."""
        if self.running():
            raise RuntimeError("broker already running")
        self.write_config()
        self._launch(["broker", "--config", self.config_path], ready, timeout)
        return self

    def _launch(self, args: list[str], ready: str, timeout: float) -> "BrokerProcess":
        """Run ``lockmq <args>``, pump its output into the log, and return once it
        logged ``ready`` (a line with its ``port=``)."""
        self.starts += 1
        # the log file stays open until the process ends (a test may delete its folder)
        log = open(self.log_path, "a", buffering=1)
        mark = self._add_line(f"==== start #{self.starts} {time.strftime('%H:%M:%S')} ====", log)
        self.proc = subprocess.Popen(
            [*LOCKMQ_COMMAND, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reading = True
        threading.Thread(target=self._pump, args=(self.proc, log), daemon=True).start()
        try:
            line = self.wait_log(ready, timeout=timeout, start=mark)
        except AssertionError:
            try:   # its output ended: it is exiting (let running() say so)
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            raise
        self._learn_ports(line)
        return self

    def _learn_ports(self, line: str) -> None:
        """The ports the broker bound, from its start line (``port=``, and on a
        ``broker_started`` line ``status_port=`` and ``tls_port=``, ``None`` = none)."""
        # (kv ``port=1``, or JSON ``"port": 1`` with log_format = "json")
        self.port = int(re.search(r'\bport"?[=:] ?(\d+)', line).group(1))
        if re.search(r'event"?[=:] ?"?(broker_started|standby_following)', line):
            status = re.search(r'\bstatus_port"?[=:] ?(\d+)', line)
            tls = re.search(r'\btls_port"?[=:] ?(\d+)', line)
            self.status_port = int(status.group(1)) if status else 0
            self.tls_port = int(tls.group(1)) if tls else None

    def write_config(self) -> str:
        """Write ``broker.toml`` (also for CLI commands run before :meth:`start`);
        returns its path."""
        pin_bound_ports(self.tables, self.port, self.tls_port)   # (a restart)
        with open(self.config_path, "w") as fh:
            fh.write(to_toml(self.tables))
        return self.config_path

    def kill(self) -> None:
        """SIGKILL: the broker crashes (what was acked must survive)."""
        kill_process(self.proc)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM: graceful shutdown (SIGKILL after ``timeout``). Returns the exit status."""
        return stop_process(self.proc, timeout)

    def restart(self, crash: bool = True) -> None:
        """Kill (or stop) and start again on the same port and data directory."""
        self.kill() if crash else self.stop()
        self.start()

    def running(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, where clients connect."""
        return f"127.0.0.1:{self.port}"

    # -- the log ------------------------------------------------------------------------
    def _add_line(self, line: str, log: IO[str] | None = None) -> int:
        with self._cond:
            self.lines.append(line)
            if log is not None:
                log.write(line + "\n")
            self._cond.notify_all()
            return len(self.lines)

    def _pump(self, proc: subprocess.Popen[str], log: IO[str]) -> None:
        assert proc.stdout is not None
        with log:
            for line in proc.stdout:
                self._add_line(line.rstrip("\n"), log)
        try:   # EOF comes just before the exit: "all read" then also means "gone"
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        with self._cond:       # every line the process wrote is in self.lines now
            if proc is self.proc:   # (a killed process's pump may end after a restart)
                self._reading = False
            self._cond.notify_all()

    def mark(self) -> int:
        """Where the log is now: pass as ``start`` to :meth:`wait_log`."""
        with self._cond:
            return len(self.lines)

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
                # give up once all output is read (not merely once the process is
                # gone: its last lines, often the reason it died, may still be in
                # the pipe)
                if left <= 0 or not self._reading:
                    raise AssertionError(f"no log line matching {pattern!r}; last lines:\n"
                                         + self.log_tail())
                self._cond.wait(min(left, 0.5))

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's log."""
        with self._cond:
            return "\n".join(self.lines[-lines:])

    def rss_kib(self) -> int:
        """The broker process's resident memory (VmRSS), in KiB."""
        assert self.proc is not None, "broker not started"
        kib = proc_status_kib(self.proc.pid)
        assert kib is not None, f"no VmRSS for broker pid {self.proc.pid}"
        return kib

    # -- the status page ----------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{series: value}``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def __enter__(self) -> "BrokerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
