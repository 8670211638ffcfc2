"""Over-the-air updates of the lock app (docs/firmware.md, "Updates over the air"):
a released bundle fetched by many locks at once, a bundle whose bytes do not match the
signed digest refused, an app that crashes at boot rolled back, a rollout that halts
at its threshold, and power cuts at random instants of every stage."""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from lockmq.hil.broker import BrokerProcess, lockmq_cli
from lockmq.hil.scenario import OTA_STAGES, assert_exactly_once_in_order, stored_seqs

from .test_scenarios import online_lock

#: Locks updated together in the fleet scenario (the issue's proof: 20 at once).
FLEET = 20
#: A short trial for the scenarios (a lock's default is 300 s): heartbeat 5 s + room.
TRIAL_S = 30


@pytest.fixture
def heap(hil_interpreter) -> str | None:
    """The heap of this test's locks. A frozen 32-bit board runs its update from lib/ as
    .mpy (the image keeps the first app), which needs more heap than the frozen app: at
    the frozen boards' 64K the updated app cannot hold a session and is rolled back
    (crash_MemoryError; docs/firmware.md). 96K is the .mpy app's room here."""
    return "96K" if hil_interpreter is not None and hil_interpreter.frozen else None


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*lockmq_cli(), *args], capture_output=True, text=True, timeout=timeout)


def _admin(broker: BrokerProcess) -> list[str]:
    token = getattr(broker, "_ota_admin", None)
    if token is None:
        token = broker._ota_admin = broker.service_token("ota-admin", "--admin")
    return ["--broker", f"{broker.host}:{broker.port}", "--token", token]


def release(broker: BrokerProcess, version: str, bundle: Path | None = None) -> tuple[str, int, str]:
    """``lockmq firmware release``: (version, size, sha256) as it prints them."""
    extra = ["--bundle", str(bundle)] if bundle else ["--version", version]
    p = _cli("firmware", "release", *_admin(broker), *extra)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"^released (\S+) (\d+) ([0-9a-f]{64})$", p.stdout, re.M)
    assert m, p.stdout
    return m.group(1), int(m.group(2)), m.group(3)


