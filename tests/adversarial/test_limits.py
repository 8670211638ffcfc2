"""Hardening issue 10, items 7, 8, 9, 14 and 15: rate limits that a flood cannot turn
against the real lock, heartbeats inside the per-lock rate, one auth switch, a
bounded status page, owner-only files.

Each test attacks a real ``lockmq broker`` process over real TCP on 127.0.0.x (the
real MicroPython firmware plays the lock where one is involved), checks that the
attack is refused with its error, that it shows in the broker's log and on
``/metrics``, and that the legitimate path still works.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from lockmq.protocol import ErrorCode, Heartbeat, Op, Role, decode_body, encode_frame
from lockmq.security import DeviceRegistry, SecurityConfig
from lockmq.testing import (LOCKMQ_COMMAND, BrokerProcess, Lock, Peer, Refused,
                            read_until_closed, refusal, require_micropython, wait_for)
from lockmq.testing.lock import build_flash

pytestmark = pytest.mark.timeout(240)


# -- helpers (module-local: no conftest in tests/adversarial) -----------------------------

def _http(port: int, path: str, token: str = "") -> bytes:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(req, timeout=15) as r:
        return r.read()


def _view(broker: BrokerProcess, path: str) -> bytes:
    """A status-page view that names locks or topics: it needs an admin token."""
    from lockmq.security import Permissions, TokenStore
    store = TokenStore(SecurityConfig(data_dir=broker.data_dir).registry_path)
    try:
        token = store.create("status-reader", Permissions(admin=True), ttl_s=600)[0]
    finally:
        store.close()
    return _http(broker.status_port, path, token)


def _topic_end(broker: BrokerProcess, topic: str) -> int:
    for t in json.loads(_view(broker, "/topics"))["topics"]:
        if t["topic"] == topic:
            return t["queue_end"]
    return 0


def _register(data: Path, *sns: str) -> dict[str, bytes]:
    reg = DeviceRegistry.open(SecurityConfig(data_dir=str(data)))
    try:
        # (registered without a frame-MAC policy: these locks speak by hand, without MACs)
        return reg.add_many(list(sns), mac=False)
    finally:
        reg.close()


@pytest.fixture
def brokers():
    """Start ``lockmq broker`` processes; all are stopped at the end (even if
    stopping one fails: no broker process outlives the test run)."""
    with ExitStack() as stack:
        def start(data: Path, tables: dict) -> BrokerProcess:
            data.mkdir(parents=True, exist_ok=True)
            return stack.enter_context(BrokerProcess(str(data), tables))

        yield start


@pytest.fixture
def locks():
    """Run firmware boards (the MicroPython unix port); all are killed at the end."""
    require_micropython()
    with ExitStack() as stack:
        def run(folder: Path) -> Lock:
            lk = Lock(folder)
            stack.callback(lk.close)
            return lk

        yield run


# -- item 7: a flood of wrong answers cannot lock the real lock out -------------------------

def test_wrong_key_flood_cannot_lock_out_the_real_lock(tmp_path, brokers, locks):
    data = tmp_path / "data"
    key = _register(data, "FW-7")["FW-7"]
    # No exempt addresses; one source = one IPv4 /24, so the attacker on 127.0.0.2 is
    # on the real lock's "NAT" (it connects from 127.0.0.1): the hardest case.
    broker = brokers(data, {
        "broker": {"handshake_timeout_s": 60.0},
        "security": {"limit_exempt_addresses": [], "ipv4_prefix": 24, "auth_fail_per_sn": 3,
                     "max_connections_per_address": 4}})
    mark = broker.mark()
    codes = []
    for _ in range(6):
        w = Peer(broker.port, "FW-7", source="127.0.0.2")
        try:
            err = refusal(lambda: w.auth_lock(os.urandom(32)))
            codes.append(err.code)
            if err.code == ErrorCode.RATE_LIMITED:
                assert err.err.retry_after_ms > 0
        finally:
            w.close()
    assert codes == [ErrorCode.AUTH_FAILED] * 3 + [ErrorCode.RATE_LIMITED] * 3
    line = broker.wait_log(r"security_auth_rate_limited reason=per_source_sn", start=mark)
    assert "sn=FW-7" in line and "source=127.0.0.0/24" in line

    # the penalty is on the failing source only: elsewhere a wrong key is a plain failure
    w = Peer(broker.port, "FW-7", source="127.0.1.9")
    try:
        assert refusal(lambda: w.auth_lock(os.urandom(32))).code == ErrorCode.AUTH_FAILED
    finally:
        w.close()
    # the right key gets in at once, even from the very address that is flooding ...
    w = Peer(broker.port, "FW-7", source="127.0.0.2")
    try:
        assert w.auth_lock(key).heartbeat_s > 0
    finally:
        w.close()
    # ... and the real firmware, on the same source, connects and its events flow
    lock = locks(build_flash(tmp_path / "board-FW-7", "FW-7", key,
                             [("127.0.0.1", broker.port)], cards=[]))
    lock.expect(rf"^I net connected broker=127.0.0.1:{broker.port} mac=1$", timeout=60)
    lock.send("event unlock 1")
    lock.expect(r"^I evt acked seq=1$", timeout=30)
    broker.wait_log(r"security_auth_ok reason=lock name=FW-7 addr=127.0.0.1", start=mark)

    m = broker.metrics()
    assert m['lockmq_security_auth_rate_limited_total{reason="per_source_sn"}'] == 3
    assert m['lockmq_security_auth_failed_total{reason="bad_proof"}'] == 4

    # One prefix policy: the connection cap counts the same /24 as the failure counter.
    wait_for(lambda: broker.metrics()["lockmq_security_connections_open"] == 1,
          "only the firmware's connection open")
    held = []
    try:
        for last in (3, 4, 5):              # 1 (the lock) + 3 = max_connections_per_address
            h = Peer(broker.port, "X", source=f"127.0.0.{last}")
            held.append(h)
            h.hello(Role.LOCK)                # admitted: CHALLENGE
        extra = Peer(broker.port, "X", source="127.0.0.6")
        held.append(extra)
        err = refusal(lambda: extra.hello(Role.LOCK))
        assert err.code == ErrorCode.TOO_MANY_CONNECTIONS
        other = Peer(broker.port, "X", source="127.0.1.6")  # another /24: its own budget
        held.append(other)
        other.hello(Role.LOCK)
        broker.wait_log(r"security_connection_refused reason=max_connections_per_address "
                        r"addr=127.0.0.6", start=mark)
        assert broker.metrics()[
            'lockmq_security_connection_refused_total{reason="max_connections_per_address"}'] == 1
    finally:
        for h in held:
            h.close()
    # the lock never lost its link
    lock.send("event unlock 1")
    lock.expect(r"^I evt acked seq=2$", timeout=30)
    assert not lock.grep(r"^W net down|auth failed")
    assert len(lock.grep(r"^I net connected")) == 1        # one connection, never dropped
    assert [d["sn"] for d in json.loads(_view(broker, "/devices"))["devices"]] \
        == ["FW-7"]


# -- item 8: heartbeats count inside the per-lock rate; one record per interval -----------------

def test_heartbeat_flood_is_rate_limited_and_stored_once(tmp_path, brokers):
    data = tmp_path / "data"
    key = _register(data, "LOCK-8")["LOCK-8"]
    broker = brokers(data, {"security": {"lock_message_rate": 20.0, "lock_message_burst": 50}})
    mark = broker.mark()
    gap = 30.0                               # [devices] heartbeat_s: the default record gap
    w = Peer(broker.port, "LOCK-8")
    try:
        w.auth_lock(key)
        n = 2000
        body = Heartbeat(int(time.time() * 1000), 60, 0, 0, 90, 50_000).encode()
        t0 = time.monotonic()
        w.sock.sendall(b"".join(encode_frame(Op.HEARTBEAT, "LOCK-8", body, i)
                                for i in range(1, n + 1)))
        answered = limited = 0
        while answered + limited < n:
            f = w.read()
            assert f is not None, "the broker closed the flooding lock's connection"
            if f.opcode == Op.HEARTBEAT:
                answered += 1
            else:
                assert f.opcode == Op.ERROR
                err = decode_body(f.opcode, f.body)
                assert err.code == ErrorCode.RATE_LIMITED and err.retry_after_ms > 0
                limited += 1
        t1 = time.monotonic()
        assert limited > 0 and answered >= 1
        # the connection stayed, and the lock's events flow again once its budget refills
        acked = None
        deadline = time.monotonic() + 60
        while acked is None:
            try:
                acked = w.publish("lock.events", 1)
            except Refused as exc:
                assert exc.code == ErrorCode.RATE_LIMITED, exc
                assert time.monotonic() < deadline, "events never flowed again"
                time.sleep(exc.err.retry_after_ms / 1000)
    finally:
        w.close()
    # at most one $heartbeats record per lock per gap, whatever it sent (the broker's
    # monotonic clock is this machine's: the flood spans these slots)
    slots = int(t1 // gap) - int(t0 // gap) + 1
    stored = wait_for(lambda: (lambda m: m["lockmq_heartbeat_records_total"] == _topic_end(
        broker, "$heartbeats") and m["lockmq_heartbeat_records_total"])(broker.metrics()),
        "the heartbeat records to be stored")
    assert 1 <= stored <= slots
    assert _topic_end(broker, "lock.events") == 1
    m = broker.metrics()
    assert m["lockmq_heartbeats_refused_total"] == limited
    assert m["lockmq_heartbeat_records_skipped_total"] == answered - stored
    assert m['lockmq_security_rate_limited_total{reason="lock_message_rate"}'] >= limited
    broker.wait_log(r"security_rate_limited reason=lock_message_rate name=LOCK-8 kind=lock "
                    r"frame=heartbeat", start=mark)


# -- item 9: one switch for auth, logged truthfully --------------------------------------------

@pytest.mark.parametrize("broker_lines,security_lines,named", [
    ('auth = "required"', "require_auth = false", "[security] require_auth"),
    ("auth = false", "", "[broker] auth"),
    ('auth = "disabled"', "", "[broker] auth"),
    ('auth = "OFF"', "", "[broker] auth"),
])
def test_auth_cannot_be_turned_off_silently(tmp_path, brokers, broker_lines, security_lines,
                                            named):
    data = tmp_path / "data"
    conf = tmp_path / "sneaky.toml"
    conf.write_text(f'[broker]\ndata_dir = "{data}"\nhost = "127.0.0.1"\nport = 0\n'
                    f"status_port = 0\n{broker_lines}\n[security]\n{security_lines}\n")
    out = subprocess.run([*LOCKMQ_COMMAND, "broker", "--config", str(conf)],
                         capture_output=True, text=True, timeout=120)
    # refused at start with a configuration error naming file, table and key
    assert out.returncode == 2, out.stderr
    assert str(conf) in out.stderr and named in out.stderr
    assert 'auth = "required"' in out.stderr and "broker_started" not in out.stderr
    assert not data.exists()                  # it never opened a store or a port

    # the legitimate configuration: authentication required, and the log says so
    key = _register(data, "LOCK-9")["LOCK-9"]
    broker = brokers(data, {"broker": {"auth": "required"}})
    assert "auth=required" in broker.wait_log(r"event=broker_started")
    assert broker.metrics()["lockmq_auth_required"] == 1
    w = Peer(broker.port, "svc")
    try:
        assert refusal(lambda: w.auth_token("lmq_0000000000000000_" + "x" * 43)).code \
            == ErrorCode.AUTH_FAILED
    finally:
        w.close()
    w = Peer(broker.port, "LOCK-9")
    try:
        w.auth_lock(key)
        assert w.publish("lock.events", 1) is not None
    finally:
        w.close()
    broker.wait_log(r"security_auth_failed reason=malformed_token|security_auth_failed "
                    r"reason=bad_token")
    # and "off", when it is asked for in the one place, is said loudly, not hidden
    off = brokers(tmp_path / "dev-data", {"broker": {"auth": "off"}})
    off.wait_log(r"level=warning event=auth_off")
    assert "auth=off" in off.wait_log(r"event=broker_started")
    assert off.metrics()["lockmq_auth_required"] == 0


# -- item 14: the status page has a whole-request deadline and a connection cap -------------------


def test_status_page_deadline_and_connection_cap(tmp_path, brokers):
    broker = brokers(tmp_path / "data", {"broker": {"status_request_timeout_s": 2.0,
                                                    "status_max_connections": 3}})
    sp = broker.status_port
    mark = broker.mark()
    # a slowloris: one header line every 0.3 s (each well inside any per-line timeout)
    s = socket.create_connection(("127.0.0.1", sp), timeout=15)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        got = b""
        end = time.monotonic() + 90        # a safety bound, not the deadline under test
        while time.monotonic() < end:
            try:
                s.sendall(b"X-Trickle: 1\r\n")
            except OSError:
                break
            s.settimeout(0.3)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        got += read_until_closed(s, 5.0) if got and not got.endswith(b"\n") else b""
    finally:
        s.close()
    assert got.startswith(b"HTTP/1.1 408 Request Timeout"), got[:200]
    broker.wait_log(r"event=status_timeout", start=mark)

    # the cap: three silent connections hold every slot; the next one gets 503 at once
    idle = [socket.create_connection(("127.0.0.1", sp), timeout=15) for _ in range(3)]
    try:
        def probe() -> bytes | None:
            with socket.create_connection(("127.0.0.1", sp), timeout=15) as p:
                p.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                r = read_until_closed(p, 15.0)
            return r if r.startswith(b"HTTP/1.1 503") else None
        busy = wait_for(probe, "a 503 while three silent connections hold the cap")
        assert b"Retry-After: 1" in busy
        for c in idle:                        # and the deadline closes the silent ones
            assert read_until_closed(c, 60.0).startswith(b"HTTP/1.1 408")
    finally:
        for c in idle:
            c.close()
    broker.wait_log(r"event=status_refused", start=mark)
    # the legitimate reader is served again, and the page counts what happened
    m = broker.metrics()
    assert m["lockmq_status_timeouts_total"] >= 4 and m["lockmq_status_refused_total"] >= 1
    assert json.loads(_view(broker, "/stats"))["auth"] == "required"


# -- item 15: owner-only files, also under umask 0 and for an old data dir ------------------------

def _modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    out["."] = stat.S_IMODE(root.stat().st_mode)
    return out


def _read_as_nobody(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["cat", str(path)], user="nobody", capture_output=True, timeout=30)


def test_files_are_owner_only_whatever_the_umask(brokers, locks):
    # a world-traversable parent, as a real /var/lib would be (pytest's tmp is 0700)
    root = Path(tempfile.mkdtemp(prefix="lockmq-modes-"))
    root.chmod(0o755)
    as_root = os.geteuid() == 0
    try:
        data = root / "data"
        keys = _register(data, "LOCK-15", "FW-15")
        first = brokers(data, {})
        w = Peer(first.port, "LOCK-15")
        try:
            w.auth_lock(keys["LOCK-15"])
            w.publish("lock.events", 1, payload=b"card=04A1B2C3D4")
        finally:
            w.close()
        first.stop()
        # the data dir as lockmq v0.1 left it: 0755 directories, the store's files 0644
        # (the registry and the master key were already 0600)
        for dirpath, dirnames, filenames in os.walk(data):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                if not name.startswith(("security.db", "master.key")):
                    os.chmod(os.path.join(dirpath, name), 0o644)
        seg = data / "message.log" / "00000000000000000000.log"
        if as_root:   # the attack works on those modes: another user reads card ids
            leaked = _read_as_nobody(seg)
            assert leaked.returncode == 0 and b"04A1B2C3D4" in leaked.stdout

        old_umask = os.umask(0)            # the broker and the build get umask 0
        try:
            broker = brokers(data, {})
            out = root / "board"
            from lockmq.cli import main as lockmq_main
            assert lockmq_main(["firmware", "build", "--out", str(out), "--sn", "FW-15",
                                "--key", keys["FW-15"].hex(), "--broker",
                                f"127.0.0.1:{broker.port}", "--hw", "sim"]) == 0
        finally:
            os.umask(old_umask)
        line = broker.wait_log(r"event=store_log .*tightened the modes")
        # every store file the old broker left 0644 is named (in walk order)
        assert "to 0600/0700 (were: " in line and "LOCK 0644" in line

        # the legitimate path: the lock publishes to a new topic (new files, umask 0)
        w = Peer(broker.port, "LOCK-15")
        try:
            w.auth_lock(keys["LOCK-15"])
            assert w.publish("lock.audit", 2).status == 0   # seq 2: dedup is per lock
        finally:
            w.close()
        wait_for(lambda: _topic_end(broker, "lock.audit") == 1, "the new topic's record")
        assert _topic_end(broker, "lock.events") == 1          # the old record is still there
        modes = _modes(data)
        assert "offset-lock.audit.log" in modes
        loose = {p: oct(m) for p, m in modes.items()
                 if m & 0o077 or (m != 0o700 and (data / p).is_dir())}
        assert not loose, loose
        assert modes["."] == 0o700 and modes["message.log"] == 0o700

        # the board image and the flash folder's config carry the device key
        image = root / "board.lfs"
        assert stat.S_IMODE(image.stat().st_mode) == 0o600
        assert stat.S_IMODE((out / "config.json").stat().st_mode) == 0o600
        if as_root:
            for secret in (seg, image, out / "config.json"):
                refused = _read_as_nobody(secret)
                assert refused.returncode != 0
                assert os.strerror(errno.EACCES).encode() in refused.stderr
        from lockmq.firmware_tools.lfsimage import list_image
        assert json.loads(list_image(image)["/config.json"])["key"] == keys["FW-15"].hex()
        # and the board built that way boots and connects to its broker
        lock = locks(out)
        lock.expect(rf"^I net connected broker=127.0.0.1:{broker.port} mac=1$", timeout=60)
        broker.wait_log(r"security_auth_ok reason=lock name=FW-15")
    finally:
        shutil.rmtree(root, ignore_errors=True)
