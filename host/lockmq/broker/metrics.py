"""``/metrics``: the broker's counters and gauges through ``prometheus_client``.

One :class:`BrokerCollector` per broker, in a registry of its own (never the
process-wide default registry: two brokers in one test process must not clash),
reads the broker's state at scrape time through two public views -- the ``stats``
and ``clusters`` admin ops -- so it holds no copy that could drift. Every metric
has ``# HELP``/``# TYPE``; counters end in ``_total`` (prometheus_client's counter
family adds it); label values are escaped by the library.

``lockmq_cluster_backlog{cluster,topic}`` lists every cluster the broker knows,
also one with no member connected (only its positions file on disk): that is the
series to alert on, and it must not vanish when the consumers are down.
"""

from __future__ import annotations

import re
import shutil
from typing import Any, Callable, Iterator

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from lockmq.build_info import build_info_family

from .counters import COUNTERS
from .firmware_bundles import UPDATE_STATES
from .latency import Latencies

PREFIX = "lockmq_"

#: The store's counters (``stats`` op, ``store``), exported as ``lockmq_store_<name>``.
STORE_COUNTER_HELP: dict[str, str] = {
    "records": "Records appended to the commit log",
    "duplicates": "Records dropped by the store's producer dedup",
    "batches": "Group commits written",
    "bytes": "Bytes appended to the commit log",
    "fsyncs": "fsync calls of the store",
    "checkpoints": "Store checkpoints written",
    "full": "Batches refused because the disk is full (min_free_bytes)",
    "skipped_records": "Records retention deleted before the slowest cluster read them",
    "time_rolls": "Segments closed by age (segment_ms) rather than size",
    "damaged_records": "Records in quarantined damaged ranges of the log (never served)",
    "damaged_ranges": "Quarantined damaged ranges of the log (lockmq store damage DIR)",
}

#: Per-cluster counters of live clusters (since the cluster was opened), as
#: ``lockmq_cluster_<name>_total{cluster,topic}``.
CLUSTER_COUNTER_HELP: dict[str, str] = {
    "delivered": "Messages delivered to the cluster's members",
    "acked": "Messages acknowledged by the cluster's members",
    "nacked": "Messages negatively acknowledged",
    "redelivered": "Messages delivered again",
    "redelivered_after_timeout": "Messages delivered again after the visibility timeout",
    "released": "Leases released by a leaving member",
    "retried": "Messages moved to a retry level",
    "dead_lettered": "Messages moved to the dead-letter topic",
    "member_cap_hits": "Pulls limited by max_inflight_per_member",
    "cluster_cap_hits": "Pulls limited by max_inflight_per_cluster",
    "unknown_lease": "ACK/NACK of a lease the cluster does not hold",
    "skipped": "Messages retention deleted before the cluster read them (it skipped them)",
    "damaged_skipped": "Damaged records the cluster passed over (each has a $dlq entry)",
}

#: Per-cluster gauges from the ``clusters`` op (live and offline clusters alike).
CLUSTER_GAUGES: dict[str, tuple[str, Callable[[dict[str, Any]], float]]] = {
    "backlog": ("Messages of the topic the cluster has not finished (lag); "
                "also for clusters with no member connected", lambda c: c["backlog"]),
    "inflight": ("Messages leased to members and not yet acknowledged",
                 lambda c: c.get("inflight", 0)),
    "members": ("Members connected to the cluster", lambda c: len(c.get("members", ()))),
    "live": ("1 while the cluster is open in the broker, 0 when only its positions "
             "file is on disk", lambda c: 1 if c.get("live", True) else 0),
    "dead_letters": ("Messages in the cluster's dead-letter topic",
                     lambda c: c.get("dlq_size", 0)),
}

#: a key of ``Guard.status()``: ``security_<event>_total{reason="..."}`` or a gauge name
_GUARD_KEY = re.compile(r'^(?P<name>[a-z0-9_]+?)(?:\{reason="(?P<reason>[^"]*)"\})?$')


