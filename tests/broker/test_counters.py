"""One registry of the broker's counters (lockmq.broker.counters): ``Stats`` and
``/metrics`` both read it, every counter the code counts is in it, and a new counter
is one line there."""
from __future__ import annotations

import re
from pathlib import Path

from lockmq.broker import counters
from lockmq.broker.logs import Stats
from lockmq.broker.metrics import BrokerCollector

HOST = Path(counters.__file__).resolve().parents[1]

#: ``stats.inc("name"`` / ``.c["name"] +=`` (the fast paths), literal names
_COUNTED = re.compile(r'(?:stats|\bst)\.inc\(\s*"([a-z0-9_]+)"|\bc\["([a-z0-9_]+)"\]\s*\+=|'
                      r'stats\.c\["([a-z0-9_]+)"\]\s*\+=')
#: names built at run time: the prefix and every suffix the code passes
_DYNAMIC = {"clusters_refused_": ("owner", "topic", "cap"),
            "commands_refused_": ("too_large", "cap")}
#: counters counted through a variable (replication/primary.py's _stop_holding)
_BY_NAME = ("replication_degraded", "replication_released_on_shutdown")


def counted_names() -> dict[str, str]:
    """Every literal counter name the host code counts -> the file counting it."""
    out = {}
    for path in sorted(HOST.rglob("*.py")):
        if path.name == "counters.py":
            continue
        for m in _COUNTED.finditer(path.read_text()):
            out[next(g for g in m.groups() if g)] = str(path.relative_to(HOST))
    return out


def test_every_counter_the_code_counts_is_registered() -> None:
    names = counted_names()
    assert len(names) > 100          # (the pattern still finds them)
    names.update({p + s: "dynamic" for p, suffixes in _DYNAMIC.items() for s in suffixes})
    names.update({n: "replication/primary.py" for n in _BY_NAME})
    missing = {n: f for n, f in names.items()
               if n not in counters.COUNTERS and not f.startswith(("store/", "mqtt/sim"))}
    assert missing == {}, "add these to lockmq/broker/counters.py"


def test_stats_and_metrics_read_the_same_registry() -> None:
    stats = Stats()
    assert list(stats.c) == list(counters.COUNTERS)     # every one at 0 from the start
    view = {"broker": stats.snapshot(), "connections": 0, "max_connections": 1,
            "devices_online": 0, "log_bytes": 0, "auth": "off"}
    fams = {f.name: f for f in BrokerCollector(lambda: (view, [], {})).collect()}
    for name, help_text in counters.COUNTERS.items():
        exported = "lockmq_" + (name[:-3] + "_seconds" if name.endswith("_ms") else name)
        assert fams[exported].type == "counter" and fams[exported].documentation == help_text
    # the name the stats op shows is the name /metrics exports (no rename table)
    assert "publish_batches" in stats.c and "store_batches" not in stats.c


def test_a_new_counter_is_one_line(monkeypatch) -> None:
    # the one line: an entry in lockmq.broker.counters.COUNTERS
    monkeypatch.setitem(counters.COUNTERS, "doors_painted", "Doors painted by the broker")
    stats = Stats()
    stats.inc("doors_painted", 3)
    view = {"broker": stats.snapshot(), "connections": 0, "max_connections": 1,
            "devices_online": 0, "log_bytes": 0, "auth": "off"}
    fam = {f.name: f for f in BrokerCollector(lambda: (view, [], {})).collect()}[
        "lockmq_doors_painted"]
    assert fam.documentation == "Doors painted by the broker"
    assert [(s.name, s.value) for s in fam.samples] == [("lockmq_doors_painted_total", 3)]