def send_update(broker: BrokerProcess, sn: str, bundle: tuple[str, int, str]) -> str:
    """``lockmq command SN fw-update VERSION SIZE SHA256``; returns its output."""
    v, size, sha = bundle
    p = _cli("command", *_admin(broker), sn, "fw-update", v, str(size), sha, "--expires", "60")
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def devices(broker: BrokerProcess) -> dict[str, dict]:
    p = _cli("devices", "online", *_admin(broker), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    return {d["sn"]: d for d in json.loads(p.stdout)}


def broken_bundle(out: Path, version: str) -> Path:
    """A bundle whose app raises at import (a bad build that passed its digest)."""
    from lockmq.firmware_tools.build import find_mpy_cross, write_modules
    from lockmq.firmware_tools.bundle import from_lib

    lib = out.parent / "broken-lib"
    write_modules(lib, source=False)
    src = out.parent / "app.py"
    src.write_text('raise RuntimeError("a bad build")\n')
    subprocess.run([find_mpy_cross(), "-march=xtensawin", "-s", "lockapp/app.py",
                    "-o", str(lib / "lockapp" / "app.mpy"), str(src)], check=True)
    ver = lib / "lockapp" / "_version.py"
    for p in (lib / "lockapp").glob("_version.*"):
        p.unlink()
    ver.write_text(f'VERSION = "{version}"\n')
    out.write_bytes(from_lib(lib, version))
    return out


@pytest.mark.slow  # 20 locks at once; each OTA path runs in the default tier on one lock
def test_ota_of_a_fleet_at_once(broker: BrokerProcess, lock_factory, heap) -> None:
    """FLEET locks, each with events queued, updated by one rollout of the locks that
    carry a tag: every lock boots the new version, confirms it, and delivers its events
    exactly once; ``firmware status`` and ``/metrics`` count them updated."""
    sns = [f"OTA{i:04d}" for i in range(FLEET)]
    keys = broker.provision(sns + ["OTAUNTAG"])
    broker._cli("devices", "tag", *sns, "--add", "ota-fleet", "--data-dir", str(broker.data_dir))
    locks = [lock_factory(sn, keys[sn], [broker.address], heapsize=heap, ota_trial_s=TRIAL_S)
             for sn in sns]
    for lock in locks:
        lock.wait_ready()
        lock.wait_online(timeout=120)
        lock.events("tamper", 2)
    bundle = release(broker, "9.1.0-fleet")
    p = _cli("firmware", "rollout", *_admin(broker), "--version", bundle[0], "--wave", str(FLEET),
             "--deadline", "240", "--tag", "ota-fleet", timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"done: updated {FLEET}" in p.stdout and "OTAUNTAG" not in p.stdout, p.stdout
    for lock in locks:
        lock.expect(r"I ota staged v=9\.1\.0-fleet", timeout=60)
        lock.expect(r"I sys boot fw=9\.1\.0-fleet ", timeout=60)
        lock.expect(r"I ota confirmed v=9\.1\.0-fleet", timeout=60)
    online = devices(broker)
    assert all(online[sn]["fw"] == "9.1.0-fleet" for sn in sns), online
    st = _cli("firmware", "status", *_admin(broker), "--version", "9.1.0-fleet", "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    assert {r["sn"]: r["state"] for r in json.loads(st.stdout)} == {sn: "updated" for sn in sns}
    metrics = broker.metrics()
    assert metrics.get('lockmq_firmware_rollout_locks{state="updated",version="9.1.0-fleet"}') \
        == FLEET, {k: v for k, v in metrics.items() if "firmware" in k}
    for lock in locks:
        lock.wait_drained(timeout=60)
    broker.stop()
    for lock in locks:
        assert_exactly_once_in_order(lock, stored_seqs(broker, lock.sn), expect_count=2)


def test_a_bundle_that_does_not_match_its_digest_is_refused(broker: BrokerProcess, lock_factory,
                                                            heap) -> None:
    """The bytes the broker serves are not the ones the signed command names (a
    damaged or substituted file): the lock refuses them and keeps its app."""
    lock = online_lock(broker, lock_factory, "OTABAD01", heapsize=heap, ota_trial_s=TRIAL_S)
    old = re.search(rb"I sys boot fw=(\S+)", lock.full_log().encode()).group(1).decode()
    bundle = release(broker, "9.2.0-tampered")
    stored = Path(broker.data_dir) / "firmware" / f"{bundle[2]}.bin"
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    said = send_update(broker, "OTABAD01", bundle)
    assert "fetching 9.2.0-tampered" in said
    # the id the CLI prints is the one the lock logs
    cli_id = re.search(r"command (\d+) ok", said).group(1)
    lock.expect(rf"I cmd fw-update id={cli_id} ok", timeout=10)
    lock.expect(r"E ota refused v=9\.2\.0-tampered why=digest", timeout=60)
    assert "I ota staged" not in lock.full_log()
    lock.expect(r"W net down err=ota_refused", timeout=10)   # a new CONNECT says it at once
    lock.wait_online(timeout=60)
    dev = devices(broker)["OTABAD01"]
    assert dev["fw"] == old and dev["ota"] == "failed:digest", dev
    lock.power_cut()                                      # still the old app, and it says why
    lock.expect(rf"I sys boot fw={re.escape(old)} ", timeout=30)
    lock.wait_online(timeout=60)
    dev = devices(broker)["OTABAD01"]
    assert dev["fw"] == old and dev["ota"] == "failed:digest", dev


def test_an_app_that_crashes_at_boot_is_rolled_back_and_the_rollout_halts(
        broker: BrokerProcess, lock_factory, tmp_path, heap) -> None:
    """A bundle whose app raises at import: the first lock boots it, main.py puts the
    old app back and the lock says why at CONNECT; the rollout (halt after 1 failure,
    one lock per wave) stops before the other locks get it."""
    sns = ["OTACRSH1", "OTACRSH2", "OTACRSH3"]
    keys = broker.provision(sns)
    locks = [lock_factory(sn, keys[sn], [broker.address], heapsize=heap, ota_trial_s=TRIAL_S)
             for sn in sns]
    for lock in locks:
        lock.wait_online(timeout=60)
    old = re.search(rb"I sys boot fw=(\S+)", locks[0].full_log().encode()).group(1).decode()
    bundle = release(broker, "", broken_bundle(tmp_path / "broken.lkb", "9.3.0-broken"))
    p = _cli("firmware", "rollout", *_admin(broker), "--version", bundle[0], "--wave", "1",
             "--halt-after", "1", "--deadline", "120", *[a for sn in sns for a in ("--sn", sn)],
             timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    first = min(sns, key=lambda sn: sn)          # --sn order is kept sorted
    assert re.search(rf"^{first}\s+failed:crash_RuntimeError$", p.stdout, re.M), p.stdout
    assert "HALTED" in p.stdout, p.stdout
    assert len(re.findall(r"^OTACRSH\d\s+not_started$", p.stdout, re.M)) == 2, p.stdout
    lock = locks[0]
    lock.expect(r"E ota trial failed why=crash_RuntimeError", timeout=30)
    lock.expect(rf"I sys boot fw={re.escape(old)} ", timeout=30)
    lock.wait_online(timeout=60)
    for other in locks[1:]:
        assert "I ota fetch" not in other.full_log()


# the switch (the one stage that replaces the running app) in the default tier, every
# stage in the slow one
@pytest.mark.parametrize("stage", [s if s == "switch" else pytest.param(s, marks=pytest.mark.slow)
                                   for s in OTA_STAGES])
def test_power_cut_during_each_update_stage(broker: BrokerProcess, lock_factory, hil_target,
                                            stage: str, heap) -> None:
    """A power cut at a random instant (seed printed) of one stage of an update: the
    lock always boots an app (the old or the new one, whole), the update completes,
    and the events queued before it are stored exactly once."""
    if not hil_target.can_power_cut:
        pytest.skip(f"{hil_target.label} has no power control")
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    print(f"{stage}: power-cut instant from random seed {seed}")
    sn = f"OTAPC{stage[:3].upper()}"
    lock = online_lock(broker, lock_factory, sn, heapsize=heap, ota_trial_s=TRIAL_S)
    lock.events("unlock", 5)
    bundle = release(broker, f"9.4.0-{stage}")
    send_update(broker, sn, bundle)
    marker, window_s = OTA_STAGES[stage]
    lock.expect(marker, timeout=60)
    time.sleep(rnd.uniform(0.0, window_s))               # somewhere in the stage
    lock.power_cut(off_s=rnd.uniform(0.0, 0.1))
    lock.expect(r"I sys boot fw=", timeout=30)            # an app boots, whichever
    end = time.monotonic() + 120                         # and the update completes
    while devices(broker).get(sn, {}).get("fw") != f"9.4.0-{stage}" or "uptime_s" not in devices(broker)[sn]:
        assert time.monotonic() < end, lock.full_log()[-3000:]
        time.sleep(0.5)
    # confirmed: said in the log, or (a cut between the state's write and the line)
    # reported at the CONNECT after the cut
    assert (f"I ota confirmed v=9.4.0-{stage}" in lock.full_log()
            or devices(broker)[sn].get("ota") == "ok"), lock.full_log()[-3000:]
    lock.wait_drained(timeout=60)
    broker.stop()
    assert_exactly_once_in_order(lock, stored_seqs(broker, sn), unlogged_ok=1)
