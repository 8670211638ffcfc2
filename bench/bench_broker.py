"""Broker benchmark: lockmq against its floors and its peers, one command.

    .venv/bin/python bench/bench_broker.py            # full run (~5 min)
    .venv/bin/python bench/bench_broker.py --quick    # small sizes (~1-2 min)

Prints the machine, then min/median/max over ``--runs`` runs of each figure, for
three servers driven by the same load generator (``bench/loadgen.py``, 24-byte
LockEvent records, pinned with ``taskset`` to another core than the server):

* ``ack``    — the ack floor: parse the frames, ack each, store nothing;
* ``fsync``  — the durable floor: append every read's records to a file and ack
  after one shared fdatasync (group commit);
* ``c-ack``, ``c-fsync`` — the same two floors compiled (``floor_c.c``: one epoll
  loop in C, built with ``cc -O2 -pthread`` into the run's temp dir; skipped, with
  the reason, when there is no compiler): what the machine can do, where the Python
  floors show what an asyncio server can; c-fsync writes and fdatasyncs inline on
  its one thread, so it reads nothing while the disk syncs;
* ``c-fsync-thread`` — the compiled durable floor with a writer thread, as the
  broker has one: the epoll thread keeps reading while the writer group-commits
  everything queued since its last fdatasync; acks still wait for their fdatasync;
* ``c-fsync-2w`` — the same with two writer threads: while one fdatasyncs, the
  other writes what came since and starts its own (the disk overlaps them); acks go
  back in order, each after its own fdatasync and every earlier one's;
* ``c-delay`` — c-fsync-thread without the disk: each batch's acks wait this disk's
  idle flush latency (the median of 200 2 KiB pwrite + fdatasync, measured by the
  floor at start and written to its log) and nothing is stored, so the acks are as
  late as a durable server's at no I/O cost: durability's latency alone;
  c-fsync-2w and c-delay run only when ``--floors`` names them; ``--floors`` picks
  which floors run (default: the other five);
* ``broker`` — ``lockmq broker`` (durable acks, ``auth = "off"``; fresh data dir;
  the ``storm-N-auth`` scenario runs it with ``auth = "required"`` and every lock
  registered);
* ``mosquitto``, ``redis`` — the peers of the publish scenarios (``peers.py``):
  Mosquitto with MQTT QoS 1 (acks without fsync) and Redis ``XADD`` with
  ``appendfsync always``; Redis is also the peer of the drain (a consumer group of
  4 members, ``XREADGROUP COUNT 100`` + ``XACK``: its ``rate`` is given as its
  ``client_rate`` too); skipped, with the reason, when not installed
  (``scripts/system-deps.sh`` installs both);
* ``before`` — with ``--baseline TREE``, the broker of another source tree (``git
  archive main | tar -x -C /tmp/base``), run alternately with this one;
* ``pure`` — with ``--pure``, this broker with ``LOCKMQ_PURE_PYTHON=1`` (the
  pure-Python hot path instead of ``lockmq._core``): the compiled path's ratio.

``cpu_us`` is each server's CPU time (user + system, all threads) per acknowledged
record over the whole run (handshakes included): on a shared machine it moves far
less than the rates do. ``cpu_usr_us`` and ``cpu_sys_us`` split the server's CPU per
record into user and kernel time over the measured window only (``/proc/PID/stat``
of the server, its reaped children and its live descendants, read by the load
generator when the window opens and closes): the kernel part is the TCP and
fdatasync work every server pays, the user part is what the server's own code
costs. ``gen_busy_pct`` is the load generator's CPU (user + system) over the
window's wall clock: near 100 % the generator, not the server, sets the rate, and
a warning line under the table says so. ``gen_us`` is the generator's own CPU per acked
record: what the client side costs with each server. ``switches`` is the server's context
switches (all its threads, voluntary and involuntary) per record over the window: on one
core, the hand-offs between a server's threads (lockmq's event loop and its store writer).

Every server of a scenario runs once, then every server again (``--runs`` times),
so a noisy neighbour hits all of them alike; lockmq's medians are printed as
ratios to every other server's.

Scenarios: sync send from 100 and 1,000 locks (one record at a time, wait for the
ack); pipelined (100 locks x 32 in flight); a storm of N locks connecting within
one second, one record each; with ``auth = "required"``, 2,000 registered locks x 2 in
flight with plain frames (``auth-2000x2``) and with frame MACs (``auth-mac-2000x2``,
``loadgen.MacLock``: every frame sealed, as the firmware does on plain TCP; broker
only); consumer-cluster delivery (4 lean consumers drain a
preloaded topic, then a second cluster of 4 ``lockmq.client.AsyncConsumer``
members drains it again: ``client_rate``; broker only); end-to-end
publish->consume latency (broker only).
Each broker figure is also given as a ratio to both floors, and checked against
the issue's targets; for the broker, every acknowledged record is also looked up in
its log (``lost``). Nothing here asserts: it reports.

Reading the storm: the generator's storm locks (``loadgen.StormLock``: no task,
timer or Python socket per lock) make 10,000 handshakes in 1 s on one core of a
2-core VM with the ack floor's p99 at ~30 ms when the machine is otherwise idle;
the floors show how much of a p99 is the generator's and the machine's.
``--storm-spread 5`` offers the same 10,000 locks at a fifth of the rate, which
shows the broker's cost per lock without a queue. ``listen_drops`` and ``syn_retrans``
count the handshakes the kernel dropped because the server's accept queue was full,
and the SYNs resent for them (each such lock connects 1 s or more later): where they
are not 0, the p99 holds the kernel's retry too. Other load on the machine moves
every figure: compare the ratios of one run, and look at ``loadavg`` in the
machine line.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import machine_facts, proc_cpu_s, proc_status_mb  # noqa: E402
from peers import PEERS, command as peer_command, peer_binary  # noqa: E402
from lockmq.testing.ports import free_port  # noqa: E402
PY = sys.executable
#: lockmq brokers: this tree's, another tree's (--baseline), this one pure Python (--pure)
LOCKMQ_KINDS = ("broker", "before", "pure")
#: the compiled floors (floor_c.c), by their arguments
C_FLOORS = {"c-ack": ["--mode", "ack"], "c-fsync": ["--mode", "fsync"],
            "c-fsync-thread": ["--mode", "fsync-thread"],
            "c-fsync-2w": ["--mode", "fsync-thread", "--writers", "2"],
            "c-delay": ["--mode", "delay"]}
#: every floor: the Python ones (floors.py) and the compiled ones
FLOORS = ("ack", "fsync", *C_FLOORS)
#: the floors a run has unless ``--floors`` says otherwise: c-fsync-2w answered its
#: question (a second fdatasync in flight moved sync-100 by ~6 %, docs/performance.md
#: "Measured and not kept"), c-delay bounds the sync figures (docs/performance.md
#: "What bounds each figure"); both run on request
DEFAULT_FLOORS = tuple(f for f in FLOORS if f not in ("c-fsync-2w", "c-delay"))
#: the compiled floor's executable, once built (``build_c_floor``)
C_FLOOR_EXE: list[str] = []
BROKER_CMD = [PY, "-c", "import sys, lockmq.cli; sys.exit(lockmq.cli.main())", "broker"]


# -- machine ---------------------------------------------------------------------------
def core_busy_ticks(core: int) -> int:
    """Clock ticks core ``core`` has spent busy (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                ticks = [int(x) for x in line.split()[1:]]
                return sum(ticks) - ticks[3] - ticks[4]
    raise ValueError(f"no cpu{core} in /proc/stat")


def fdatasync_probe(directory: str, core: int, seconds: float = 1.0) -> tuple[float, float]:
    """``(commits per second, µs of core ``core``'s time per commit)`` of 2 KiB pwrites,
    each after the one before in a file of zeros synced first, and an fdatasync each
    (a sync-100 group commit on a preallocated segment), run pinned to ``core``. The
    second figure is what each fdatasync costs the server's core beyond the disk's
    wait: ``/proc/stat`` ticks, so about ±1 tick over the run."""
    path = os.path.join(directory, "fsync-probe")
    size = 16 << 20
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    before = os.sched_getaffinity(0)
    try:
        os.pwrite(fd, bytes(size), 0)
        os.fsync(fd)
        os.sched_setaffinity(0, {core})
        commit = b"r" * 2048
        n = 0
        busy0 = core_busy_ticks(core)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds and (n + 1) * len(commit) <= size:
            os.pwrite(fd, commit, n * len(commit))
            os.fdatasync(fd)
            n += 1
        elapsed = time.monotonic() - t0
        busy_s = (core_busy_ticks(core) - busy0) / os.sysconf("SC_CLK_TCK")
    finally:
        os.sched_setaffinity(0, before)
        os.close(fd)
        os.unlink(path)
    return n / elapsed, busy_s * 1e6 / max(n, 1)


def build_c_floor(directory: str) -> str | None:
    """Compile ``floor_c.c`` with ``cc -O2 -pthread`` into ``directory``; its path, or None
    (with the reason printed) when there is no compiler or the build fails."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        print(f"floors {', '.join(C_FLOORS)}: skipped (no C compiler: apt-get install gcc)")
        return None
    exe = os.path.join(directory, "floor_c")
    out = subprocess.run([cc, "-O2", "-pthread", "-o", exe, os.path.join(HERE, "floor_c.c")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        print(f"floors {', '.join(C_FLOORS)}: skipped (build failed: "
              f"{out.stderr.strip()[-300:]})")
        return None
    return exe


# -- servers ---------------------------------------------------------------------------
def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start listening")


def register_locks(data_dir: str, sns: list[str]) -> str:
    """Register ``sns`` in the device registry of a broker's ``data_dir``; the path of
    a JSON file of their keys (hex) for the load generator."""
    from lockmq.security import DeviceRegistry, SecurityConfig

    reg = DeviceRegistry.open(SecurityConfig(data_dir=data_dir))
    try:
        keys = reg.add_many(sns, mac=False)   # (its locks speak without frame MACs)
    finally:
        reg.close()
    path = os.path.join(data_dir, "bench-keys.json")
    with open(path, "w") as fh:
        json.dump({sn: k.hex() for sn, k in keys.items()}, fh)
    return path


class Server:
    """One server process pinned to ``core`` with ``taskset``."""

    def __init__(self, kind: str, core: str, base_dir: str, flush: str,
                 baseline: str | None = None, lock_sns: list[str] | None = None,
                 tls: bool = False) -> None:
        self.kind = kind
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"{kind}-", dir=base_dir)
        #: with ``lock_sns`` (a broker with ``auth = "required"``): their keys, as
        #: ``--keys`` for the load generator
        self.keys_path = ""
        #: with ``tls`` (a lockmq broker): the TLS port the locks dial, and the CA
        #: that signed its certificate (``--tls-ca`` for the load generator)
        self.tls_port = 0
        self.tls_ca = ""
        env = None
        if kind in LOCKMQ_KINDS:
            auth = "off"
            if lock_sns:
                auth = "required"
                self.keys_path = register_locks(self.dir, lock_sns)
            cmd = BROKER_CMD + ["--host", "127.0.0.1", "--port", str(self.port),
                                "--status-port", "0", "--data-dir", self.dir, "--auth", auth,
                                "--flush", flush, "--log-level", "WARNING"]
            if tls:
                cmd += ["--config", self._tls_config()]
            if kind == "before":   # the same broker from another tree (``--baseline``)
                env = dict(os.environ, PYTHONPATH=os.path.join(str(baseline), "host"))
            elif kind == "pure":   # this broker without its compiled hot path
                env = dict(os.environ, LOCKMQ_PURE_PYTHON="1")
        elif kind in PEERS:
            cmd = peer_command(kind, self.port, self.dir)
        elif kind in C_FLOORS:
            cmd = [C_FLOOR_EXE[0], *C_FLOORS[kind], "--port", str(self.port),
                   "--dir", self.dir]
        else:
            cmd = [PY, os.path.join(HERE, "floors.py"), "--mode", kind, "--port",
                   str(self.port), "--dir", self.dir]
        self.log = open(os.path.join(base_dir, f"{kind}-{self.port}.log"), "wb")
        self.proc = subprocess.Popen(["taskset", "-c", core] + cmd, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        wait_listening(self.tls_port or self.port, self.proc)

    def _tls_config(self) -> str:
        """A CA and a certificate for 127.0.0.1 made in the data dir, and the broker's
        config file serving TLS with them on a port of its own; the file's path."""
        from lockmq.security.certs import init_ca_and_server

        certs = init_ca_and_server(os.path.join(self.dir, "certs"), ["gw.local"], ["127.0.0.1"])
        self.tls_port = free_port()
        self.tls_ca = certs.ca_pem
        path = os.path.join(self.dir, "tls.toml")
        with open(path, "w") as fh:
            fh.write(f"[security]\ntls_cert = {json.dumps(certs.server_pem)}\n"
                     f"tls_key = {json.dumps(certs.server_key)}\ntls_port = {self.tls_port}\n")
        return path

    def stored(self, topic: str) -> int | None:
        """Records the broker holds in ``topic`` (admin op ``topics``); None if unknown."""
        if self.kind not in LOCKMQ_KINDS:
            return None
        try:
            from lockmq.client import Admin

            with Admin(f"127.0.0.1:{self.port}") as admin:
                for t in admin.request("topics").get("topics", []):
                    if t["topic"] == topic:
                        return int(t["queue_end"]) - int(t["queue_start"])
            return 0
        except Exception:  # noqa: BLE001 - reported as unknown
            return None

    def peak_rss_mb(self) -> float | None:
        """The server's peak resident memory (``VmHWM``), e.g. while it held the
        storm's 10,000 connections; None where /proc cannot tell."""
        return proc_status_mb(self.proc.pid, "VmHWM")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def loadgen(core: str, port: int, args: list[str], timeout: float) -> dict[str, Any]:
    """Run one load-generator scenario pinned to ``core``; its JSON result."""
    cmd = ["taskset", "-c", core, PY, os.path.join(HERE, "loadgen.py"), *args,
           "--port", str(port)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]}
    return json.loads(lines[-1])


