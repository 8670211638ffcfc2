"""End-to-end scenarios: the real lock firmware against a real ``lockmq broker``.

Each runs on the target given by ``--hil-target`` (virtual boards by default). The
broker's log is read back with ``lockmq.store`` after it stops, and compared with
what the lock said it queued: every event exactly once, in sequence order.
"""

from __future__ import annotations

import random
import time

import pytest

from lockmq.hil.broker import BrokerProcess
from lockmq.hil.plugin import LockFactory
from lockmq.hil.scenario import assert_exactly_once_in_order, stored_seqs

pytestmark = pytest.mark.hil

SN = "LOCK0001"


def online_lock(broker: BrokerProcess, lock_factory: LockFactory, sn: str = SN,
                via: tuple[str, int] | None = None, **settings: object):
    """Provision ``sn``, boot its board, wait until it is connected."""
    key = broker.provision([sn])[sn]
    lock = lock_factory(sn, key, [via or broker.address], **settings)
    lock.wait_ready()
    lock.wait_online()
    return lock


def test_boot_and_register(broker: BrokerProcess, lock_factory: LockFactory) -> None:
    key = broker.provision([SN])[SN]
    lock = lock_factory(SN, key, [broker.address])
    lock.expect(rf"I sys boot fw=\S+ sn={SN} hw=sim")
    lock.expect(r"I q loaded len=0 next_seq=\d+ dropped=0")
    lock.wait_ready()
    lock.expect(rf"I net connecting broker=127.0.0.1:{broker.port}")
    lock.wait_online()
    assert lock.status()["link"] == "up"


def test_wrong_key_is_refused(broker: BrokerProcess, lock_factory: LockFactory) -> None:
    broker.provision([SN])
    bad = lock_factory(SN, "11" * 32, [broker.address])  # not the key the broker holds
    bad.expect(rf"E net auth failed broker=127.0.0.1:{broker.port}", timeout=30)
    assert "I net connected" not in bad.full_log()


def test_thousand_events_each_stored_once_in_order(broker: BrokerProcess, lock_factory: LockFactory) -> None:
    lock = online_lock(broker, lock_factory, queue_max=1100)
    lock.events("unlock", 1000)
    lock.wait_drained(timeout=120)
    broker.stop()
    stored = stored_seqs(broker, SN)
    assert_exactly_once_in_order(lock, stored, expect_count=1000)


@pytest.mark.slow  # 150 events at 30/s; tests/firmware/test_link holds the order under push-back by default
def test_order_kept_when_the_broker_rate_limits(tmp_path, lock_factory: LockFactory,
                                                hil_target) -> None:
    from lockmq.hil.broker import broker_available

    if broker_available():
        pytest.skip(broker_available())
    broker = BrokerProcess(tmp_path / "slow-broker", host=hil_target.board_broker_host,
                           tables={"security": {"lock_message_rate": 30.0,
                                                "lock_message_burst": 10}}).start()
    try:
        lock = online_lock(broker, lock_factory, queue_max=400)
        # a rate well below any lock's (a frozen 32-bit one on a loaded machine was seen
        # at ~75 events/s, under the 100/s this test once used: no push-back, a failure)
        lock.events("unlock", 150)
        lock.wait_drained(timeout=120)
        assert "code=21" in lock.full_log()  # the broker did push back (RATE_LIMITED)
        # (This caught records refused inside a pipelined window being stored after
        # later ones; the firmware publishes one at a time since 3c72d8a.)
        broker.stop()
        assert_exactly_once_in_order(lock, stored_seqs(broker, SN), expect_count=150)
    finally:
        broker.stop()


def test_broker_restarted_mid_stream(broker: BrokerProcess, lock_factory: LockFactory) -> None:
    lock = online_lock(broker, lock_factory, queue_max=600)
    lock.events("unlock", 500)
    lock.expect(r"I evt acked seq=\d+", timeout=30)  # the stream is flowing
    broker.restart(crash=True)  # SIGKILL: acks in flight are lost, stored records are not
    lock.expect(r"W net down", timeout=30)
    lock.wait_online(timeout=60)
    lock.wait_drained(timeout=120)
    broker.stop()
    assert_exactly_once_in_order(lock, stored_seqs(broker, SN), expect_count=500)


