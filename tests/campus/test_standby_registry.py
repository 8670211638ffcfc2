"""The standby copies the primary's security registry (issue #16): locks registered,
tokens created and revoked on the primary after the standby started hold on the
promoted standby without any manual copy; the master key must be the primary's."""

from __future__ import annotations

import os
import shutil

import pytest

from lockmq.protocol import ErrorCode
from lockmq.security import Permissions
from lockmq.testing import BrokerProcess, Peer, Refused, SecureBroker, free_port, run_cli, wait_for


def _standby(tmp_path, primary: BrokerProcess, token: str) -> BrokerProcess:
    return BrokerProcess(str(tmp_path / "s" / "data"), {
        "broker": {"port": free_port()},
        "replication": {"role": "standby", "primary": primary.address, "token": token,
                        "fetch_wait_ms": 200, "registry_every_s": 0.2}},
        start=False).start(ready=r"standby_following")


def _registry_version(port: int, token: str) -> str:
    """The primary's registry version, as a standby sees it."""
    p = Peer(port, "standby-probe")
    try:
        p.auth_token(token)
        return p.admin("replica.security", have="", offset=0)["version"]
    finally:
        p.close()


def _login(port: int, token: str) -> dict:
    """Log in with ``token`` and run the ``stats`` admin op."""
    p = Peer(port, "svc")
    try:
        p.auth_token(token)
        return p.admin("stats")
    finally:
        p.close()


def test_locks_and_tokens_made_after_start_work_on_the_promoted_standby(tmp_path):
    sec = SecureBroker(tmp_path / "p", locks=["LOCK-OLD"],
                       tokens={"standby": Permissions(replicate=True),
                               "old": Permissions(admin=True),
                               "ops": Permissions(admin=True)})
    (tmp_path / "s" / "data").mkdir(parents=True)
    # the one manual step: the master key, like a TLS key (copy keeps mode 0600)
    shutil.copy(sec.data / "master.key", tmp_path / "s" / "data" / "master.key")
    primary = sec.start()
    standby = None
    try:
        standby = _standby(tmp_path, primary, sec.tok["standby"])
        standby.wait_log(r"standby_registry_installed")
        # the registry holds token hashes and wrapped keys: admins do not get it
        ops = Peer(primary.port, "ops")
        ops.auth_token(sec.tok["ops"])
        refused = ops.admin("replica.security")
        ops.close()
        assert refused["ok"] is False and refused["error"] == "FORBIDDEN"
        # written on the primary after the standby started
        mark = standby.mark()
        new_key = sec.add_locks("LOCK-NEW")["LOCK-NEW"]
        late = sec.token("late", Permissions(admin=True, publish=("svc.*",)))
        old_id = next(t.id for t in sec.tokens.list() if t.name == "old")
        assert sec.tokens.revoke(old_id)
        version = _registry_version(primary.port, sec.tok["standby"])
        standby.wait_log(rf"standby_registry_installed.*{version}", start=mark)
        primary.kill()
        assert run_cli("standby", "promote", "--data-dir", standby.data_dir) == 0
        standby.wait_log(r"broker_started", timeout=30)
        lock = Peer(standby.port, "LOCK-NEW")
        lock.auth_lock(new_key)                   # HMAC with a key the standby never saw
        assert lock.publish("lock.events", 1, b"e" * 24).status == 0   # stored
        lock.close()
        assert _login(standby.port, late)["ok"] is True
        svc = Peer(standby.port, "svc")
        try:
            with pytest.raises(Refused) as ei:
                svc.auth_token(sec.tok["old"])    # revoked on the primary: here too
            assert ei.value.code == ErrorCode.AUTH_FAILED
        finally:
            svc.close()
    finally:
        if standby is not None:
            standby.stop()
        sec.close()


def test_a_standby_with_another_master_key_refuses_to_follow(tmp_path):
    sec = SecureBroker(tmp_path / "p", locks=["LOCK-1"],
                       tokens={"standby": Permissions(replicate=True)})
    data = tmp_path / "s" / "data"
    data.mkdir(parents=True)
    fd = os.open(data / "master.key", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"\x07" * 32)
    os.close(fd)
    primary = sec.start()
    standby = None
    try:
        standby = _standby(tmp_path, primary, sec.tok["standby"])
        standby.wait_log(r"standby_master_key_mismatch.*copy the primary's master.key")
        wait_for(lambda: not standby.running(), "the standby exits")
    finally:
        if standby is not None:
            standby.stop()
        sec.close()
    assert not (data / "security.db").exists()
    assert os.path.getsize(data / "message.log" / "00000000000000000000.log") == 0


def test_a_primary_without_replica_security_is_followed_without_the_registry(tmp_path):
    """A primary that refuses ``replica.security`` as an unknown op (an older lockmq):
    the copy stops asking and the standby goes on following (the operator copies
    ``security.db``), instead of taking the refusal for an unreachable primary."""
    import asyncio

    from lockmq.client.admin import AsyncAdmin
    from lockmq.replication.registry_copy import RegistryCopy
    from lockmq.testing import BrokerThread

    with BrokerThread(str(tmp_path / "p")) as primary:
        primary.call(lambda: primary.broker.admin.ops.pop("replica.security"))
        copy = RegistryCopy(str(tmp_path / "s" / "security.db"), str(tmp_path / "s" / "master.key"))

        async def sync_twice() -> list[bool]:
            async with AsyncAdmin(f"127.0.0.1:{primary.port}") as admin:
                return [await copy.sync(admin), await copy.sync(admin)]

        assert asyncio.run(sync_twice()) == [False, False]
        assert copy.supported is False
