"""Time-based segment roll (``segment_ms``) on the store's clock, and "forever" limits."""

from __future__ import annotations

import pytest

from lockmq.clock import ManualClock
from lockmq.config import ConfigError, config_from_dict
from lockmq.store import Store, StoreConfig

from .helpers import config, rec, run

HOUR = 3600 * 1000
DAY = 24 * HOUR


def _open(data_dir, clock, **kw):
    kw.setdefault("segment_bytes", 1 << 20)   # far away: only age rolls here
    return Store.open(config(data_dir, segment_ms=HOUR, retention_ms=DAY, **kw), clock)


def test_a_write_after_segment_ms_starts_a_new_segment(data_dir):
    clock = ManualClock(1_700_000_000_000)

    async def main():
        s = _open(data_dir, clock)
        await s.append([rec("t", "S", 0)])
        clock.advance(HOUR - 1)
        await s.append([rec("t", "S", 1)])          # not old yet: same segment
        assert len(s._segments) == 1
        clock.advance(1)
        res = await s.append([rec("t", "S", 2)])
        assert len(s._segments) == 2 and s._segments.active.base == res[0].offset
        assert s.stats["time_rolls"] == 1
        got = s.read("t", 0, 10)
        assert [r.seq for r in got] == [0, 1, 2]
        assert got[2].broker_ts_us == (1_700_000_000_000 + HOUR) * 1000   # the clock's time
        await s.close()
    run(main())


def test_a_quiet_segment_is_closed_without_new_writes_and_then_retained(data_dir):
    clock = ManualClock(1_700_000_000_000)

    async def main():
        s = _open(data_dir, clock)
        assert not await s.roll_if_old()                  # empty: nothing to close
        clock.advance(2 * HOUR)
        assert not await s.roll_if_old()
        await s.append([rec("t", "S", k) for k in range(5)])
        written_at = clock.wall_ms()
        clock.advance(HOUR - 1)
        assert not await s.roll_if_old()                  # not old yet
        clock.advance(1)
        assert await s.roll_if_old()                      # no write came: closed anyway
        assert len(s._segments) == 2 and s.log_end == s._segments.active.base
        assert s._segments[0].mtime_ms() == pytest.approx(written_at, abs=1)
        assert not await s.roll_if_old()                  # the new one is empty
        await s.close()
        # the age survives a restart (the closed file's mtime is on the clock)
        s = _open(data_dir, clock)
        clock.advance(DAY - HOUR - 1)
        assert s.enforce_retention({}).deleted_segments == []
        clock.advance(2)
        rep = s.enforce_retention({"t": 0})
        assert rep.deleted_segments == [0] and rep.skipped_records == {"t": 5}
        assert s.queue_start("t") == s.queue_end("t") == 5
        res = await s.append([rec("t", "S", 5)])
        assert res[0].queue_offset == 5
        await s.close()
    run(main())


def test_segment_ms_counts_from_the_first_record_also_after_a_restart(data_dir):
    clock = ManualClock(1_700_000_000_000)

    async def main():
        s = _open(data_dir, clock)
        await s.append([rec("t", "S", 0)])
        await s.close()
        clock.advance(HOUR)
        s = _open(data_dir, clock)
        assert await s.roll_if_old()
        await s.close()
    run(main())


def test_size_only_roll_with_segment_ms_minus_one(data_dir):
    clock = ManualClock(1_700_000_000_000)

    async def main():
        s = Store.open(config(data_dir, segment_ms=-1), clock)
        await s.append([rec("t", "S", 0)])
        clock.advance(365 * DAY)
        assert not await s.roll_if_old()
        await s.append([rec("t", "S", 1)])
        assert len(s._segments) == 1
        await s.close()
    run(main())


def test_forever_is_minus_one_in_toml_and_zero_is_refused():
    cfg = config_from_dict({"store": {"retention_ms": -1, "retention_bytes": -1,
                                      "segment_ms": -1}})
    sc = cfg.store_config()
    assert [sc.limit(k) for k in ("retention_ms", "retention_bytes", "segment_ms")] == \
        [None, None, None]
    assert StoreConfig().limit("segment_ms") == DAY
    for key in ("retention_ms", "retention_bytes", "segment_ms"):
        for bad in (0, -2):
            with pytest.raises(ConfigError, match=f"store.{key} .*-1 for no limit"):
                config_from_dict({"store": {key: bad}})
