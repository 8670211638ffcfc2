"""The store writer's compiled parts against their Python ones: its loop
(``_core.plan_run``), its one-call commit (``commit_write``) and the dedup
table's in-order adds (``dedup_run``).

The same appends -- several topics, producers, duplicates, sequences out of order,
system ids, small segments that roll -- must give the same results, the same log
and the same reads with the compiled parts and without them (the compiled variant
is skipped, with the reason, when ``lockmq._core`` was not built).
"""
from __future__ import annotations

import asyncio
import os
import tempfile

from hypothesis import given, settings, strategies as st

from lockmq.clock import ManualClock
from lockmq.store import NewRecord, Store, StoreConfig, dedup, writer
from lockmq.store.dedup import DedupTable

from .helpers import NOT_BUILT, SPEEDUPS


_rec = st.tuples(st.sampled_from(["locks", "alarms", "$devices"]),
                 st.sampled_from(["LK-1", "LK-2", "$broker"]), st.integers(0, 40),
                 st.integers(0, 200))
_calls = st.lists(st.lists(_rec, min_size=1, max_size=12), min_size=1, max_size=8)


def _copy(text: str) -> str:
    """An equal str that is another object (as the broker's decoder makes per read)."""
    return (text + "!")[:-1]


def _store_run(calls: list, speedups) -> tuple:
    """Append ``calls`` (pairs of calls at once: one group commit may hold several)
    with the writer's and dedup table's compiled parts from ``speedups`` (None: the
    Python ones); the results, the reads, the files, their bytes, the dedup table."""
    saved = writer._plan_run, writer._plan_calls, writer._commit_write, dedup._dedup_run
    writer._plan_run = speedups and speedups.plan_run
    writer._plan_calls = speedups and speedups.plan_calls
    writer._commit_write = speedups and speedups.commit_write
    dedup._dedup_run = speedups and speedups.dedup_run
    try:
        with tempfile.TemporaryDirectory() as d:
            async def main() -> tuple:
                s = Store.open(StoreConfig(data_dir=d, segment_bytes=1024, min_free_bytes=0),
                               ManualClock(1_700_000_000_000))   # the same record bytes
                res = []
                for i in range(0, len(calls), 2):
                    got = await asyncio.gather(*(
                        s.append([NewRecord(_copy(t) if seq % 2 else t, sn, seq, 7, b"p" * size)
                                  for t, sn, seq, size in call]) for call in calls[i:i + 2]))
                    res.extend(got)
                reads = {t: [(r.offset, r.queue_offset, r.sn, r.seq, r.payload)
                             for r in s.read(t, 0, 10_000)] for t in s.topics()}
                table = s._dedup.items()
                await s.close()
                return res, reads, table
            res, reads, table = asyncio.run(main())
            files = {}
            for root, _dirs, names in os.walk(d):
                for name in names:
                    if name.endswith(".qstart"):   # lists topics made by calls still
                        files[name] = None          # queued: timing, not the loop's work
                    elif name.startswith(("offset-", "0")):   # indexes and log segments
                        with open(os.path.join(root, name), "rb") as f:
                            files[name] = f.read()
            return res, reads, table, files
    finally:
        writer._plan_run, writer._plan_calls, writer._commit_write, dedup._dedup_run = saved


@NOT_BUILT   # (then the writer runs its Python loop only)
@settings(max_examples=40, deadline=None)
@given(_calls)
def test_compiled_writer_loop_stores_what_the_python_one_does(calls: list) -> None:
    assert _store_run(calls, SPEEDUPS) == _store_run(calls, None)


class _AskOnce:
    """The writer's compiled loops, recording where plan_calls stopped and where
    plan_run was asked to start: a record plan_calls refused goes to Python, not
    to plan_run (the same check on the same state) first."""

    def __init__(self) -> None:
        self.refused: list[tuple[list, int]] = []   # (the call's records, index)
        self.asked_again: list[int] = []
        self.commit_write = SPEEDUPS.commit_write
        self.dedup_run = SPEEDUPS.dedup_run

    def plan_calls(self, batch, k, *rest):
        got = SPEEDUPS.plan_calls(batch, k, *rest)
        if got[0] < len(batch):
            self.refused.append((batch[got[0]][0], got[1]))   # (held: ids stay unique)
        return got

    def plan_run(self, records, enc, i, *rest):
        if any(r is records and j == i for r, j in self.refused):
            self.asked_again.append(i)
        return SPEEDUPS.plan_run(records, enc, i, *rest)


