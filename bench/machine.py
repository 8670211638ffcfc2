"""Shared helpers for the benchmarks: what machine this is, and min/median/max."""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
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
    peak); None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) process ``pid`` used so far; None
    where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None
