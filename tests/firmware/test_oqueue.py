"""The offline queue and the sequence numbers, under the real MicroPython unix port,
using the compiled .mpy files that ship (lib/lockapp/*.mpy)."""

from __future__ import annotations

import json
import random
import re
import signal
import struct
import subprocess
import time
import zlib

from lockmq.testing.micropython import micropython_env


def _parse(data: bytes) -> list[tuple[int, str, bytes]]:
    """Records of a queue file per its documented format: (end offset, kind, body)."""
    out, off = [], 0
    while off + 4 <= len(data):
        magic, kind, n = struct.unpack_from(">BBH", data, off)
        end = off + 4 + n + 4
        if magic != 0xA5 or end > len(data):
            break
        body = data[off + 4:off + 4 + n]
        if zlib.crc32(data[off + 1:off + 4 + n]) != struct.unpack_from(">I", data, off + 4 + n)[0]:
            break
        out.append((end, chr(kind), body))
        off = end
    return out


def _expected_after(records, cut: int) -> tuple[list[int], int, int]:
    head, dropped, live = 0, 0, []
    for end, kind, body in records:
        if end > cut:
            break
        if kind == "E":
            live.append(struct.unpack(">I", body[:4])[0])
        else:
            head, dropped = struct.unpack(">II", body[:8])
            live = [s for s in live if s >= head]
    return live, head, dropped


def test_append_ack_reload_out_of_order(run_app, tmp_path):
    out = run_app("""
from lockapp.oqueue import OQueue
q = OQueue("q.dat", 16)
for s in range(1, 11):
    q.append(s, b"event-%d" % s)
for s in (1, 2, 3, 4):
    q.ack(s)
print("A", q.seqs())
q.ack(7)              # early ack: 5 and 6 still wait
print("B", q.seqs())
q.ack(5); q.ack(6)
print("C", q.seqs())
q2 = OQueue("q.dat", 16)
print("D", q2.seqs(), q2.head, q2.torn, [d for s, d in q2.read(0, 2)])
try:
    q2.append(10, b"x")
except ValueError:
    print("E refused")
""", tmp_path)
    lines = out.splitlines()
    assert lines[0] == "A [5, 6, 7, 8, 9, 10]"
    assert lines[1] == "B [5, 6, 7, 8, 9, 10]"
    assert lines[2] == "C [8, 9, 10]"
    assert lines[3] == "D [8, 9, 10] 8 0 [b'event-8', b'event-9']"
    assert lines[4] == "E refused"


def test_torn_append_at_every_byte(run_app, tmp_path):
    """A power cut can stop an append after any byte: each prefix of the file loads
    to exactly the records wholly written, and later appends survive a reload."""
    run_app("""
from lockapp.oqueue import OQueue
q = OQueue("full.dat", 6)
for s in range(1, 7):
    q.append(s, b"payload-%d" % s)
q.ack(1); q.ack(2)
q.append(7, b"payload-7")
for s in range(8, 11):
    q.append(s, b"payload-%d" % s)   # queue full: 3, 4 dropped
""", tmp_path)
    data = (tmp_path / "full.dat").read_bytes()
    records = _parse(data)
    assert records and records[-1][0] == len(data), "file does not follow the documented format"
    cuts = list(range(len(data) + 1))
    (tmp_path / "cuts.json").write_text(json.dumps(cuts))
    out = run_app("""
import json
from lockapp.oqueue import OQueue
full = open("full.dat", "rb").read()
for cut in json.load(open("cuts.json")):
    f = open("q.dat", "wb"); f.write(full[:cut]); f.close()
    q = OQueue("q.dat", 6)
    before = list(q.seqs())
    h, d, t = q.head, q.dropped, q.torn
    nxt = max(q.max_seq, q.head) + 1
    q.append(nxt, b"after")
    q2 = OQueue("q.dat", 6)
    print(json.dumps([cut, before, h, d, t, q2.seqs(), q2.torn,
                      q2.read(len(q2) - 1, 1)[0][1] == b"after"]))
""", tmp_path)
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == len(cuts)
    ends = {0} | {r[0] for r in records}
    for cut, before, head, dropped, torn, after, torn2, last_ok in rows:
        live, ehead, edropped = _expected_after(records, cut)
        assert before == live, cut
        assert (head, dropped) == (ehead, edropped), cut
        complete = max(e for e in ends if e <= cut)
        assert torn == cut - complete, cut
        kept = live[1:] if len(live) == 6 else live   # full: the oldest made room
        assert after[:-1] == kept and torn2 == 0 and last_ok, cut
    # the final state: 3 and 4 were dropped (oldest first), counted and persisted
    assert rows[-1][1] == [5, 6, 7, 8, 9, 10] and rows[-1][3] == 2


