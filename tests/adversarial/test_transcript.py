"""Trust round 2, item 1: what a session negotiated is proven (SPEC 2, "The session
transcript" and "Per-device policy"), over real TCP on 127.0.0.1 with the real firmware.

The attack seen live: an on-path relay cleared the MAC flag in a real lock's CONNECT
(CRC recomputed), forwarded CHALLENGE and AUTH unchanged, got a session without MACs
and injected "unlock by card, ok" as the lock. Now the AUTH proof covers the CONNECT's
flags and body and the CHALLENGE's body: the broker refuses the proof, the relay never
gets a session, and the real lock, once the path is clean, connects with MACs.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from lockmq.protocol import (ErrorCode, Flag, FrameDecoder, LockEvent, Op, ProtocolError,
                             Publish, encode_frame)
from lockmq.protocol import EventType, Method, Result
from lockmq.security import Permissions
from lockmq.testing import Lock, Peer, Refused, SecureBroker, require_micropython, run_cli
from lockmq.testing.relay import pipe

pytestmark = pytest.mark.timeout(180)


class StripRelay:
    """A relay on 127.0.0.1 between a lock and the broker (again after each reconnect).
    While ``strip`` is set it clears the MAC flag of the lock's CONNECT (re-encoded: a
    valid CRC) and, if the broker ever answers CONNECT_ACK, injects a forged event as
    the lock -- the attack of the review."""

    def __init__(self, target_port: int, sn: str) -> None:
        self.target = target_port
        self.sn = sn
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.strip = True
        self.stripped = 0          # CONNECTs whose MAC flag was cleared
        self.connect_acks = 0      # CONNECT_ACKs the broker sent on a stripped session
        self.injected = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                lock_side, _ = self.srv.accept()
            except OSError:
                return
            broker_side = socket.create_connection(("127.0.0.1", self.target))
            state = {"stripped": False}
            threading.Thread(target=self._to_broker, args=(lock_side, broker_side, state),
                             daemon=True).start()
            threading.Thread(target=self._to_lock, args=(broker_side, lock_side, state),
                             daemon=True).start()

    def _to_broker(self, src: socket.socket, dst: socket.socket, state: dict) -> None:
        dec = FrameDecoder(1 << 20)
        try:
            while data := src.recv(65536):
                dec.feed(data)
                while (f := dec.next_frame()) is not None:
                    flags = f.flags
                    if f.opcode == Op.CONNECT and self.strip and flags & Flag.MAC:
                        flags &= ~Flag.MAC
                        state["stripped"] = True
                        self.stripped += 1
                    dst.sendall(encode_frame(f.opcode, f.sn, f.body, f.opaque, flags))
        except (OSError, ProtocolError):
            pass
        finally:
            dst.close()

    def _to_lock(self, src: socket.socket, dst: socket.socket, state: dict) -> None:
        dec = FrameDecoder(1 << 20)
        try:
            while data := src.recv(65536):
                dec.feed(data)
                while (f := dec.next_frame()) is not None:
                    if f.opcode == Op.CONNECT_ACK and state["stripped"]:
                        self.connect_acks += 1
                        forged = LockEvent(EventType.UNLOCK, 0, Method.CARD, Result.OK, 0,
                                           bytes(8)).encode()
                        src.sendall(encode_frame(Op.PUBLISH, self.sn,
                                                 Publish("lock.events", 7, 0, forged).encode(),
                                                 0x7777))
                        self.injected += 1
                    dst.sendall(f.encode())
        except (OSError, ProtocolError):
            pass
        finally:
            dst.close()

    def close(self) -> None:
        self.srv.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A broker as shipped (``lock_frame_mac = "optional"``), auth required."""
    env = SecureBroker(tmp_path_factory.mktemp("transcript"),
                       tokens={"ops": Permissions(admin=True)})
    yield env, env.start()
    env.close()


def provision(env: SecureBroker, sn: str, *extra: str) -> dict:
    """``lockmq devices add`` as an operator runs it: the lock's provisioning file."""
    prov = env.root / f"{sn}.json"
    assert run_cli("devices", "add", sn, "--out", str(prov), "--data-dir", str(env.data),
                   *extra) == 0
    return json.loads(prov.read_text())


def board(env: SecureBroker, doc: dict, port: int) -> Path:
    from lockmq.firmware_tools.build import DeviceConfig, build_folder
    return build_folder(env.root / f"board-{doc['sn']}", DeviceConfig(
        sn=doc["sn"], key=doc["key"], brokers=[("127.0.0.1", port)], hw="sim",
        extra={"backoff_min_ms": 100, "backoff_max_ms": 400}), cards=[])