class BrokerCollector(Collector):
    """Builds every metric family from the broker's views at scrape time.

    ``views`` returns ``(stats, clusters, extra_gauges)``: the ``stats`` admin
    op's answer, the ``clusters`` op's list, and gauges only the caller knows
    (status-page connections, free disk) as ``name -> (help, value)``.
    ``latency``: the broker's histograms (lockmq.broker.latency), when it has them."""

    def __init__(self, views: Callable[[], tuple[dict[str, Any], list[dict[str, Any]],
                                                 dict[str, tuple[str, float]]]],
                 latency: Latencies | None = None) -> None:
        self.views = views
        self.latency = latency

    def collect(self) -> Iterator[Metric]:
        """Every family, each name once (prometheus_client calls this per scrape)."""
        stats, clusters, extra = self.views()
        yield build_info_family()
        yield from _broker_gauges(stats, extra)
        if self.latency is not None:
            yield from _histograms(self.latency)
        yield from _counters("", stats["broker"], COUNTERS, {})
        yield from _counters("store_", stats.get("store", {}), STORE_COUNTER_HELP,
                             {"store_full": "full"})
        yield from _cluster_families(clusters)
        yield from _guard_families(stats.get("security") or {})
        yield from _firmware_families(stats.get("firmware"))


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, help_text, value=value)


def _broker_gauges(stats: dict[str, Any],
                   extra: dict[str, tuple[str, float]]) -> Iterator[Metric]:
    yield _gauge("uptime_seconds", "Seconds since the broker started",
                 stats["broker"]["uptime_s"])
    yield _gauge("connections", "Protocol connections open now", stats["connections"])
    yield _gauge("max_connections", "Protocol connections the broker accepts at most",
                 stats["max_connections"])
    yield _gauge("auth_required", "1 when every connection authenticates, 0 with auth = off",
                 1 if stats.get("auth") == "required" else 0)
    yield _gauge("devices_online", "Locks connected now", stats["devices_online"])
    yield _gauge("store_log_bytes", "Bytes of commit log kept on disk", stats["log_bytes"])
    queue = stats.get("accept_queue") or {}
    if queue.get("waiting", -1) >= 0:   # (Linux: the kernel tells a listener's queue)
        yield _gauge("accept_queue", "Connections the kernel holds for the broker's "
                     "listeners to accept (a reconnect storm the loop is behind on)",
                     queue["waiting"])
        yield _gauge("accept_queue_size", "Connections the listeners' accept queues hold "
                     "at most (backlog, capped by net.core.somaxconn)", queue["size"])
    if queue.get("host_listen_overflows", -1) >= 0:
        yield CounterMetricFamily(
            PREFIX + "host_listen_overflows", "Handshakes the host's kernel dropped because "
            "an accept queue was full (every listener of the host, since boot): each "
            "such client connects again only after its SYN is resent, 1 s or more later",
            value=queue["host_listen_overflows"])
    for name, (help_text, value) in extra.items():
        yield _gauge(name, help_text, value)


def _counters(prefix: str, values: dict[str, Any], helps: dict[str, str],
              renames: dict[str, str]) -> Iterator[Metric]:
    named = {renames.get(key, key): value for key, value in values.items()}
    for name in helps:
        # every known counter from the first scrape, at 0 until it counts: an alert on
        # increase(...) must see the first event, and a series that appears only with
        # it has nothing to increase from
        named.setdefault(name, 0)
    for name, value in sorted(named.items()):
        if name == "uptime_s" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        help_text = helps.get(name, f"lockmq counter {prefix}{name}")
        if name.endswith("_ms"):
            # Prometheus counts time in seconds (promtool refuses abbreviated units)
            name, value = name[:-3] + "_seconds", value / 1000.0
        yield CounterMetricFamily(PREFIX + prefix + name, help_text, value=value)


def _histograms(latency: Latencies) -> Iterator[Metric]:
    for name, hist in latency.items():
        yield HistogramMetricFamily(f"{PREFIX}{name}_seconds", latency.HELP[name],
                                    buckets=hist.buckets(), sum_value=hist.sum)