def test_corrupt_byte_drops_only_the_tail(run_app, tmp_path):
    run_app("""
from lockapp.oqueue import OQueue
q = OQueue("q.dat", 8)
for s in range(1, 5):
    q.append(s, b"0123456789")
""", tmp_path)
    p = tmp_path / "q.dat"
    data = bytearray(p.read_bytes())
    ends = [r[0] for r in _parse(bytes(data))]
    data[ends[2] + 6] ^= 0x40          # inside record 4's body
    p.write_bytes(bytes(data))
    out = run_app("""
from lockapp.oqueue import OQueue
q = OQueue("q.dat", 8)
print(q.seqs(), q.torn)
""", tmp_path)
    assert out.strip() == f"[1, 2, 3] {len(data) - ends[2]}"


def test_bounded_drops_oldest_and_counts(run_app, tmp_path):
    out = run_app("""
from lockapp.oqueue import OQueue
q = OQueue("q.dat", 5)
print([q.append(s, b"e") for s in range(1, 9)])
q2 = OQueue("q.dat", 5)
print(q2.seqs(), q2.dropped)
""", tmp_path)
    assert out.splitlines() == ["[None, None, None, None, None, 1, 2, 3]", "[4, 5, 6, 7, 8] 3"]


def test_compaction_keeps_the_file_small(run_app, tmp_path):
    out = run_app("""
import os
from lockapp.oqueue import OQueue
q = OQueue("q.dat", 64)
biggest = 0
s = 0
for round in range(300):
    for _ in range(3):
        s += 1
        q.append(s, b"x" * 24)
    for seq in list(q.seqs())[:2]:
        q.ack(seq)
    biggest = max(biggest, os.stat("q.dat")[6])
print(len(q), biggest, os.stat("q.dat")[6])
q2 = OQueue("q.dat", 64)
print(q2.seqs() == q.seqs(), q2.dropped, q2.torn)
""", tmp_path, timeout=120)
    live, dropped, s = [], 0, 0          # the model: drop the oldest when full
    for _ in range(300):
        for _ in range(3):
            s += 1
            if len(live) >= 64:
                live.pop(0)
                dropped += 1
            live.append(s)
        del live[:2]
    first, second = out.splitlines()
    n, biggest, _size = map(int, first.split())
    assert n == len(live) and dropped > 0
    assert biggest < 64 * 48 + 3 * 4096   # never grows without bound
    assert second == f"True {dropped} 0"


def test_seq_never_reused_across_restarts(run_app, tmp_path):
    script = """
import os
from lockapp.seqno import SeqNo
s = SeqNo("seq.dat", 4)
if not s.ok:
    s.confirm(1)          # a fresh board, once the broker has answered
print([s.take() for _ in range(3)])
"""
    runs = [run_app(script, tmp_path).strip() for _ in range(3)]
    assert runs == ["[1, 2, 3]", "[5, 6, 7]", "[9, 10, 11]"]
    # one damaged copy: the other still holds the reservation
    (tmp_path / "seq.dat").write_bytes(b"garbage!")
    assert run_app(script, tmp_path).strip() == "[13, 14, 15]"