# -- scenarios -------------------------------------------------------------------------
#: where the CPU goes: the server's per record (whole run; user and kernel over the
#: measured window) and the load generator's busy share of that window
CPU_FIGURES = ("cpu_us", "cpu_usr_us", "cpu_sys_us", "switches", "gen_busy_pct", "gen_us")
#: the load generator's own figures: a share and a cost of the client, not of the server
GEN_FIGURES = ("gen_busy_pct", "gen_us")
PUBLISH_FIGURES = ("rate", "p50_ms", "p99_ms", "lost", *CPU_FIGURES)
#: a storm's handshakes dropped by the server's full accept queue, and the SYNs sent
#: again for them (the kernel's TcpExt counters over the storm; Linux only)
STORM_TCP_FIGURES = ("listen_drops", "syn_retrans")
#: the storm's --storm-spread (its "done" target is that + 0.1 s), set by main
STORM_SPREAD_S = [1.0]
#: above this busy share the generator, not the server, is the limit of a rate
GEN_BUSY_WARN_PCT = 90.0

def scenarios(a: argparse.Namespace, peers: tuple[str, ...] = (),
              floors: tuple[str, ...] = ("ack", "fsync")) -> list[dict[str, Any]]:
    """Every scenario: name, servers, load-generator args, the figures it reports.
    ``peers`` (Mosquitto, Redis) join the publish scenarios, ``floors`` (Python and
    compiled) the publish and storm ones; ``--baseline`` adds the broker of
    another tree (``before``) to every scenario the broker runs."""
    d = str(a.duration)
    lockmq = ("broker", *(("before",) if a.baseline else ()), *(("pure",) if a.pure else ()))
    pub = (*floors, *peers, *lockmq)
    out = [
        {"name": "sync-100", "servers": pub,
         "args": ["publish", "--locks", "100", "--window", "1", "--duration", d],
         "figures": PUBLISH_FIGURES},
        {"name": "sync-1000", "servers": pub,
         "args": ["publish", "--locks", "1000", "--window", "1", "--duration", d],
         "figures": PUBLISH_FIGURES},
        {"name": "pipelined-100x32", "servers": pub,
         "args": ["publish", "--locks", "100", "--window", "32", "--duration", d],
         "figures": PUBLISH_FIGURES},
        {"name": f"storm-{a.storm_locks}", "servers": (*floors, *lockmq),
         "args": ["storm", "--locks", str(a.storm_locks), "--spread", str(a.storm_spread)],
         "figures": ("acked_pct", "seconds", "p50_ms", "p99_ms", "lost", "peak_rss_mb",
                     *CPU_FIGURES, *STORM_TCP_FIGURES)},
        {"name": f"storm-{a.storm_locks}-auth", "servers": lockmq,
         # auth = "required": every lock registered, HMAC challenge-response, on a
         # topic locks may publish to (security.lock_topics); the admin lookup of
         # ``lost`` needs a token, so it is not made here
         "args": ["storm", "--locks", str(a.storm_locks), "--spread", str(a.storm_spread),
                  "--topic", "lock.bench"],
         "lock_sns": [f"BENCH-{i:06d}" for i in range(a.storm_locks)],
         "figures": ("acked_pct", "seconds", "p50_ms", "p99_ms", "peak_rss_mb",
                     *CPU_FIGURES, *STORM_TCP_FIGURES)},
        # auth = "required", 2,000 registered locks x 2 in flight (under the default
        # per-lock message rate), first with plain frames, then with frame MACs as the
        # firmware sends them on plain TCP: what sealing every frame costs the broker
        *({"name": name, "servers": lockmq,
           "args": ["publish", "--locks", "2000", "--window", "2", "--duration", d,
                    "--topic", "lock.bench", *mac],
           "lock_sns": [f"BENCH-{i:06d}" for i in range(2000)],
           "figures": ("rate", "p50_ms", "p99_ms", *CPU_FIGURES)}
          for name, mac in (("auth-2000x2", ()), ("auth-mac-2000x2", ("--mac",)))),
        # the same locks over TLS (the transport the docs recommend wherever a lock can
        # afford it; no frame MACs there): a TLS session's reads never take the lane
        {"name": "auth-tls-2000x2", "servers": lockmq, "tls": True,
         "args": ["publish", "--locks", "2000", "--window", "2", "--duration", d,
                  "--topic", "lock.bench"],
         "lock_sns": [f"BENCH-{i:06d}" for i in range(2000)],
         "figures": ("rate", "p50_ms", "p99_ms", *CPU_FIGURES)},
        {"name": f"deliver-{a.consumers}c",
         "servers": (*(("redis",) if "redis" in peers else ()), *lockmq),
         "args": ["deliver", "--messages", str(a.deliver_messages), "--consumers",
                  str(a.consumers), "--client"],
         "figures": ("rate", "lost", "duplicates", "client_rate", "client_lost")},
        {"name": "e2e-latency", "servers": lockmq,
         "args": ["e2e", "--locks", "100", "--rate", str(a.e2e_rate), "--duration",
                  str(a.e2e_duration)],
         "figures": ("p50_ms", "p99_ms", "lost")},
    ]
    if a.only:
        out = [s for s in out if any(s["name"].startswith(o) for o in a.only)]
    return out


