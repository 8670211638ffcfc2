"""Steady time (lockmq.clock): what every judged duration is measured on."""

from __future__ import annotations

import json
import zlib

from lockmq.clock import STEP_MS, ManualClock, SystemClock
from lockmq.store import Store

from .helpers import config, rec, run


def test_steady_time_continues_across_a_restart_on_the_same_boot(tmp_path):
    path = str(tmp_path / "clock")
    a = SystemClock()
    a.save(path)
    saved = json.loads(open(path, "rb").read()[:-4])
    b = SystemClock()
    assert "same boot" in b.restore(path)
    assert abs(b.steady_ms() - a.steady_ms()) < 1000
    # saved "a week ahead" (the wall clock was a week behind when it was written, or
    # stepped back while the broker was down): the same boot continues the saved time
    week = 7 * 86400_000
    body = json.dumps(dict(saved, steady_ms=saved["steady_ms"] + week)).encode()
    with open(path, "wb") as f:
        f.write(body + zlib.crc32(body).to_bytes(4, "little"))
    c = SystemClock()
    c.restore(path)
    assert c.steady_ms() - c.wall_ms() > week - 1000
    # a damaged file is ignored: steady time starts at the wall clock
    with open(path, "wb") as f:
        f.write(body + b"xxxx")
    d = SystemClock()
    assert "no saved" in d.restore(path)


def test_a_step_is_seen_once_and_moves_no_steady_time():
    c = ManualClock(1_000_000.0)
    assert c.check_step() is None
    c.step(8 * 86400_000)
    assert c.steady_ms() == 1_000_000.0
    assert c.check_step() == 8 * 86400_000 and c.check_step() is None
    c.step(-STEP_MS / 2)
    assert c.check_step() is None            # a small correction is no step
    c.step(-3600_000)
    assert c.check_step() < 0 and c.steps == 2


def test_retention_ages_on_steady_time(data_dir):
    clock = ManualClock()

    async def main():
        s = Store.open(config(data_dir, segment_bytes=1024, retention_ms=60_000), clock)
        for i in range(60):
            await s.append([rec("t", "A", i)])
        assert len(s._segments) > 2
        clock.step(8 * 86400_000)            # the wall clock jumps: nothing is old
        assert not s.enforce_retention().deleted_segments
        clock.advance(61_000)                # time really passes: the old ones go
        assert s.enforce_retention().deleted_segments
        await s.close()
    run(main())
