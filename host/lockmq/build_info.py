"""``lockmq_build_info``: one metric family for every process that serves /metrics (the
broker and a standby), so both say the same thing about their build."""

from __future__ import annotations

import platform

from prometheus_client.core import GaugeMetricFamily

from lockmq import __version__
from lockmq.accel import COMPILED


def build_info_family() -> GaugeMetricFamily:
    """``lockmq_build_info{version, python, hot_path} 1`` (Prometheus' build_info habit)."""
    fam = GaugeMetricFamily("lockmq_build_info", "lockmq build: version, Python, and "
                            "whether the compiled hot path runs (value is 1)",
                            labels=["version", "python", "hot_path"])
    fam.add_metric([__version__, platform.python_version(),
                    "compiled" if COMPILED else "python"], 1)
    return fam