def available_peers(wanted: list[str]) -> tuple[str, ...]:
    """The peers that can run here; each one that cannot is named with the reason."""
    got = []
    for kind in wanted:
        if peer_binary(kind) is None:
            print(f"peer {kind}: skipped (not installed; scripts/system-deps.sh installs it)")
        else:
            got.append(kind)
    return tuple(got)


def stats3(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


TARGETS = {
    # (scenario pattern (fnmatch; the first that matches a scenario's figure is its
    # target), figure): (description, check(broker_median, floors) -> bool)
    # issue 14: the peers of the same run (a missing peer: NOT MET, never assumed)
    ("sync-*", "rate"): ("sync >= Mosquitto QoS 1",
                         lambda b, f: b >= f.get("mosquitto", float("inf"))),
    ("pipelined*", "rate"): ("pipelined >= 0.5 x Redis appendfsync always",
                             lambda b, f: b >= 0.5 * f.get("redis", float("inf"))),
    ("storm*", "acked_pct"): ("100 % acknowledged", lambda b, f: b >= 100.0),
    # issue 38: p99 <= 100 ms with auth = "required", <= 50 ms with it off
    ("storm*-auth", "p99_ms"): ("p99 <= 100 ms", lambda b, f: b <= 100.0),
    ("storm*", "p99_ms"): ("p99 <= 50 ms", lambda b, f: b <= 50.0),
    # issue 38: every lock acked within 0.1 s after the last one was offered
    ("storm*", "seconds"): ("done within the spread + 0.1 s",
                            lambda b, f: b <= STORM_SPREAD_S[0] + 0.1),
    ("deliver*", "rate"): (">= 100k msg/s", lambda b, f: b >= 100_000),
    ("deliver*", "lost"): ("nothing lost", lambda b, f: b == 0),
    ("deliver*", "client_lost"): ("nothing lost", lambda b, f: b == 0),
    ("deliver*", "client_rate"): ("AsyncConsumer >= Redis consumer groups",
                                  lambda b, f: b >= f.get("redis", float("inf"))),
    ("sync*", "lost"): ("no acked record missing", lambda b, f: b == 0),
    ("pipelined*", "lost"): ("no acked record missing", lambda b, f: b == 0),
    ("storm*", "lost"): ("no acked record missing", lambda b, f: b == 0),
}


def target_of(scenario: str, figure: str) -> "tuple[str, Any] | None":
    """The (description, check) of ``scenario``'s ``figure``: the first pattern of
    :data:`TARGETS` that matches; None when it has no target."""
    for (pattern, fig), target in TARGETS.items():
        if fig == figure and fnmatch.fnmatchcase(scenario, pattern):
            return target
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes: 1 s runs, 2,000-lock storm, 20,000 deliveries")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per publish run")
    ap.add_argument("--storm-locks", type=int, default=10_000)
    ap.add_argument("--storm-spread", type=float, default=1.0,
                    help="seconds over which the storm's locks connect")
    ap.add_argument("--deliver-messages", type=int, default=200_000)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--e2e-rate", type=float, default=2000.0, help="msg/s for the latency run")
    ap.add_argument("--e2e-duration", type=float, default=5.0)
    ap.add_argument("--flush", choices=("sync", "async"), default="sync",
                    help="broker durability mode (default sync: ack after fdatasync)")
    ap.add_argument("--server-core", default="0")
    ap.add_argument("--client-core", default="1")
    ap.add_argument("--only", nargs="*", help="run only scenarios starting with these names")
    ap.add_argument("--dir", default=None, help="where servers keep data (default: a temp dir)")
    ap.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                    help="peers run beside lockmq in the publish scenarios (default: all)")
    ap.add_argument("--baseline", metavar="TREE",
                    help="also run the broker of another source tree (e.g. `git archive "
                         "main`), alternating with this one: the before/after ratio")
    ap.add_argument("--floors", nargs="*", default=list(DEFAULT_FLOORS), choices=FLOORS,
                    help="floors run beside lockmq in the publish and storm scenarios "
                         "(default: all but c-fsync-2w and c-delay; `--floors ack fsync`: no compiled "
                         "floor, none built; `--floors` alone: no floor)")
    ap.add_argument("--pure", action="store_true",
                    help="also run this broker with LOCKMQ_PURE_PYTHON=1 (no compiled hot "
                         "path), alternating with it: the compiled/pure ratio")
    a = ap.parse_args()
    if a.quick:
        a.duration = min(a.duration, 1.0)
        a.storm_locks = min(a.storm_locks, 2000)
        a.deliver_messages = min(a.deliver_messages, 20_000)
        a.e2e_duration = min(a.e2e_duration, 2.0)
    STORM_SPREAD_S[0] = a.storm_spread
    if shutil.which("taskset") is None:
        print("bench: taskset (util-linux) is needed to pin server and load generator",
              file=sys.stderr)
        return 2
    base = a.dir or tempfile.mkdtemp(prefix="lockmq-bench-")
    os.makedirs(base, exist_ok=True)
    info = machine_facts()
    rate, cpu_us = fdatasync_probe(base, int(a.server_core))
    info["fdatasync_per_s"] = round(rate)
    info["fdatasync_core_us"] = round(cpu_us, 1)   # the server core's time per fdatasync
    print("lockmq broker benchmark")
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    print(f"server on core {a.server_core}, load generator on core {a.client_core} (taskset); "
          f"{a.runs} runs per figure; records of 24 bytes; broker flush={a.flush}, auth=off")
    print(f"data under {base}\n", flush=True)
    peers = available_peers(a.peers)
    wants_c = any(f in C_FLOORS for f in a.floors)
    exe = build_c_floor(base) if wants_c else None
    if exe:
        C_FLOOR_EXE[:] = [exe]
    floors = tuple(f for f in FLOORS if f in a.floors and (exe or f not in C_FLOORS))
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for sc in scenarios(a, peers, floors):
        results[sc["name"]] = {kind: [] for kind in sc["servers"]}
        # run r of every server, then run r + 1: a noisy neighbour hits all alike
        for r in range(a.runs):
            for kind in sc["servers"]:
                args = sc["args"] + (["--peer", kind] if kind in PEERS else [])
                sns = sc.get("lock_sns") if kind in LOCKMQ_KINDS else None
                srv = Server(kind, a.server_core, base, a.flush, a.baseline, sns,
                             tls=bool(sc.get("tls")))
                if srv.keys_path:
                    args = args + ["--keys", srv.keys_path]
                if srv.tls_ca:
                    args = args + ["--tls-ca", srv.tls_ca]
                try:
                    cpu0 = proc_cpu_s(srv.proc.pid)
                    res = loadgen(a.client_core, srv.tls_port or srv.port,
                                  args + ["--server-pid", str(srv.proc.pid)], timeout=600)
                    cpu1 = proc_cpu_s(srv.proc.pid)
                    if res.get("acked_total") and cpu0 is not None and cpu1 is not None:
                        # the server's CPU (every thread) per acked record: what a
                        # busy neighbour on the machine moves least
                        res["cpu_us"] = (cpu1 - cpu0) / res["acked_total"] * 1e6
                    if "acked_total" in res and not srv.keys_path:
                        stored = srv.stored("bench.events")
                        if stored is not None:
                            # every acknowledged record must be in the log
                            res["stored"] = stored
                            res["lost"] = max(0, res["acked_total"] - stored)
                    rss = srv.peak_rss_mb()
                    if rss is not None:
                        res["peak_rss_mb"] = rss
                finally:
                    srv.stop()
                results[sc["name"]][kind].append(res)
                brief = {k: (round(v, 2) if isinstance(v, float) else v)
                         for k, v in res.items() if k in sc["figures"] or k == "error"}
                print(f"  {sc['name']:18s} {kind:{KIND_W}s} run {r + 1}: {brief}", flush=True)
    report(results, scenarios(a, peers, floors))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"machine": info, "args": vars(a), "results": results}, fh, indent=1)
    if not a.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


