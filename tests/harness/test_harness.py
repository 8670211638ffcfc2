"""lockmq.testing itself: it imports without pytest or the test suite, its peer logs in
through the protocol's session, its broker process restarts on the same port, and
``scripts/repeat`` (behind ``scripts/test --repeat N``) stops at the first failure."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from lockmq.protocol import Connect, ErrorCode, FrameDecoder, Op, Role, encode_frame
from lockmq.security import Permissions
from lockmq.testing import (BrokerProcess, BrokerThread, Peer, Refused, SecureBroker,
                            open_async_peer, open_peer, raises, refusal, wait_for_async)
from lockmq.testing.fuzz import decode_stream

REPEAT = Path(__file__).resolve().parents[2] / "scripts" / "repeat"


def test_the_harness_imports_without_pytest_and_without_the_test_suite():
    code = ("import sys\n"
            "sys.modules['pytest'] = None   # any import of pytest fails\n"
            "import lockmq.testing, lockmq.testing.lock, lockmq.testing.micropython\n"
            "bad = sorted(m for m in sys.modules if m == 'tests' or m.startswith('tests.'))\n"
            "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr


def test_peer_logs_in_through_the_session_and_is_refused_with_a_code(tmp_path):
    with BrokerThread(str(tmp_path / "open")) as broker:
        with open_peer(broker.port, "LOCK-H1", Role.LOCK) as lock:
            assert lock.connect_ack is not None and lock.sent_auth
            assert lock.publish("t", 1).status == 0
    with BrokerThread(str(tmp_path / "closed"), auth="required") as broker:
        with Peer(broker.port, "") as svc:
            assert refusal(lambda: svc.auth_token("no-such-token")).code == ErrorCode.AUTH_FAILED


def test_broker_process_restarts_on_its_port_with_its_data(tmp_path):
    broker = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off"}})
    try:
        port = broker.port
        with open_peer(port, "LOCK-H2", Role.LOCK) as lock:
            lock.publish("t", 1)
        broker.restart(crash=True)
        assert broker.port == port and broker.starts == 2
        with open_peer(port) as svc:
            topics = {t["topic"]: t["queue_end"] for t in svc.admin("topics")["topics"]}
        assert topics["t"] == 1
    finally:
        assert broker.stop() == 0


def test_a_broker_that_dies_at_start_is_reported_with_its_last_words(tmp_path):
    """start() fails with the broker's own refusal in the message: the log is read to
    its end before giving up, not only until the process is seen gone."""
    broker = BrokerProcess(tmp_path / "data", {"security": {"no_such_key": 1}}, start=False)
    try:
        broker.start()
    except AssertionError as exc:
        assert "no_such_key" in str(exc)
        assert not broker.running()
    else:
        raise AssertionError("a broker with an unknown [security] key started")


def test_secure_broker_serves_its_locks_and_tokens_over_plain_and_tls(tmp_path):
    from lockmq.security.tls import client_context
    env = SecureBroker(tmp_path, tls=True, locks=["LOCK-H3"], tokens={"ops": Permissions(admin=True)})
    try:
        key, token = env.keys["LOCK-H3"], env.tok["ops"]
        broker = env.start()
        assert broker.rss_kib() > 0
        with Peer(broker.port, "LOCK-H3") as lock:
            lock.auth_lock(key)
            assert lock.publish("lock.events", 1) is not None
        tls = client_context(cadata=open(env.certs.ca_der, "rb").read())
        with Peer(env.tls_port, "", tls=tls, server_hostname="gw.local") as svc:
            svc.auth_token(token)
            assert svc.admin("topics")["topics"]
        with Peer(broker.port, "") as svc:          # auth is required: junk is refused
            assert refusal(lambda: svc.auth_token("nope")).code == ErrorCode.AUTH_FAILED
    finally:
        env.close()


def test_async_peer_logs_in_publishes_and_sees_a_refusal(tmp_path):
    async def main(port: int) -> None:
        lock = await open_async_peer(port, "LOCK-H4", Role.LOCK)
        assert (await lock.publish("t", 1)).status == 0
        assert (await lock.publish("t", 1)).status != 0          # a retransmit: duplicate
        await lock.close()

    with BrokerThread(str(tmp_path / "open")) as broker:
        asyncio.run(main(broker.port))
    with BrokerThread(str(tmp_path / "closed"), auth="required") as broker:
        async def refused() -> Refused:
            try:
                await open_async_peer(broker.port)
            except Refused as exc:
                return exc
            raise AssertionError("an unknown token logged in")
        assert asyncio.run(refused()).code == ErrorCode.AUTH_FAILED


def test_wait_for_async_fails_naming_what_it_waited_for():
    err = raises(AssertionError, lambda: asyncio.run(
        wait_for_async(lambda: False, "the moon", timeout=0.05)))
    assert "the moon" in str(err)


def test_decode_stream_skips_garbage_and_stops_at_a_fatal_error():
    good = encode_frame(Op.CONNECT, "S1", Connect(Role.LOCK, 30, "t").encode(), 1)
    stream = good + good + b"\x01\x7f\xff\xff\xff" + good     # a frame claiming 2 GiB
    frames = list(decode_stream(FrameDecoder(4096), stream, 7))
    assert [f.opaque for f, _ in frames] == [1, 1]
    assert all(isinstance(body, Connect) for _, body in frames)


def _repeat(tmp_path: Path, n: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPEAT), n, "bash", "-c", script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_repeat_runs_n_times_and_stops_at_the_first_failure(tmp_path):
    ok = _repeat(tmp_path, "3", "echo run >> runs")
    assert ok.returncode == 0
    assert (tmp_path / "runs").read_text().count("run") == 3
    assert ok.stderr.count(" s\n") >= 3 and "3 runs in a row passed" in ok.stderr
    # the second run fails with status 7: no third run, its status is the result
    bad = _repeat(tmp_path, "5", "echo x >> n; [ $(wc -l < n) -lt 2 ] || exit 7")
    assert bad.returncode == 7
    assert (tmp_path / "n").read_text().count("x") == 2
    assert "stopped at the first failing run (2 of 5)" in bad.stderr
    assert _repeat(tmp_path, "zero", "true").returncode == 2