@NOT_BUILT
def test_a_record_plan_calls_refused_is_not_offered_to_plan_run() -> None:
    # one group commit: the second call repeats seq 3 (a duplicate within the batch)
    # and then goes on in order; the third switches topic after its first record
    calls = [[("locks", "LK-1", s, 20) for s in range(6)],
             [("locks", "LK-1", s, 20) for s in (3, 6, 7, 8)],
             [("locks", "LK-2", 1, 20), ("alarms", "LK-2", 2, 20), ("alarms", "LK-2", 3, 20)]]
    spy = _AskOnce()
    res, reads, _table, _files = _store_run(calls, spy)
    assert spy.refused, "plan_calls refused no record: the case no longer tests anything"
    assert spy.asked_again == []
    assert [a.duplicate for a in res[1]] == [True, False, False, False]
    assert [r[3] for r in reads["locks"]] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 1]


def test_python_writer_loop_still_dedups_and_rolls() -> None:
    calls = [[("locks", "LK-1", s, 100) for s in range(12)],
             [("locks", "LK-1", 3, 100), ("alarms", "LK-2", 1, 10), ("locks", "LK-1", 12, 10)]]
    res, reads, _table, files = _store_run(calls, None)
    assert [a.duplicate for a in res[1]] == [True, False, False]
    assert [r[3] for r in reads["locks"]] == list(range(13))
    assert len([f for f in files if f.endswith(".log") and f[0] == "0"]) > 1


# runs of one lock in order (the common case), broken by other locks, repeats, gaps,
# old sequences, new locks (evicting the oldest) and a system id
_id_runs = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "$x"]),
                              st.integers(0, 60), st.integers(1, 12)), max_size=30)


@NOT_BUILT
@settings(max_examples=200, deadline=None)
@given(_id_runs, st.integers(1, 10), st.integers(1, 4))
def test_compiled_dedup_adds_keep_what_the_python_ones_do(runs: list, window: int,
                                                          max_sns: int) -> None:
    ids = [(sn, start + k) for sn, start, n in runs for k in range(n)]
    one = DedupTable(window, max_sns)
    many = DedupTable(window, max_sns)
    for sn, seq in ids:   # the reference: one add() each
        one.add(sn, seq)
    saved = dedup._dedup_run
    dedup._dedup_run = SPEEDUPS.dedup_run
    try:
        many.add_many(ids)
    finally:
        dedup._dedup_run = saved
    assert many.items() == one.items() and many.evicted == one.evicted


@NOT_BUILT
def test_commit_write_writes_every_part_and_reports_os_errors(tmp_path) -> None:
    """Many parts (joined into one write), one part, none, index entries beside
    them, and a bad descriptor: an OSError with its errno, not a crash or a silent
    success."""
    import errno
    log_path, idx_path = tmp_path / "log", tmp_path / "idx"
    parts = [bytes([i % 251]) * (i % 7) for i in range(3000)]
    with open(log_path, "wb") as log, open(idx_path, "wb") as idx:
        SPEEDUPS.commit_write([(idx.fileno(), bytearray(b"E" * 32), 16)], log.fileno(),
                              parts, 5, True)
        end = 5 + sum(map(len, parts))
        SPEEDUPS.commit_write([], log.fileno(), [b"one"], end, False)
        SPEEDUPS.commit_write([(idx.fileno(), b"F" * 16, 48)], log.fileno(), [], end + 3,
                              True)
    assert log_path.read_bytes() == b"\0" * 5 + b"".join(parts) + b"one"
    assert idx_path.read_bytes() == b"\0" * 16 + b"E" * 32 + b"F" * 16
    with open(log_path, "rb") as ro:   # read-only: the write fails with EBADF
        try:
            SPEEDUPS.commit_write([], ro.fileno(), [b"x"], 0, True)
        except OSError as exc:
            assert exc.errno == errno.EBADF
        else:
            raise AssertionError("commit_write on a read-only descriptor succeeded")


_SHORT_WRITE = """
import os, resource, signal, sys
from lockmq import _core
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # past the limit: EFBIG, not a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
try:
    _core.commit_write([], fd, [b"a" * 60, b"b" * 60], 0, True)
except OSError as exc:
    print(exc.errno)
else:
    print("no error")
"""


@NOT_BUILT
def test_commit_write_goes_on_after_a_short_write(tmp_path) -> None:
    """A write the file-size limit cuts short (the kernel writes up to the limit and
    returns the count) is continued: the next write meets the limit and fails with
    EFBIG. A writer that took the short count for the whole would report success."""
    import errno
    import subprocess
    import sys
    path = tmp_path / "log"
    out = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(path)], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == str(errno.EFBIG)
    assert path.read_bytes() == b"a" * 60 + b"b" * 40
