"""The short soak (issue 12's proof, at time-scale): a few simulated days of a small
building through ``bench/soak.py`` -- the full month is ``bench/soak.py`` itself."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

_SOAK = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "soak.py")


def _soak_module():
    spec = importlib.util.spec_from_file_location("lockmq_bench_soak", _SOAK)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # (dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


def test_short_soak_keeps_disk_bounded_delivers_expires_and_exports(tmp_path):
    soak = _soak_module()
    res = soak.soak(days=4, locks=40, retention_days=1, offsets_retention_days=1,
                    abandon_day=1, work_dir=str(tmp_path))
    assert res.problems() == []
    # the checks are not vacuous: retention deleted, clusters skipped and expired
    assert res.disk_bytes[-1] < res.written_bytes / 2    # about 1 of 4 days is kept
    assert res.lagging_skipped > 0 and res.clusters_expired == 1
    assert res.delivered_live == res.acked_events > 0
    assert res.exported_records >= res.acked
    try:
        png = soak.plot(res, str(tmp_path / "disk.png"))
    except ImportError:
        pytest.skip("matplotlib (the bench extra) is not installed: plot not drawn")
    assert os.path.getsize(png) > 1000