def online(broker, token: str) -> list[str]:
    with Peer(broker.port, "") as admin:
        admin.auth_token(token)
        return [d["sn"] for d in admin.admin("devices")["devices"]]


def _metric(broker, prefix: str) -> float:
    return sum(v for k, v in broker.metrics().items() if k.startswith(prefix))


def test_a_relay_that_strips_the_mac_request_gets_no_session(env):
    require_micropython()
    secure, broker = env
    doc = provision(secure, "LOCK-0001")          # default policy: frame MACs required
    relay = StripRelay(broker.port, "LOCK-0001")
    lock = Lock(board(secure, doc, relay.port))
    try:
        before = _metric(broker, 'lockmq_security_auth_failed_total{reason="bad_proof"')
        mark = broker.mark()
        # Attack: every CONNECT of the real lock has its MAC flag cleared on the way. The
        # lock's proof covers the flag it sent, the broker checks it against the flag it
        # received: refused at once, logged, counted; the lock sees AUTH_FAILED.
        lock.expect(r"W net down err=auth", timeout=30)
        broker.wait_log(r"auth_failed.*sn=LOCK-0001.*reason=bad_proof", start=mark)
        lock.expect(r"W net down err=auth", timeout=30)          # and again: never in
        assert relay.stripped >= 2
        assert relay.connect_acks == 0 and relay.injected == 0
        assert "LOCK-0001" not in online(broker, secure.tok["ops"])
        assert _metric(broker, 'lockmq_security_auth_failed_total{reason="bad_proof"') \
            >= before + 2
        assert not lock.grep(r"net connected")

        # Legitimate: the path is clean again; the same lock connects with MACs and its
        # event is stored and acked.
        relay.strip = False
        lock.expect(r"I net connected broker=127\.0\.0\.1:\d+ mac=1", timeout=30)
        lock.send("event tamper")
        lock.expect(r"I evt acked seq=", timeout=30)
        assert "LOCK-0001" in online(broker, secure.tok["ops"])
        assert relay.injected == 0
    finally:
        lock.close()
        relay.close()


def test_a_lock_provisioned_for_macs_is_never_accepted_without_them(env):
    """Per-device policy: the broker's ``lock_frame_mac = "optional"`` does not apply to
    a lock registered for MACs (the default). A client holding the real key that
    honestly asks for no MACs is refused (BAD_MAC); one registered ``--no-mac`` is
    accepted and the broker logs that its frames are not protected."""
    secure, broker = env
    key = bytes.fromhex(provision(secure, "LOCK-0002")["key"])
    mark = broker.mark()
    w = Peer(broker.port, "LOCK-0002")
    try:
        with pytest.raises(Refused) as ei:
            w.auth_lock(key)                     # honest proof, no MAC flag
        assert ei.value.code == ErrorCode.BAD_MAC
    finally:
        w.close()
    broker.wait_log(r"auth_failed.*sn=LOCK-0002.*reason=mac_required", start=mark)
    # ... with MACs it is in
    with Peer(broker.port, "LOCK-0002") as w:
        w.auth_lock(key, mac=True)
        assert w.session.mac_key

    # Registered for firmware that cannot do MACs: accepted, and logged as such.
    legacy = bytes.fromhex(provision(secure, "LOCK-0003", "--no-mac")["key"])
    mark = broker.mark()
    with Peer(broker.port, "LOCK-0003") as w:
        w.auth_lock(legacy)
        assert w.publish("lock.events", 1) is not None
    broker.wait_log(r"lock_without_mac.*sn=LOCK-0003", start=mark)

    # Registered for TLS: refused over plain TCP, whatever it asks.
    tls_only = bytes.fromhex(provision(secure, "LOCK-0004", "--tls")["key"])
    mark = broker.mark()
    w = Peer(broker.port, "LOCK-0004")
    try:
        with pytest.raises(Refused) as ei:
            w.auth_lock(tls_only, mac=True)
        assert ei.value.code == ErrorCode.AUTH_FAILED
    finally:
        w.close()
    broker.wait_log(r"auth_failed.*sn=LOCK-0004.*reason=tls_required", start=mark)

    # The registry shows each lock's policy.
    assert run_cli("devices", "policy", "LOCK-0003", "--mac", "--data-dir", str(secure.data)) == 0
    mark = broker.mark()
    w = Peer(broker.port, "LOCK-0003")
    try:
        with pytest.raises(Refused) as ei:
            w.auth_lock(legacy)
        assert ei.value.code == ErrorCode.BAD_MAC
    finally:
        w.close()