def test_provisional_seqs_are_not_persisted_until_confirmed(run_app, tmp_path):
    out = run_app("""
import os
from lockapp.seqno import SeqNo
from lockapp.oqueue import OQueue
s = SeqNo("seq.dat", 4)
q = OQueue("q.dat", 16)
for _ in range(3):
    q.append(s.take(), b"offline")
print(s.ok, "seq.dat" in os.listdir("."), q.seqs())
q.renumber(501)                       # the broker had 500 from before a reflash
s.confirm(q.max_seq + 1)
q2 = OQueue("q.dat", 16)
print(q2.seqs(), [d for _, d in q2.read(0, 3)], s.take(), SeqNo("seq.dat", 4).next)
""", tmp_path)
    assert out.splitlines() == [
        "False False [1, 2, 3]",
        "[501, 502, 503] [b'offline', b'offline', b'offline'] 504 508",
    ]


def _run_report(out: bytes, loaded: list[int]) -> tuple[list[int], list[int], int | None]:
    """What one run of the kill9 writer reported: (queued, acked, ack in progress).

    Only lines whose newline was written count: that print returned, so the work it
    reports is done; a line cut by the kill is left out (an append whose "Q" was cut
    shows up at the next load as one extra seq; an ack whose "A" was cut stays "in
    progress"). The output must be whole: the writer's seqs are consecutive and it
    acks its queue in order (the loaded seqs, then its own), each "T" followed by its
    "A". A chunk of output lost by the reader would otherwise pass for events lost on
    flash (the cause of a flaky failure: readline() buffered output that
    communicate() then bypassed)."""
    lines = out.decode().split("\n")[:-1]     # the last piece has no newline
    queued: list[int] = []
    acked: list[int] = []
    trying = None
    for line in lines:
        assert re.fullmatch(r"[QTA] \d+", line), out[-400:]   # e.g. a traceback
        kind, seq = line[0], int(line[2:])
        if kind == "Q":
            assert trying is None and (not queued or seq == queued[-1] + 1), (line, queued[-1:])
            queued.append(seq)
        elif kind == "T":
            order = loaded + queued
            assert trying is None and seq == order[len(acked)], (line, order[len(acked):][:1])
            trying = seq
        else:
            assert kind == "A" and seq == trying, (line, trying)
            acked.append(seq)
            trying = None
    return queued, acked, trying


