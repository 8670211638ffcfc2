"""The whole chain with the real firmware: ``lockmq devices add`` provisions a lock,
the real MicroPython firmware (unix port) built from that provisioning file
authenticates to a real ``lockmq broker`` (auth required, over plain TCP and over
TLS with the CA as DER), runs a signed remote unlock, and refuses a replayed and a
forged one injected by a man in the middle.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from lockmq.protocol import (Command, CommandKind, CommandStatus, FrameDecoder, Op,
                             ProtocolError, encode_frame)
from lockmq.security import Permissions
from lockmq.testing import Lock, Peer, SecureBroker, require_micropython, run_cli
from lockmq.testing.relay import pipe


pytestmark = pytest.mark.timeout(180)


class MitmProxy:
    """A TCP relay between a lock and the broker that records the broker's COMMAND
    frames and can inject bytes into the lock's stream at a frame boundary."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.commands: list[bytes] = []
        self._to_lock: socket.socket | None = None
        self._send = threading.Lock()
        self._ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        lock_side, _ = self.srv.accept()
        broker_side = socket.create_connection(("127.0.0.1", self.target))
        self._to_lock = lock_side
        self._ready.set()
        threading.Thread(target=pipe, args=(lock_side, broker_side), daemon=True).start()
        dec = FrameDecoder(1 << 20)
        try:
            while data := broker_side.recv(65536):
                dec.feed(data)
                while (f := dec.next_frame()) is not None:
                    raw = f.encode()
                    if f.opcode == Op.COMMAND:
                        self.commands.append(raw)
                    with self._send:
                        lock_side.sendall(raw)
        except (OSError, ProtocolError):
            pass
        finally:
            lock_side.close()

    def inject(self, raw: bytes) -> None:
        assert self._ready.wait(10)
        with self._send:
            self._to_lock.sendall(raw)  # type: ignore[union-attr]

    def close(self) -> None:
        self.srv.close()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    require_micropython()
    env = SecureBroker(tmp_path_factory.mktemp("chain"), tls=True)
    opener = env.token("opener", Permissions(command=("FW-*",)))
    yield env.root, env.start(), env.tls_port, env.certs, opener
    env.close()


def build_board(root: Path, sn: str, port: int, data_dir: str, tls_ca: str | None = None,
                frame_mac: bool = True) -> Path:
    """`lockmq devices add` -> provisioning file -> flash folder of the real firmware."""
    from lockmq.firmware_tools.build import DeviceConfig, build_folder
    prov = root / f"{sn}.json"
    argv = ["devices", "add", sn, "--out", str(prov), "--broker", f"127.0.0.1:{port}",
            "--data-dir", data_dir]
    if tls_ca:
        argv += ["--tls-ca", tls_ca, "--server-hostname", "gw.local"]
    if not frame_mac:
        argv.append("--no-mac")     # (provisioned as firmware without MACs)
    assert run_cli(*argv) == 0
    doc = json.loads(prov.read_text())
    tls = doc.get("tls", {})
    folder = build_folder(root / f"board-{sn}", DeviceConfig(
        sn=doc["sn"], key=doc["key"], brokers=[tuple(b) for b in doc["brokers"]], hw="sim",
        tls=bool(tls.get("enabled")), tls_ca=tls.get("ca", "ca.der"),
        tls_server_hostname=tls.get("server_hostname", ""), frame_mac=frame_mac),
        tls_ca_file=tls_ca)
    return folder


def command(svc: Peer, sn: str, args: bytes = b"\x00\x03") -> int:
    return svc.send(Op.COMMAND, Command(sn, 0, 0, CommandKind.UNLOCK, args).encode())


def test_provisioned_firmware_runs_signed_unlock_and_refuses_replay_and_forgery(chain):
    root, broker, _, _, opener = chain
    proxy = MitmProxy(broker.port)
    # Frame MACs off: with them (the default) an injected frame never reaches the
    # command layer (BAD_MAC, tests/adversarial/test_transport.py); here the command
    # signatures' own replay and forgery checks are the defence under test.
    board = build_board(root, "FW-1", proxy.port, broker.data_dir, frame_mac=False)
    lock = Lock(board)
    svc = Peer(broker.port, "")
    try:
        lock.expect(r"I net connected", timeout=30)
        svc.auth_token(opener)
        for i in (1, 2):
            res = svc.answer(command(svc, "FW-1"))
            assert res.status == CommandStatus.OK
            lock.expect(rf"I cmd unlock id={i} ok", timeout=30)
        assert len(proxy.commands) == 2
        # the man in the middle replays the first unlock ...
        proxy.inject(proxy.commands[0])
        lock.expect(r"W cmd refused id=1 reason=replay", timeout=30)
        # ... and forges new ones from the second: a new id under the old MAC, and
        # a new id with longer unlock arguments under the old MAC
        for cid, args in ((3, None), (4, b"\x02\x58")):
            forged = Command.decode(_body(proxy.commands[1]))
            forged.cmd_id = cid
            if args is not None:
                forged.args = args
            proxy.inject(encode_frame(Op.COMMAND, "", forged.encode(), cid))
            lock.expect(rf"W cmd refused id={cid} reason=bad_sig", timeout=30)
        assert not lock.grep(r"I cmd unlock id=[34]")
        broker.wait_log(r"command_result_unknown")     # the lock's REFUSED answers
    finally:
        svc.close()
        lock.close()
        proxy.close()


def _body(raw: bytes) -> bytes:
    dec = FrameDecoder(1 << 20)
    dec.feed(raw)
    return dec.next_frame().body


def test_wrong_key_firmware_is_refused(chain):
    root, broker, _, _, _ = chain
    board = build_board(root, "FW-2", broker.port, broker.data_dir)
    assert run_cli("devices", "rekey", "FW-2", "--out", str(root / "FW-2-new.json"),
               "--data-dir", broker.data_dir) == 0          # the board keeps the old key
    lock = Lock(board)
    try:
        lock.expect(r"E net auth failed", timeout=30)
    finally:
        lock.close()
    broker.wait_log(r"auth_failed.*FW-2|FW-2.*auth_failed")


def test_firmware_over_tls_with_der_ca(chain):
    root, broker, tls_port, certs, _ = chain
    board = build_board(root, "FW-3", tls_port, broker.data_dir, tls_ca=certs.ca_der)
    lock = Lock(board)
    try:
        lock.expect(r"I net connected", timeout=30)
    finally:
        lock.close()
    broker.wait_log(r"auth_ok.*name=FW-3.*tls=True")
