"""Shared helpers for the benchmarks: machine description and min/median/max."""
from __future__ import annotations

import os
import platform
import statistics
import sys


def machine_info() -> str:
    """One line naming the machine the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"machine: {cpu}, {os.cpu_count()} cpus, {platform.system()} {platform.release()}, "
            f"Python {sys.version.split()[0]} ({platform.python_implementation()})")


def spread(values: list[float]) -> str:
    """'min / median / max' of a list of figures."""
    return (f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"
            if max(values) >= 100 else
            f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}")
