"""``/metrics`` of a real broker, read the way Prometheus reads it.

Every family has ``# HELP`` and ``# TYPE``, counters end in ``_total``, no series
appears twice, and a cluster's backlog stays visible after a restart when none of
its members is connected (issue 12: "lag alerts go blind after a restart").
"""

from __future__ import annotations

import urllib.request
from collections import Counter

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from lockmq.broker.metrics import BrokerCollector
from lockmq.protocol import Role

from lockmq.testing import Peer, open_peer


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, parsed by prometheus_client's own parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def produce(port: int, topic: str, n: int, sn: str = "LOCK-1") -> Peer:
    p = open_peer(port, sn=sn, role=Role.LOCK)
    for seq in range(n):
        p.publish(topic, seq)
    return p


def consume(port: int, topic: str, cluster: str, n: int) -> Peer:
    """Join ``cluster`` and ack its first ``n`` messages."""
    c = open_peer(port)
    sub = c.subscribe(topic, cluster).sub_id
    got = c.pull(sub, n).messages
    assert len(got) == n
    c.ack(sub, [m.lease for m in got])
    return c


def test_every_family_has_help_and_type_and_every_series_appears_once(broker):
    url = broker.status_page()
    lock = produce(broker.port, "ev", 5)   # stays connected: one lock online
    member = consume(broker.port, "ev", "backend", 2)
    text = scrape(url)

    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    series = Counter(ln.rpartition(" ")[0] for ln in lines)
    assert [s for s, n in series.items() if n > 1] == []
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    assert text.count("# HELP ") == text.count("# TYPE ") == len(families)
    for fam in families:
        assert fam.documentation, fam.name
        # (issue 35: latency histograms, and prometheus_client's process_*, python_*
        # collectors beside the broker's own lockmq_* families)
        assert fam.type in ("counter", "gauge", "histogram"), fam.name
        if fam.type == "counter":
            assert all(s.name.endswith("_total") for s in fam.samples), fam.name
        assert fam.name.startswith(("lockmq_", "process_", "python_")), fam.name
    assert m_has_histograms(text)

    m = samples(text)
    assert m["lockmq_publish_stored_total"] == 5
    assert m["lockmq_acks_total"] == 2
    assert m["lockmq_devices_online"] == 1 and lock is not None
    assert m["lockmq_auth_required"] == 0
    assert m['lockmq_cluster_backlog{cluster="backend",topic="ev"}'] == 3
    assert m['lockmq_cluster_members{cluster="backend",topic="ev"}'] == 1
    assert member is not None   # kept connected until here
    assert m['lockmq_cluster_acked_total{cluster="backend",topic="ev"}'] == 2
    assert m["lockmq_store_log_bytes"] > 0 and m["lockmq_store_disk_free_bytes"] > 0
    # counters that have not counted yet are there at 0: increase() sees their first event
    for never in ("clusters_expired", "retention_skipped", "frame_mac_refused",
                  "commands_refused_cap"):
        assert m[f"lockmq_{never}_total"] == 0, never
    assert m["lockmq_store_skipped_records_total"] == 0


def m_has_histograms(text: str) -> bool:
    """The three latency histograms, with the publishes and deliveries above counted."""
    m = samples(text)
    return (m["lockmq_publish_ack_seconds_count"] == 5
            and m['lockmq_publish_ack_seconds_bucket{le="+Inf"}'] == 5
            and m["lockmq_publish_deliver_seconds_count"] == 2
            and "lockmq_command_round_trip_seconds_count" in m)


def test_a_cluster_without_members_keeps_its_backlog_after_a_restart(make_broker, tmp_path):
    data = str(tmp_path / "data")
    first = make_broker(data_dir=data)
    produce(first.port, "ev", 60)
    consume(first.port, "ev", "backend", 6).close()
    first.stop()                        # positions saved on the way down

    second = make_broker(data_dir=data)   # nobody has joined "backend" since
    url = second.status_page()
    m = samples(scrape(url))
    lab = '{cluster="backend",topic="ev"}'
    assert m["lockmq_cluster_backlog" + lab] == 54
    assert m["lockmq_cluster_live" + lab] == 0
    assert m["lockmq_cluster_members" + lab] == 0
    admin = open_peer(second.port).admin("clusters", cluster="backend")["clusters"]
    assert [c["backlog"] for c in admin] == [54]
    with urllib.request.urlopen(url + "/summary", timeout=10) as r:
        row = [ln for ln in r.read().decode().splitlines() if ln.startswith("backend ")]
    assert len(row) == 1 and row[0].split()[-2:] == ["0", "offline"]


def test_two_brokers_in_one_process_keep_their_own_registries(make_broker, tmp_path):
    a = make_broker(data_dir=str(tmp_path / "a"))
    b = make_broker(data_dir=str(tmp_path / "b"))
    url_a, url_b = a.status_page(), b.status_page()
    produce(a.port, "ev", 3)
    produce(b.port, "ev", 7)
    assert samples(scrape(url_a))["lockmq_publish_stored_total"] == 3
    assert samples(scrape(url_b))["lockmq_publish_stored_total"] == 7
    # nothing registered in the process-wide default registry
    assert b"lockmq_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)


def test_security_counters_become_one_family_per_event_with_a_reason_label():
    status = {'security_auth_failed_total{reason="bad_proof"}': 2,
              'security_auth_failed_total{reason="unknown_sn"}': 1,
              "security_auth_ok_total": 4,
              "security_connections_open": 3}
    stats = {"broker": {"uptime_s": 1.0}, "connections": 0, "max_connections": 1,
             "devices_online": 0, "log_bytes": 0, "auth": "required", "security": status}
    fams = {f.name: f for f in BrokerCollector(lambda: (stats, [], {})).collect()}
    failed = fams["lockmq_security_auth_failed"]
    assert failed.type == "counter"
    assert sorted((s.name, s.labels["reason"], s.value) for s in failed.samples) == [
        ("lockmq_security_auth_failed_total", "bad_proof", 2),
        ("lockmq_security_auth_failed_total", "unknown_sn", 1)]
    assert [(s.name, s.labels) for s in fams["lockmq_security_auth_ok"].samples] == [
        ("lockmq_security_auth_ok_total", {})]
    assert fams["lockmq_security_connections_open"].type == "gauge"
    assert fams["lockmq_auth_required"].samples[0].value == 1


def test_openmetrics_when_the_scraper_asks_for_it(broker):
    url = broker.status_page()
    lock = produce(broker.port, "ev", 2)
    req = urllib.request.Request(url + "/metrics", headers={
        "Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        text = r.read().decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE lockmq_publish_stored counter" in text
    assert "\nlockmq_publish_stored_total 2.0\n" in text and lock is not None