@pytest.mark.slow  # drop, cut, slow and stall in turn; the default tier cuts a lock's links in test_deploy, tests/firmware/test_link
def test_network_cut_and_restored(broker: BrokerProcess, lock_factory: LockFactory,
                                  fault_proxy_factory) -> None:
    proxy = fault_proxy_factory(broker.address)
    lock = online_lock(broker, lock_factory, via=proxy.address, queue_max=600)
    lock.events("unlock", 100)
    lock.expect(r"I evt acked seq=\d+", timeout=30)
    # Silent loss: packets vanish, the lock notices by its I/O timeout.
    proxy.drop()
    lock.events("failed_attempt", 50)
    lock.expect(r"W net down", timeout=30)
    proxy.restore()
    lock.wait_online(timeout=60)
    # Hard cut: connections reset, the broker unreachable for a while.
    proxy.cut()
    lock.events("door_left_open", 50)
    lock.expect(r"W net down", timeout=30)
    lock.expect(r"I net backoff ms=\d+", timeout=30)
    time.sleep(1.0)
    proxy.restore()
    lock.wait_online(timeout=60)
    # A slow, then stalled link: delivered late but delivered.
    proxy.slow(delay_s=0.05)
    lock.events("tamper", 20)
    proxy.stall()
    time.sleep(0.5)
    proxy.restore()
    lock.wait_drained(timeout=120)
    # One RST on the open connection: the lock reconnects and carries on.
    lock.skip_pending()
    proxy.reset()
    lock.expect(r"W net down", timeout=30)
    lock.wait_online(timeout=60)
    lock.events("low_battery", 10)
    lock.wait_drained(timeout=60)
    broker.stop()
    assert_exactly_once_in_order(lock, stored_seqs(broker, SN), expect_count=230)
    assert proxy.stats.accepted >= 3  # it really reconnected through the proxy


def test_events_before_the_first_connect_are_delivered(broker: BrokerProcess, lock_factory: LockFactory,
                                                       fault_proxy_factory) -> None:
    proxy = fault_proxy_factory(broker.address)
    proxy.cut()  # a fresh board installed while the network is down
    key = broker.provision([SN])[SN]
    lock = lock_factory(SN, key, [proxy.address], queue_max=200)
    lock.wait_ready()
    lock.events("unlock", 30)
    for _ in range(30):
        lock.expect(r"I evt queued seq=\d+ type=unlock", timeout=30)
    proxy.restore()
    lock.wait_online(timeout=60)
    lock.wait_drained(timeout=60)
    broker.stop()
    assert_exactly_once_in_order(lock, stored_seqs(broker, SN), expect_count=30)


def test_reflashed_board_never_reuses_sequence_numbers(broker: BrokerProcess, lock_factory: LockFactory,
                                                       fault_proxy_factory) -> None:
    proxy = fault_proxy_factory(broker.address)
    lock = online_lock(broker, lock_factory, via=proxy.address, queue_max=200)
    lock.events("unlock", 20)
    lock.wait_drained(timeout=60)
    # Re-flash: code and config again, every state file (seq.dat too) gone.
    proxy.cut()
    assert lock.source is not None
    lock.deploy(lock.source, fresh=True)
    lock.wait_ready()
    lock.events("failed_attempt", 10)  # numbered provisionally: the board has no seq files
    for _ in range(10):
        lock.expect(r"I evt queued seq=\d+ type=failed_attempt", timeout=30)
    proxy.restore()
    lock.expect(r"W sys seq renumbered from=\d+ to=\d+ n=10", timeout=60)
    lock.wait_drained(timeout=60)
    broker.stop()
    assert_exactly_once_in_order(lock, stored_seqs(broker, SN), expect_count=30)


@pytest.mark.slow  # many cuts; the default tier cuts power in test_ota's switch stage and test_broker_restarted_mid_stream crashes the broker
def test_power_cut_at_random_instants(broker: BrokerProcess, lock_factory: LockFactory,
                                      hil_target) -> None:
    if not hil_target.can_power_cut:
        pytest.skip(f"{hil_target.label} has no power control: give --hil-power-cut-cmd")
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    print(f"power-cut instants from random seed {seed}")  # shown with a failure
    cuts = 5
    lock = online_lock(broker, lock_factory, queue_max=600)
    for _ in range(cuts):
        lock.wait_drained(timeout=120)  # each burst starts from an empty queue: never overflows
        lock.events("unlock", 300)  # ~0.3-1 s of queueing, sending and acking
        time.sleep(rnd.uniform(0.0, 0.5))  # the cut lands somewhere in it
        lock.power_cut(off_s=rnd.uniform(0.0, 0.2))
        if rnd.random() < 0.4:  # and sometimes again while it boots and recovers
            time.sleep(rnd.uniform(0.0, 0.05))
            lock.power_cut()
        lock.expect(r"I q loaded len=\d+ next_seq=\d+", timeout=30)
        lock.wait_ready()
        lock.wait_online(timeout=60)  # a burst waits for room only while the link is up
    lock.wait_drained(timeout=120)
    broker.stop()
    stored = stored_seqs(broker, SN)
    assert stored, f"nothing stored (seed {seed})"
    assert_exactly_once_in_order(lock, stored, unlogged_ok=cuts)


