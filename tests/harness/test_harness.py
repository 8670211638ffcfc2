"""lockmq.testing itself: it imports without pytest or the test suite, its peer logs in
through the protocol's session, its broker process restarts on the same port, and
``scripts/repeat`` (behind ``scripts/test --repeat N``) stops at the first failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lockmq.protocol import ErrorCode, Role
from lockmq.testing import BrokerProcess, BrokerThread, Peer, open_peer, refusal

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
