"""Monitoring plugs in as is: ``promtool`` accepts the broker's live ``/metrics`` and
the shipped rules, and every series the rules and the Grafana dashboard name is one
the broker exports (after a publish, a delivery, a command and a refused login)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from lockmq.client import Consumer, Producer
from lockmq.client.errors import AuthError
from lockmq.client.session import Credentials, Endpoint, open_session
from lockmq.protocol import CommandKind, Role
from lockmq.security import Permissions
from lockmq.sim import SimConfig, SimStats, run_sim
from lockmq.testing.secure import SecureBroker

DIST = Path(__file__).resolve().parents[2] / "dist"
RULES = DIST / "prometheus" / "lockmq.rules.yml"
DASHBOARD = DIST / "grafana" / "lockmq-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(Debian: apt-get install prometheus)")
SN = "MON-000001"
#: series a PromQL expression may name that are not the broker's: Prometheus' own
NOT_OURS = {"up"}


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _names_in(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers followed by ``{``, ``[``, a
    space, a ``)`` or the end, that look like ours or prometheus_client's)."""
    names = set(re.findall(r"\b((?:lockmq|process|python)_[a-z0-9_]+|up)\b", expr))
    return names - NOT_OURS


@pytest.fixture(scope="module")
def live_metrics(tmp_path_factory):
    """A broker with auth on, after real traffic of every kind; its /metrics text."""
    env = SecureBroker(tmp_path_factory.mktemp("monitoring"), locks=[SN],
                       tokens={"ops": Permissions(admin=True)})
    broker = env.start()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()
    stats = SimStats()

    def fleet() -> None:
        nonlocal stop
        asyncio.set_event_loop(loop)

        async def go() -> None:
            nonlocal stop
            stop = asyncio.Event()
            await run_sim(SimConfig(locks=1, sn_prefix="MON-", keys=env.keys, events_per_lock=5,
                                    rate_per_lock=0, stay_connected=True),
                          Endpoint("127.0.0.1", broker.port), stop=stop, stats=stats)

        loop.run_until_complete(go())

    t = threading.Thread(target=fleet, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while stats.acked < 5:
            assert time.monotonic() < deadline, "the lock did not publish"
            time.sleep(0.05)
        token = env.tok["ops"]
        with Producer(broker.address, token=token, producer_id="mon-svc") as p:
            p.send_sync("orders", b"o1")
            out = p.command(SN, CommandKind.UNLOCK, b"\x00\x03", expires_in_s=10)
            assert out is not None
        got = threading.Event()
        c = Consumer(broker.address, topic="lock.events", cluster="mon", token=token,
                     handler=lambda m: got.set(), backlog_poll_s=0)
        c.start()
        assert got.wait(30)
        c.stop()

        async def bad_login() -> None:
            with pytest.raises(AuthError):
                await open_session(Endpoint("127.0.0.1", broker.port), SN, Role.LOCK,
                                   Credentials.device(b"\x00" * 32))

        asyncio.run(bad_login())
        yield _scrape(broker.status_port)
    finally:
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        t.join(30)
        env.close()


@needs_promtool
def test_promtool_accepts_the_live_metrics(live_metrics):
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=live_metrics, text=True,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_accepts_the_rules_file():
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], text=True,
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_the_live_metrics_have_histograms_process_and_build_info(live_metrics):
    assert re.search(r'^lockmq_build_info\{.*version="', live_metrics, re.M)
    for name in ("publish_ack", "publish_deliver", "command_round_trip"):
        count = re.search(rf"^lockmq_{name}_seconds_count (\S+)$", live_metrics, re.M)
        assert count and float(count.group(1)) >= 1, name
        assert f'lockmq_{name}_seconds_bucket{{le="+Inf"}}' in live_metrics
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                 "process_open_fds", "python_info", "lockmq_uptime_seconds"):
        assert re.search(rf"^{name}[ {{]", live_metrics, re.M), name
    assert "_ms_total" not in live_metrics and "lockmq_uptime_s " not in live_metrics


def test_every_series_the_rules_and_the_dashboard_name_is_exported(live_metrics):
    exported = set()
    for line in live_metrics.splitlines():
        if line and not line.startswith("#"):
            exported.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    rules_exprs = re.findall(r"^\s*expr: (.+)$", RULES.read_text(), re.M)
    dashboard = json.loads(DASHBOARD.read_text())
    dash_exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    dash_exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert rules_exprs and dash_exprs
    missing = {name for expr in rules_exprs + dash_exprs for name in _names_in(expr)
               if name not in exported}
    assert not missing, missing
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "lockmq-broker"