RATIO_TO = (*FLOORS, "mosquitto", "redis", "before", "pure")
#: width of the server column (the longest server name: c-fsync-thread)
KIND_W = 14
#: width of each ratio column ("x c-fsync-thread" is wider than the others)
RATIO_W = {k: max(9, len("x " + k)) for k in RATIO_TO}


def ceiling_notes(name: str, medians: dict[str, float]) -> list[str]:
    """Where the compiled ack floor -- a lockmq server in C that parses and acks and
    stores nothing -- stands against each peer with the same load generator. When the
    generator sets the rate, this is about as far as any lockmq server gets: what the
    lockmq client side costs the generator (CRC-16 both ways, longer frames) is in it."""
    floor = medians.get("c-ack")
    if not floor:
        return []
    return [f"ceiling: {name}: c-ack, a lockmq server that stores nothing, reaches "
            f"{floor / medians[peer]:.2f}x {peer} with this generator"
            for peer in ("mosquitto", "redis") if medians.get(peer)]


def report(results: dict[str, Any], scs: list[dict[str, Any]]) -> None:
    """The summary table: min/median/max, lockmq's ratios to every other server, targets."""
    print("\nsummary (min / median / max over runs; x S = lockmq median / median of S; "
          "before = --baseline tree; pure = this broker with LOCKMQ_PURE_PYTHON=1)")
    print("cpu_us: server CPU per record, whole run; cpu_usr_us / cpu_sys_us: its user / "
          "kernel CPU per record in the measured window; switches: its context switches per "
          "record there; gen_busy_pct: the load generator's "
          "CPU share of that window; gen_us: the load generator's CPU per acked record; "
          "seconds (storms): from the first lock offered to the last one acked")
    print(f"{'scenario':18s} {'figure':12s} {'server':{KIND_W}s} {'min':>10s} {'median':>10s} "
          f"{'max':>10s}  " + " ".join(f"{'x ' + k:>{RATIO_W[k]}s}" for k in RATIO_TO) + "  target")
    warnings: list[str] = []
    for sc in scs:
        name = sc["name"]
        for fig in sc["figures"]:
            rows = []
            medians: dict[str, float] = {}
            for kind in sc["servers"]:
                runs = results[name].get(kind, [])
                vals = [r[fig] for r in runs if fig in r]
                if not vals:
                    if any("error" in r for r in runs):
                        rows.append(f"{name:18s} {fig:12s} {kind:{KIND_W}s} {'(failed)':>10s}")
                    continue
                lo, med, hi = stats3([float(v) for v in vals])
                medians[kind] = med
                rows.append((kind, lo, med, hi))
            for row in rows:
                if isinstance(row, str):
                    print(row)
                    continue
                kind, lo, med, hi = row
                ratios = target = ""
                if kind in LOCKMQ_KINDS:
                    ratios = " ".join(
                        f"{med / medians[k]:>{RATIO_W[k]}.2f}" if medians.get(k) and k != kind
                        else " " * RATIO_W[k] for k in RATIO_TO)
                    found = target_of(name, fig)
                    if found is not None:
                        desc, check = found
                        target = f"{desc}: {'MET' if check(med, medians) else 'NOT MET'}"
                if fig in GEN_FIGURES:
                    ratios = " " * (sum(RATIO_W.values()) + len(RATIO_TO) - 1)   # not the server's
                    if fig == "gen_busy_pct" and med >= GEN_BUSY_WARN_PCT:
                        warnings.append(f"warning: {name} {kind}: the load generator was busy "
                                        f"{med:.0f} % of the window: the generator, not "
                                        f"{kind}, may be the limit of its rate")
                if fig == "listen_drops" and hi > 0:
                    warnings.append(f"warning: {name} {kind}: its full accept queue dropped up "
                                    f"to {hi:.0f} handshakes in a run: those locks waited for "
                                    f"a SYN retransmission (1 s or more): its p99 holds "
                                    f"the kernel's retry as well as its own queue")
                print(f"{name:18s} {fig:12s} {kind:{KIND_W}s} {fmt(lo):>10s} {fmt(med):>10s} "
                      f"{fmt(hi):>10s}  {ratios}  {target}")
            if fig == "rate":
                warnings.extend(ceiling_notes(name, medians))
    for line in warnings:
        print(line)


if __name__ == "__main__":
    sys.exit(main())