def _cluster_families(clusters: list[dict[str, Any]]) -> Iterator[Metric]:
    labels = ["cluster", "topic"]
    for name, (help_text, value_of) in CLUSTER_GAUGES.items():
        fam = GaugeMetricFamily(f"{PREFIX}cluster_{name}", help_text, labels=labels)
        for c in clusters:
            fam.add_metric([c["name"], c["topic"]], value_of(c))
        yield fam
    names = sorted({k for c in clusters for k in c.get("stats", {})})
    for name in names:
        fam = CounterMetricFamily(f"{PREFIX}cluster_{name}",
                                  CLUSTER_COUNTER_HELP.get(name, f"lockmq cluster counter {name}"),
                                  labels=labels)
        for c in clusters:
            if name in c.get("stats", {}):
                fam.add_metric([c["name"], c["topic"]], c["stats"][name])
        yield fam


def _firmware_families(fw: dict[str, Any] | None) -> Iterator[Metric]:
    """``lockmq_firmware_locks{version}`` and ``lockmq_firmware_rollout_locks{version,
    state}`` (FirmwareBundles.gauges), every state of a version listed from 0."""
    if fw is None:
        return
    fam = GaugeMetricFamily(PREFIX + "firmware_locks", "Online locks by the firmware "
                            "version they run", labels=["version"])
    for version, n in sorted(fw["running"].items()):
        fam.add_metric([version], n)
    yield fam
    fam = GaugeMetricFamily(PREFIX + "firmware_rollout_locks", "Online locks by the version "
                            "of their last update and its state (fetch, staged, trial, "
                            "updated, failed; running: no update recorded)",
                            labels=["version", "state"])
    versions = sorted({v for v, _ in fw["updates"]})
    for version in versions:
        for state in UPDATE_STATES:
            fam.add_metric([version, state], fw["updates"].get((version, state), 0))
    yield fam


def _guard_families(status: dict[str, Any]) -> Iterator[Metric]:
    """The security guard's counters (``security_<event>_total`` with an optional
    ``reason``) and gauges, one family per name."""
    by_name: dict[str, list[tuple[str, float]]] = {}
    for key, value in status.items():
        m = _GUARD_KEY.match(key)
        if m is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        by_name.setdefault(m["name"], []).append((m["reason"] or "", value))
    for name, samples in sorted(by_name.items()):
        labelled = any(reason for reason, _ in samples)
        labels = ["reason"] if labelled else []
        if name.endswith("_total"):
            fam: Metric = CounterMetricFamily(
                PREFIX + name, f"Security events {name[len('security_'):-len('_total')]}"
                " by reason (lockmq.security)", labels=labels)
        else:
            fam = GaugeMetricFamily(PREFIX + name, f"Security gauge {name}", labels=labels)
        for reason, value in samples:
            fam.add_metric([reason] if labelled else [], value)
        yield fam


def disk_free_bytes(path: str) -> float:
    """Free bytes on the file system holding ``path`` (0 if it cannot be read)."""
    try:
        return float(shutil.disk_usage(path).free)
    except OSError:
        return 0.0


class MetricsEndpoint:
    """A registry of its own holding one :class:`BrokerCollector` and
    prometheus_client's process, platform and GC collectors (``process_*``,
    ``python_info``, ``python_gc_*``: the process the broker runs in)."""

    def __init__(self, views: Callable[[], tuple[dict[str, Any], list[dict[str, Any]],
                                                 dict[str, tuple[str, float]]]],
                 latency: Latencies | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(views, latency))
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)

    def render(self, accept: str = "") -> tuple[str, bytes]:
        """(content type, body) of a scrape now, in the format the scraper's
        ``Accept`` header asks for (Prometheus text 0.0.4 unless it asks for
        OpenMetrics), as prometheus_client negotiates it."""
        encode, content_type = choose_encoder(accept)
        return content_type, encode(self.registry)
