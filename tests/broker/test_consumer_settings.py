"""Each consumer setting has one owner: ``[consumers]`` (lockmq.config.ConsumersSection).
The clusters read that section itself (no copy to keep in step), a reload's list of
live settings derives from its fields, and RocketMQ's delay levels are one table --
the retry backoff's default and the client's delay-level shorthand alike."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import lockmq
from lockmq.broker import reload
from lockmq.broker.core import BrokerCore
from lockmq.broker.logs import Stats
from lockmq.client import scheduled
from lockmq.config import ROCKETMQ_LEVELS_S, Config, ConsumersSection

HOST = Path(lockmq.__file__).resolve().parent


def test_one_default_for_the_retry_levels() -> None:
    assert ConsumersSection().retry_levels_s == list(ROCKETMQ_LEVELS_S)
    assert scheduled.DELAY_LEVELS_S is ROCKETMQ_LEVELS_S
    assert scheduled.level_delay_ms(1) == 1000 and scheduled.level_delay_ms(18) == 7_200_000
    # no other copy of the table in the code (its tail, 20m 30m 1h 2h, is distinctive)
    copies = [str(p.relative_to(HOST.parent)) for p in sorted(HOST.parent.rglob("*.py"))
              if "1200, 1800, 3600, 7200" in p.read_text()]
    assert copies == ["lockmq/config_base.py"]


def test_the_clusters_read_the_consumers_section_itself() -> None:
    config = Config()
    core = BrokerCore(config, lambda *a, **k: None, Stats())   # type: ignore[arg-type]
    assert core.settings is config.consumers
    c = config.consumers
    c.retry_levels_s, c.time_scale = [0.5, 2.0], 0.1
    assert [c.retry_delay_ms(n) for n in (1, 2, 3)] == [50.0, 200.0, 200.0]
    assert c.level_for_delay(100) == 1


def test_a_reloads_live_consumer_settings_derive_from_the_section() -> None:
    fields = {f.name for f in dataclasses.fields(ConsumersSection)}
    restart = {f.name for f in dataclasses.fields(ConsumersSection) if f.metadata.get("restart")}
    assert restart == {"lease_sweep_ms"}
    assert reload.LIVE["consumers"] == fields - restart
