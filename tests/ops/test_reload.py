"""SIGHUP reloads the broker without dropping a lock (docs/operators.md, "Reload").

100 simulated locks on TLS stay connected through three reloads: limits and a
setting that needs a restart, a bad file (refused, the old configuration keeps
running), and a renewed server certificate (new handshakes get it).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import threading
import time

import pytest

from lockmq.client.session import Endpoint
from lockmq.sim import SimConfig, SimStats, run_sim
from lockmq.testing.secure import SecureBroker
from lockmq.testing.tables import merge_tables, to_toml

LOCKS = 100
SNS = [f"RLD-{i:06d}" for i in range(1, LOCKS + 1)]


def _server_cert_der(port: int, ca_pem: str) -> bytes:
    ctx = ssl.create_default_context(cafile=ca_pem)
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw) as tls:
            return tls.getpeercert(binary_form=True)


class FleetThread:
    """The simulated locks on their own event loop thread, as a separate fleet."""

    def __init__(self, cfg: SimConfig, endpoint: Endpoint) -> None:
        self.stats = SimStats(keep_latencies=False)
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)

            async def go() -> None:
                self.stop_event = asyncio.Event()
                ready.set()
                await run_sim(cfg, endpoint, stop=self.stop_event, stats=self.stats)

            self.loop.run_until_complete(go())

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        ready.wait(10)

    def stop(self) -> None:
        if self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def env(tmp_path):
    e = SecureBroker(tmp_path, {"devices": {"heartbeat_s": 5.0, "evict_after_s": 60.0}},
                     tls=True, locks=SNS)
    try:
        yield e
    finally:
        e.close()


def test_hundred_locks_stay_connected_through_three_reloads(env):
    broker = env.start()
    ctx = ssl.create_default_context(cafile=env.certs.ca_pem)
    ctx.check_hostname = False
    cfg = SimConfig(locks=LOCKS, sn_prefix="RLD-", keys=env.keys, events_per_lock=None,
                    rate_per_lock=2.0, stay_connected=True, ack_timeout_s=10.0)
    fleet = FleetThread(cfg, Endpoint("127.0.0.1", broker.tls_port, ssl=ctx))
    try:
        _wait(lambda: fleet.stats.connected >= LOCKS and fleet.stats.acked >= LOCKS,
              "100 locks connected and publishing")
        old_cert = _server_cert_der(broker.tls_port, env.certs.ca_pem)

        def reload(tables) -> str:
            """Write the new file, SIGHUP, return the broker's answer line."""
            with open(broker.config_path, "w") as fh:
                fh.write(to_toml(tables))
            mark = broker.mark()
            broker.proc.send_signal(signal.SIGHUP)
            return broker.wait_log(r"event=config_reload(ed|_refused)", start=mark)

        # 1. limits change live; the listen address needs a restart and is named so
        live = merge_tables(broker.tables, {"commands": {"max_pending_per_lock": 8},
                                            "consumers": {"max_retries": 3},
                                            "broker": {"log_level": "DEBUG",
                                                       "host": "0.0.0.0"}})
        line = reload(live)
        assert "event=config_reloaded" in line, line
        assert "commands.max_pending_per_lock" in line and "consumers.max_retries" in line
        assert "needs_restart=broker.host" in line, line
        acked = fleet.stats.acked
        _wait(lambda: fleet.stats.acked > acked, "records acked after reload 1")

        # 2. a bad file is refused with one line; the broker runs on as it was
        line = reload(merge_tables(live, {"broker": {"bogus": 1}}))
        assert "event=config_reload_refused" in line and "broker.bogus" in line, line
        assert broker.running()
        acked = fleet.stats.acked
        _wait(lambda: fleet.stats.acked > acked, "records acked after the refused reload")

        # 3. a renewed server certificate: new handshakes get it, old sessions stay
        from lockmq.security.certs import renew_server
        renew_server(str(env.root / "certs"))
        line = reload(live)
        assert "event=config_reloaded" in line, line
        new_cert = _server_cert_der(broker.tls_port, env.certs.ca_pem)
        assert new_cert != old_cert
        acked = fleet.stats.acked
        _wait(lambda: fleet.stats.acked > acked, "records acked after reload 3")

        assert broker.metrics()["lockmq_devices_online"] == LOCKS
        assert fleet.stats.reconnects == 0 and fleet.stats.connect_failures == 0
        assert not [ln for ln in broker.lines if "event=device_offline" in ln
                    or "event=device_evicted" in ln]
    finally:
        fleet.stop()
    assert fleet.stats.errors == 0


def test_live_settings_reach_the_parts_that_use_them(tmp_path):
    """What a reload applies is what the running parts read (an in-process broker,
    so the test can look inside)."""
    from lockmq.testing import BrokerThread

    b = BrokerThread(str(tmp_path / "data")).start()
    try:
        cfg = b.config()
        cfg.consumers.max_retries = 2
        cfg.consumers.retry_levels_s = [0.5, 1.0]
        cfg.devices.heartbeat_record_gap_s = 7.0
        cfg.broker.log_level = "ERROR"
        cfg.broker.max_connections = 10
        cfg.store["retention_ms"] = 1000
        assert b.call(lambda: b.broker.reload(lambda: cfg))
        core = b.broker.core
        assert (core.settings.max_retries, core.settings.retry_levels_s) == (2, [0.5, 1.0])
        assert b.broker.devices.record_gap_s == 7.0
        assert b.broker.log.level == 40
        assert b.broker.connections.limit == 10
        assert b.broker.config.store.get("retention_ms") != 1000   # needs a restart
    finally:
        b.stop()
