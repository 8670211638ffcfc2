"""A consumer cluster across gateways (issue #16): CampusConsumer follows the registry."""

from __future__ import annotations

import sqlite3

from lockmq.client import Producer, SqliteIdempotency
from lockmq.client.campus import CampusConsumer
from lockmq.testing import run_cli, wait_for

from .helpers import TOKEN, RegistryProcess, gateway, names, request

N = 150


def publish(address: str, prefix: str, start: int, count: int) -> set[str]:
    """``count`` records to ``lock.events`` on one gateway, each acked; their payloads."""
    sent = {f"{prefix}-{i}" for i in range(start, start + count)}
    with Producer(address) as p:
        for fut in [p.send_async("lock.events", s.encode()) for s in sorted(sent)]:
            fut.result(30)
    return sent


def test_a_campus_consumer_joins_a_gateway_that_appears_mid_stream_and_handles_each_record_once(
        tmp_path) -> None:
    reg = RegistryProcess(tmp_path / "reg", ["--evict-after", "2", "--sweep", "0.2"])
    db = str(tmp_path / "effects.db")
    idem = SqliteIdempotency(db, scope="billing")
    idem._conn().execute("CREATE TABLE effects (payload TEXT NOT NULL)")

    def effect(conn: sqlite3.Connection, msg) -> None:   # the effect and its mark commit together
        conn.execute("INSERT INTO effects VALUES (?)", (msg.payload.decode(),))

    def effects() -> list[str]:
        return [r[0] for r in sqlite3.connect(db).execute("SELECT payload FROM effects")]

    with reg, gateway(tmp_path / "a" / "data", reg.address, "gw-a") as gw_a:
        sent = publish(gw_a.address, "a", 0, N)
        wait_for(lambda: names(reg.address, topic="lock.events") == ["gw-a"], "gw-a announced")
        consumer = CampusConsumer(reg.address, topic="lock.events", cluster="billing",
                                  handler=idem.wrap(effect), registry_token=TOKEN,
                                  lookup_every_s=0.2, max_workers=4)
        with consumer:
            assert consumer.gateways == ["gw-a"]
            wait_for(lambda: len(effects()) >= N // 3, "consuming gw-a")
            # a second building's gateway comes up while gw-a's records are consumed
            # a standby announcing the topic is not consumed (it follows a primary's log)
            request(reg.address, "registry.register", name="gw-a-standby",
                    addresses=[gw_a.address], topics=["lock.events"], role="standby")
            seen = consumer.stats["lookups"]
            wait_for(lambda: consumer.stats["lookups"] >= seen + 2, "two lookups")
            assert consumer.gateways == ["gw-a"]
            with gateway(tmp_path / "b" / "data", reg.address, "gw-b") as gw_b:
                sent |= publish(gw_b.address, "b", 0, N)
                sent |= publish(gw_a.address, "a", N, N)
                wait_for(lambda: consumer.gateways == ["gw-a", "gw-b"], "gw-b joined")
                wait_for(lambda: len(effects()) >= len(sent), "every record handled")
            # gw-b stops: the registry evicts it and the consumer leaves it
            wait_for(lambda: consumer.gateways == ["gw-a"], "gw-b left after eviction")
            sent |= publish(gw_a.address, "a", 2 * N, 10)
            wait_for(lambda: len(effects()) >= len(sent), "gw-a still consumed")
        done = effects()
        assert sorted(done) == sorted(sent)        # every record of both gateways, once
        assert len(done) == len(set(done)) == 3 * N + 10
    idem.close()


def test_lockmq_consume_with_registry_reads_every_gateway(tmp_path, capsys) -> None:
    reg = RegistryProcess(tmp_path / "reg")
    with reg, gateway(tmp_path / "a" / "data", reg.address, "gw-a") as gw_a, \
            gateway(tmp_path / "b" / "data", reg.address, "gw-b") as gw_b:
        sent = publish(gw_a.address, "a", 0, 20) | publish(gw_b.address, "b", 0, 20)
        wait_for(lambda: names(reg.address, topic="lock.events") == ["gw-a", "gw-b"],
                 "both gateways announced")
        capsys.readouterr()
        assert run_cli("consume", "lock.events", "--registry", reg.address,
                       "--registry-token", TOKEN, "--count", "40", "--format", "text") == 0
        out = capsys.readouterr().out
        assert {line.split()[-1] for line in out.splitlines() if line.strip()} == sent