def test_remote_unlock_executed_and_reported(broker: BrokerProcess, lock_factory: LockFactory) -> None:
    from lockmq.client import Producer
    from lockmq.protocol import CommandKind

    lock = online_lock(broker, lock_factory)
    token = broker.service_token("opener", "--command", SN)
    with Producer(f"{broker.host}:{broker.port}", token=token) as svc:
        out = svc.command(SN, CommandKind.UNLOCK, (2).to_bytes(2, "big"), expires_in_s=30, timeout_s=30)
    assert out.ok, out
    lock.expect(r"I hw relay on")
    lock.expect(r"I cmd \w+ id=\d+ ok")
    lock.expect(r"I hw relay off", timeout=15)  # after the 2 s asked for


@pytest.mark.slow  # an offline wait; test_remote_unlock_executed_and_reported runs by default
def test_remote_unlock_waits_for_an_offline_lock(broker: BrokerProcess, lock_factory: LockFactory,
                                                 fault_proxy_factory) -> None:
    import concurrent.futures

    from lockmq.client import Producer
    from lockmq.protocol import CommandKind

    proxy = fault_proxy_factory(broker.address)
    lock = online_lock(broker, lock_factory, via=proxy.address)
    token = broker.service_token("opener", "--command", SN)
    lock.skip_pending()
    proxy.cut()
    lock.expect(r"W net down", timeout=30)
    with Producer(f"{broker.host}:{broker.port}", token=token) as svc, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        # A person waits at the door: the unlock is worth something for 20 s, after
        # which the lock must refuse it as expired.
        pending = pool.submit(svc.command, SN, CommandKind.UNLOCK, (1).to_bytes(2, "big"),
                              expires_in_s=20, timeout_s=25)
        time.sleep(1.0)  # the command waits at the broker while the lock is away
        assert not pending.done()
        proxy.restore()
        out = pending.result(timeout=90)
    assert out.ok, out
    lock.expect(r"I cmd \w+ id=\d+ ok", timeout=30)
    assert "I hw relay on" in lock.full_log()


def test_firmware_update_deployed_and_back_online(broker: BrokerProcess, lock_factory: LockFactory,
                                                  firmware_template, tmp_path, fault_proxy_factory) -> None:
    from lockmq.hil.firmware import make_flash

    proxy = fault_proxy_factory(broker.address)
    lock = online_lock(broker, lock_factory, via=proxy.address, queue_max=600)
    lock.events("unlock", 20)
    lock.expect(r"I evt acked seq=\d+", timeout=30)
    lock.skip_pending()
    proxy.cut()  # events pile up in the offline queue while the update happens
    lock.expect(r"W net down", timeout=30)
    lock.events("failed_attempt", 30)
    for _ in range(30):
        lock.expect(r"I evt queued seq=\d+ type=failed_attempt", timeout=30)
    # The new build: same identity and settings, code copied through the raw REPL.
    update = make_flash(firmware_template, tmp_path / "update", SN, lock.key, [proxy.address],
                        queue_max=600, backoff_max_ms=2000, io_timeout_ms=3000, heartbeat_s=5,
                        backoff_min_ms=100)
    lock.deploy(update)
    lock.expect(rf"I sys boot fw=\S+ sn={SN}", timeout=30)
    m = lock.expect(r"I q loaded len=(\d+)", timeout=30)
    assert int(m.group(1)) > 0  # the offline queue survived the update
    proxy.restore()
    lock.wait_online(timeout=60)
    lock.wait_drained(timeout=60)
    broker.stop()
    assert_exactly_once_in_order(lock, stored_seqs(broker, SN), expect_count=50)
