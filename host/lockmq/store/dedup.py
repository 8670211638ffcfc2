"""Which ``(sn, seq)`` message ids are already stored: bounded, snapshot-able.

Per lock (SN) the table keeps the highest stored sequence ``hw``, how many of the
sequences just below it it knows about (``known``, at most ``window``) and a bit set
``gaps`` of the known ones that are *not* stored (bit ``i`` is ``hw - 1 - i``):

* ``seq > hw``: new;  ``seq == hw``: duplicate;
* ``hw - known <= seq < hw``: duplicate unless its gap bit is set;
* ``hw - window <= seq < hw - known``: never seen by this table: new;
* ``seq < hw - window``: too old to track: new (stored). The broker never answers
  DUPLICATE for a record it cannot show it stored (SPEC 2, "Sequence numbers"): a
  lock's records below a poisoned or far-ahead ``hw`` are stored, not acked and lost;
  a true repeat that old is left to the consumers' idempotency (message id).

A lock sending in order costs one small tuple ``(hw, known, 0)``. SNs are kept in
least-recently-written order and the oldest is forgotten beyond ``max_sns``.
Sequence numbers are compared as plain integers (no wrap-around at 2**32).

System ids (``$...``, :func:`is_system_sn`: the broker's own records, retries, dead
letters) are never deduplicated -- the store writes them whatever the table says --
and the table only remembers their *last written* sequence (so the broker can go on
numbering after a restart, and a wrapped or stray high value cannot stick).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Iterable

from lockmq import accel

#: the compiled in-order loop of :meth:`DedupTable.add_many` (lockmq._core), or None
_dedup_run = accel.speedups.dedup_run if accel.COMPILED else None
_ENTRY = struct.Struct("<BIHH")  # sn_len, hw, known, gaps_len (then sn, gaps bytes)
#: SNs starting with this are the broker's (reserved: no client may publish under one).
SYSTEM_SN_PREFIX = "$"


def is_system_sn(sn: str) -> bool:
    """True for the broker's own producer ids, which skip dedup."""
    return sn[:1] == SYSTEM_SN_PREFIX


class DedupTable:
    """In-memory dedup table; see the module docstring for the rules."""

    def __init__(self, window: int, max_sns: int) -> None:
        self.window = window
        self.max_sns = max_sns
        self._t: OrderedDict[str, tuple[int, int, int]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._t)

    def contains(self, sn: str, seq: int) -> bool:
        """True if ``(sn, seq)`` counts as already stored (never for a system id)."""
        e = self._t.get(sn)
        if e is None or sn[:1] == SYSTEM_SN_PREFIX:
            return False
        hw, known, gaps = e
        if seq >= hw:
            return seq == hw
        d = hw - seq
        if d > known:          # (beyond the window too: not known to be stored)
            return False
        return not (gaps >> (d - 1)) & 1

    def add(self, sn: str, seq: int) -> None:
        """Record that ``(sn, seq)`` is stored."""
        t = self._t
        e = t.get(sn)
        if e is None:
            t[sn] = (seq, 0, 0)
            if len(t) > self.max_sns:
                t.popitem(last=False)
                self.evicted += 1
            return
        hw, known, gaps = e
        w = self.window
        if seq == hw + 1:
            if gaps:
                gaps = (gaps << 1) & ((1 << w) - 1)
            t[sn] = (seq, known + 1 if known < w else w, gaps)
        elif seq > hw:
            k = seq - hw
            known = min(w, known + k)
            gaps = ((gaps << k) | ((1 << (k - 1)) - 1)) & ((1 << known) - 1)
            t[sn] = (seq, known, gaps)
        elif seq < hw:
            if sn[:1] == SYSTEM_SN_PREFIX:   # system ids: the last written, not the highest
                t[sn] = (seq, 0, 0)
                t.move_to_end(sn)
                return
            d = hw - seq
            if d <= w:
                if d > known:  # sequences between the known ones and seq: not stored
                    gaps |= ((1 << (d - 1)) - 1) & ~((1 << known) - 1)
                    known = d
                else:
                    gaps &= ~(1 << (d - 1))
                t[sn] = (hw, known, gaps)
        t.move_to_end(sn)

    def add_many(self, ids: Iterable[tuple[str, int]]) -> None:
        """:meth:`add` each ``(sn, seq)`` of ``ids`` in order.

        A lock sending in order (``seq == hw + 1``, no gaps) takes a short path: a
        group commit adds hundreds of ids, one method call each was a measurable
        part of the append cost. Compiled (``_core.dedup_run``), a run of one
        lock's in-order ids is one table update; otherwise an inline Python loop.
        """
        t = self._t
        w = self.window
        add = self.add
        run = _dedup_run
        if run is not None and type(ids) is list:
            # C: runs of one lock's in-order ids, one table update per run
            i, n = 0, len(ids)
            while i < n:
                i = run(t, ids, i, w)
                if i < n:
                    add(*ids[i])
                    i += 1
            return
        get = t.get
        move = t.move_to_end
        for sn, seq in ids:
            e = get(sn)
            if e is not None and seq == e[0] + 1 and not e[2]:
                known = e[1]
                t[sn] = (seq, known + 1 if known < w else w, 0)
                move(sn)
            else:
                add(sn, seq)

    def high_water(self) -> dict[str, tuple[int, int, int]]:
        """The live ``{sn: (hw, known, gaps)}`` map, for a fast pre-check before
        :meth:`contains`: a ``seq`` above ``hw`` (or an unknown SN) is always new.
        Read-only for callers."""
        return self._t

    def last_seq(self, sn: str) -> int | None:
        """Highest stored sequence of ``sn``, or None if the SN is not remembered."""
        e = self._t.get(sn)
        return None if e is None else e[0]

    def items(self) -> list[tuple[str, tuple[int, int, int]]]:
        """A copy of the entries, least recently written first (cheap to take)."""
        return list(self._t.items())

    @staticmethod
    def encode(items: Iterable[tuple[str, tuple[int, int, int]]]) -> bytes:
        """Serialise entries as returned by :meth:`items`."""
        out = []
        pack = _ENTRY.pack
        append = out.append
        for sn, (hw, known, gaps) in items:
            sn_b = sn.encode("ascii")
            if gaps:
                g = gaps.to_bytes((gaps.bit_length() + 7) // 8, "little")
                append(pack(len(sn_b), hw, known, len(g)) + sn_b + g)
            else:
                append(pack(len(sn_b), hw, known, 0) + sn_b)
        return b"".join(out)

    def load(self, data: bytes | memoryview) -> None:
        """Replace the table's contents with entries serialised by :meth:`encode`."""
        t: OrderedDict[str, tuple[int, int, int]] = OrderedDict()
        pos, end = 0, len(data)
        unpack = _ENTRY.unpack_from
        w = self.window
        mask = (1 << w) - 1
        while pos < end:
            slen, hw, known, glen = unpack(data, pos)
            pos += _ENTRY.size
            sn = bytes(data[pos:pos + slen]).decode("ascii")
            pos += slen
            gaps = int.from_bytes(data[pos:pos + glen], "little") & mask
            pos += glen
            t[sn] = (hw, min(known, w), gaps)
        while len(t) > self.max_sns:
            t.popitem(last=False)
        self._t = t