def test_kill9_during_appends_and_acks(firmware_interp, app_lib, tmp_path):
    """SIGKILL the interpreter at random instants while it appends and acks: what it
    reported queued and not acked is there after restart; nothing comes back twice;
    no sequence number is ever handed out twice; the loader reads exactly what the
    documented format says is on flash (a copy of q.dat before each restart is kept
    in tmp_path for a post-mortem)."""
    script = (tmp_path / "work.py")
    script.write_text("""
from lockapp.oqueue import OQueue
from lockapp.seqno import SeqNo
q = OQueue("q.dat", 1000)
s = SeqNo("seq.dat", 8)
s.raise_floor(max(q.max_seq, q.head) + 1)
if not s.ok:
    s.confirm(1)
print("L", " ".join(str(x) for x in q.seqs()))
n = 0
while True:
    seq = s.take()
    q.append(seq, b"evt")
    print("Q %d" % seq)
    n += 1
    if n % 3 == 0 or len(q) > 50:     # stays far below the bound: no drops
        a = q.seqs()[0]
        print("T %d" % a)
        q.ack(a)
        print("A %d" % a)
""")
    rng = random.Random(5)
    home = tmp_path / "home"
    home.mkdir()
    queued: set[int] = set()      # reported queued ("Q" printed after append returned)
    acked: set[int] = set()       # reported acked
    trying: set[int] = set()      # an ack in progress at the kill
    taken: list[int] = []         # every seq ever seen handed out
    for round_ in range(12):
        flash = tmp_path / "q.dat"
        saved = tmp_path / f"q.before-round-{round_}.dat"
        data = flash.read_bytes() if flash.exists() else b""
        saved.write_bytes(data)
        on_flash, _head, _dropped = _expected_after(_parse(data), len(data))
        proc = subprocess.Popen([firmware_interp.exe, "-X", "heapsize=256K", "work.py"], cwd=tmp_path,
                                env=micropython_env(app_lib, home),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            first = proc.stdout.readline().decode()
            assert first.startswith("L"), first
            loaded = [int(x) for x in first.split()[1:]]
            assert loaded == on_flash, (round_, saved)
            assert loaded == sorted(set(loaded))
            assert set(loaded) >= queued - acked - trying, (round_, sorted(queued - acked - trying - set(loaded)), saved)
            assert not set(loaded) & acked
            extra = set(loaded) - queued          # an append cut before its "Q" line
            assert len(extra) <= 1 and all(x > max(taken, default=0) for x in extra)
            taken += sorted(extra)
            queued |= extra
            acked |= trying - set(loaded)
            early = [proc.stdout.readline() for _ in range(5)]   # it is running: now cut at random
            time.sleep(rng.uniform(0.0, 0.2))
            proc.send_signal(signal.SIGKILL)
            # the rest through the same buffered reader: communicate() would read the
            # pipe directly and lose what readline() had buffered
            out = b"".join(early) + proc.stdout.read()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        run_queued, run_acked, run_trying = _run_report(out, loaded)
        queued |= set(run_queued)
        taken += run_queued
        acked |= set(run_acked)
        trying = {run_trying} if run_trying is not None else set()
    assert len(taken) > 20, "the writer made too little progress to test anything"
    assert len(taken) == len(set(taken)), "a sequence number was reused"
    assert taken == sorted(taken)


def test_full_queue_offline_stays_bounded_on_flash(run_app, tmp_path):
    """Offline for days with the queue full: every new event drops the oldest; the
    file must not grow with the drops."""
    out = run_app("""
import os
from lockapp.oqueue import OQueue
q = OQueue("q.dat", 32)
biggest = 0
for s in range(1, 3001):
    q.append(s, b"y" * 14)
    biggest = max(biggest, os.stat("q.dat")[6])
q2 = OQueue("q.dat", 32)
print(biggest, q2.seqs()[0], q2.seqs()[-1], q2.dropped, q2.torn)
""", tmp_path, timeout=120)
    biggest, first, last, dropped, torn = map(int, out.split())
    assert (first, last, dropped, torn) == (2969, 3000, 2968, 0)
    assert biggest < 32 * 42 + 2 * 4096 + 64


def test_reads_follow_a_model_through_acks_drops_and_compaction(run_app, tmp_path):
    # The queue keeps only the oldest live record's offset and walks the file for the
    # rest: every read, after every kind of removal, must give back exactly the live
    # entries and their data, in order, also after a reload.
    rnd = random.Random(13)
    ops = []
    live, acked, nxt, cap = [], set(), 1, 24
    for _ in range(600):
        r = rnd.random()
        if r < 0.55:
            ops.append(["a", nxt])
            live.append(nxt)
            if len(live) > cap:
                acked.discard(live.pop(0))
            nxt += rnd.choice((1, 1, 1, 5))
        elif live:
            s = rnd.choice(live[:4])
            ops.append(["k", s])
            acked.add(s)
            while live and live[0] in acked:
                acked.discard(live.pop(0))
        if rnd.random() < 0.1:
            ops.append(["r", 0])
            acked.clear()   # early acks are kept in RAM only: after a reboot they wait again
    script = """
import json
from lockapp.oqueue import OQueue
ops = json.loads(%r)
q = OQueue("q.dat", %d)
for op, s in ops:
    if op == "a":
        q.append(s, b"d%%d-" %% s + b"x" * (s %% 97))
    elif op == "k":
        q.ack(s)
    else:
        q = OQueue("q.dat", %d)
    got = q.read(0, len(q))
    assert [e[0] for e in got] == q.seqs(), (op, s)
    for seq, data in got:
        assert data == b"d%%d-" %% seq + b"x" * (seq %% 97), seq
        assert q.get(seq) == data
print("S", q.seqs(), q.file_bytes())
""" % (json.dumps(ops), cap, cap)
    out = run_app(script, tmp_path)
    m = re.search(r"^S (\[.*\]) (\d+)$", out, re.M)
    assert m, out
    assert json.loads(m.group(1)) == live
    assert int(m.group(2)) < 3 * 4096   # compacted along the way
