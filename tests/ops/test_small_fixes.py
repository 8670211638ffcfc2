"""The smaller operator findings of issue 35, each as it was seen (real commands,
a real broker process where one is involved)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time

import pytest

from lockmq.client import AsyncProducer, Consumer, Producer
from lockmq.client.errors import ConnectionLost
from lockmq.client.session import Endpoint
from lockmq.testing.ports import free_port
from lockmq.testing.process import LOCKMQ_COMMAND


def lockmq(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCKMQ_COMMAND, *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_output_into_a_closed_pipe_ends_quietly():
    """`lockmq ... | head`: the reader goes away; no BrokenPipe traceback."""
    proc = subprocess.Popen([*LOCKMQ_COMMAND, "broker", "--print-config"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()           # gone before the command writes a byte
    err = proc.stderr.read().decode()
    proc.wait(60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert proc.returncode == 141


def test_sim_help_offers_one_broker_and_an_empty_keys_dir_is_refused(tmp_path):
    help_text = lockmq("sim", "--help").stdout
    assert "primary,standby" not in help_text and "HOST:PORT[," not in help_text
    r = lockmq("sim", "--keys", str(tmp_path), "--broker", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2 and "no device keys there" in r.stderr, r.stderr
    (tmp_path / "other.json").write_text(json.dumps({"OTHER-1": "00" * 32}))
    r = lockmq("sim", "--keys", str(tmp_path), "--broker", f"127.0.0.1:{free_port()}",
               "--locks", "1", "--connect-retry", "0", "--duration", "1")
    assert "1 of 1 SNs have no key" in r.stderr and "OTHER-1" in r.stderr, r.stderr


def test_a_bad_cluster_name_is_named_as_such():
    with pytest.raises(ValueError, match="bad cluster name 'bad name!'"):
        Consumer("127.0.0.1:1", topic="t", cluster="bad name!", handler=print)
    assert not [t for t in threading.enumerate() if t.name == "lockmq-consumer"]


def test_connect_retry_keeps_trying_for_the_whole_time():
    """connect_retry_s=1.5 gave up after 0.75 s: the next backoff step would have
    passed the deadline. Now the last wait is cut to it (a lower bound, no timing of
    speed)."""
    port = free_port()

    async def main() -> float:
        p = AsyncProducer(Endpoint("127.0.0.1", port, connect_retry_s=1.5))
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost):
            await p.connect()
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 1.5


def test_consume_count_handles_exactly_that_many(broker_process):
    with Producer(broker_process.address, producer_id="count-test") as p:
        for i in range(40):
            p.send_sync("counted", b"m%d" % i)
    for _ in range(2):
        r = lockmq("consume", "--broker", broker_process.address, "counted", "--cluster",
                   "cnt", "-n", "3", "--max-workers", "8", "--format", "none")
        assert r.returncode == 0, r.stderr
        assert "handled 3 in" in r.stderr, r.stderr
    # nothing lost: the two runs took 6, the rest (given back ones too) are still there
    got = []
    done = threading.Event()

    def handle(msg) -> None:
        got.append(msg.payload)
        if len(set(got)) >= 34:
            done.set()

    c = Consumer(broker_process.address, topic="counted", cluster="cnt", handler=handle,
                 backlog_poll_s=0)
    c.start()
    assert done.wait(60), len(set(got))
    c.stop()


def test_clusters_reset_shift_by_and_dry_run_and_topics_lists_offline_clusters(broker_process):
    b = broker_process
    with Producer(b.address, producer_id="shift-test") as p:
        for i in range(10):
            p.send_sync("shifted", b"m%d" % i)
    r = lockmq("consume", "--broker", b.address, "shifted", "--cluster", "sh", "-n", "4",
               "--format", "none")
    assert r.returncode == 0, r.stderr

    def reset(*extra: str) -> str:
        out = lockmq("clusters", "--broker", b.address, "reset", "sh", *extra)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "position 4 -> 2 (dry run: nothing changed)" in reset("--shift-by", "-2", "--dry-run")
    assert "position 4 -> 2\n" in reset("--shift-by", "-2")
    assert "position 2 -> 10" in reset("--shift-by", "100")   # clamped to the end
    b.stop()
    b.start()   # the cluster is known from disk only now: no member since the start
    topics = lockmq("topics", "--broker", b.address)
    assert topics.returncode == 0, topics.stderr
    row = next(ln for ln in topics.stdout.splitlines() if ln.startswith("shifted"))
    assert row.split()[-1] == "sh", topics.stdout


def test_offline_lists_the_locks_gone_with_when_and_why(broker_process):
    b = broker_process
    r = lockmq("sim", "--broker", b.address, "--locks", "3", "--events", "1", "--rate", "0",
               "-q", "--sn-prefix", "GONE-")
    assert r.returncode == 0, r.stderr
    out = lockmq("offline", "--broker", b.address)
    assert out.returncode == 0, out.stderr
    rows = [ln.split() for ln in out.stdout.splitlines()[1:]]
    assert sorted(row[0] for row in rows) == ["GONE-000001", "GONE-000002", "GONE-000003"]
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", row[1]) and row[-1]
               for row in rows), out.stdout
    data = json.loads(lockmq("offline", "--broker", b.address, "--json").stdout)
    assert data["count"] == 3 and all(d["reason"] for d in data["devices"])


def test_a_gateway_that_stops_cleanly_leaves_the_registry_at_once(tmp_path):
    from tests.campus.helpers import RegistryProcess, gateway, names

    reg = RegistryProcess(tmp_path / "reg", flags=["--evict-after", "600"])
    with reg:
        gw = gateway(tmp_path / "gw" / "data", reg.address, "gw-leaving")
        deadline = time.monotonic() + 30
        while names(reg.address) != ["gw-leaving"]:
            assert time.monotonic() < deadline, "not registered"
            time.sleep(0.05)
        gw.stop()
        assert any("registry_deregistered" in ln for ln in gw.lines), gw.log_tail()
        # gone now, not after the registry's 600 s eviction
        assert names(reg.address) == []
        reg.wait_log(r"gateway_deregistered")
