"""Shared helpers for the benchmarks: what machine this is, and min/median/max."""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any


def machine_facts(data_dir: str | None = None) -> dict[str, Any]:
    """CPU, cores, memory, kernel, Python, uvloop, load; the file system of ``data_dir``."""
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(),
                            "cores": os.cpu_count(), "kernel": platform.release(),
                            "python": sys.version.split()[0],
                            "implementation": platform.python_implementation(),
                            "loadavg": [round(x, 2) for x in os.getloadavg()]}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            info["mem_gb"] = round(int(fh.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        import uvloop
        info["uvloop"] = uvloop.__version__
    except ImportError:
        info["uvloop"] = None
    if data_dir is not None:
        try:
            info["filesystem"] = subprocess.run(["df", "-T", data_dir], capture_output=True,
                                                text=True).stdout.splitlines()[1].split()[1]
        except (OSError, IndexError):
            info["filesystem"] = "?"
    return info


def machine_info() -> str:
    """One line naming the machine the figures were measured on."""
    f = machine_facts()
    return (f"machine: {f['cpu']}, {f['cores']} cpus, {f.get('mem_gb', '?')} GB, Linux "
            f"{f['kernel']}, Python {f['python']} ({f['implementation']}), "
            f"load {' '.join(map(str, f['loadavg']))}")


def spread(values: list[float]) -> str:
    """'min / median / max' of a list of figures."""
    return (f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"
            if max(values) >= 100 else
            f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}")


def proc_status_mb(pid: int, key: str = "VmRSS") -> float | None:
    """A memory line of ``/proc/PID/status`` in MiB (``VmRSS`` now, ``VmHWM`` the
    peak); None where /proc cannot tell. (Not ``lockmq.testing.proc_status_kib``: the
    benchmarks also run against a ``--baseline`` tree's lockmq, which may predate it.)"""
    try:
        with open(f"/proc/{pid}/status") as fh:
            lines = [line for line in fh if line.startswith(key + ":")]
    except OSError:
        return None
    return int(lines[0].split()[1]) / 1024 if lines else None


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces
    and parentheses): ``[1]`` the parent pid, ``[11]``/``[12]`` user/system ticks,
    ``[13]``/``[14]`` those of its waited-for children. The one parser of that file."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) process ``pid`` used so far; None
    where /proc cannot tell."""
    try:
        f = _stat_fields(pid)
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def proc_tree_cpu(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of process ``pid`` (every thread), of its children it
    has waited for, and of its live descendants (a server that forks, e.g. Redis
    rewriting its AOF); None where /proc cannot tell."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        f = _stat_fields(pid)
    except OSError:
        return None
    user, system = int(f[11]) + int(f[13]), int(f[12]) + int(f[14])
    parents = {pid}
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        entries = []
    stats = {}
    for e in entries:
        try:
            stats[e] = _stat_fields(e)
        except OSError:
            continue
    grew = True
    while grew:   # descendants of descendants: walk until no new one is found
        grew = False
        for e, f in stats.items():
            if e not in parents and int(f[1]) in parents:
                parents.add(e)
                user += int(f[11])
                system += int(f[12])
                grew = True
    return user / tick, system / tick


def proc_switches(pid: int) -> int | None:
    """Context switches (voluntary + involuntary) of every live thread of process
    ``pid`` so far; None where /proc cannot tell. On one core a thread that wakes
    another pays two of them: the hand-offs between a server's threads show here."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                for line in fh:   # voluntary_ctxt_switches, nonvoluntary_ctxt_switches
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue   # (a thread that ended since the listing)
    return total


#: the kernel's TcpExt counters a connection storm is read by (``/proc/net/netstat``):
#: SYNs and handshakes dropped because a listener's accept queue was full, and the
#: SYNs clients sent again (the first retry waits 1 s: a lock dropped so is a second late)
TCP_STORM_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPSynRetrans")


def tcp_ext_counters(names: tuple[str, ...] = TCP_STORM_COUNTERS) -> dict[str, int] | None:
    """The storm's ``TcpExt`` counters (the broker's own reader, see
    ``lockmq.broker.acceptq``); None where /proc cannot tell."""
    from lockmq.broker.acceptq import tcp_ext_counters as read

    return read(names)


class CpuWindow:
    """The CPU a measured window cost: this process's own (the load generator's busy
    share of the wall clock) and, with ``server_pid``, the server's (user and system,
    see ``proc_tree_cpu``), both over the same window."""

    def __init__(self, server_pid: int = 0) -> None:
        self.server_pid = server_pid
        self.t0 = time.monotonic()
        self.own0 = os.times()
        self.server0 = proc_tree_cpu(server_pid) if server_pid else None
        self.switches0 = proc_switches(server_pid) if server_pid else None

    def figures(self, records: int) -> dict[str, float]:
        """``gen_busy_pct`` (user + system over wall, %), ``gen_usr_s``/``gen_sys_s``;
        with a server: ``cpu_usr_us``/``cpu_sys_us`` (server CPU per record) and
        ``switches`` (its threads' context switches per record)."""
        wall = time.monotonic() - self.t0
        own = os.times()
        usr, sys_ = own.user - self.own0.user, own.system - self.own0.system
        out = {"gen_busy_pct": 100.0 * (usr + sys_) / wall if wall > 0 else 0.0,
               "gen_usr_s": usr, "gen_sys_s": sys_}
        server1 = proc_tree_cpu(self.server_pid) if self.server_pid else None
        if self.server0 is not None and server1 is not None and records:
            out["cpu_usr_us"] = (server1[0] - self.server0[0]) / records * 1e6
            out["cpu_sys_us"] = (server1[1] - self.server0[1]) / records * 1e6
        switches1 = proc_switches(self.server_pid) if self.server_pid else None
        if self.switches0 is not None and switches1 is not None and records:
            out["switches"] = (switches1 - self.switches0) / records
        return out
