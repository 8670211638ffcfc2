"""Which ``(sn, seq)`` message ids are already stored: bounded, snapshot-able.

Per lock (SN) the table keeps the highest stored sequence ``hw`` and a bit set
``gaps`` of the sequences in ``[hw - window, hw)`` that are *not* stored (bit ``i``
is ``hw - 1 - i``). A lock sending in order therefore costs one small tuple.
A sequence more than ``window`` below ``hw`` counts as a duplicate. SNs are kept in
least-recently-written order and the oldest is forgotten beyond ``max_sns``.
Sequence numbers are compared as plain integers (no wrap-around at 2**32).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Iterable

_ENTRY = struct.Struct("<BIH")  # sn_len, hw, gaps_len (then sn, gaps bytes)


class DedupTable:
    """In-memory dedup table; see the module docstring for the rules."""

    def __init__(self, window: int, max_sns: int) -> None:
        self.window = window
        self.max_sns = max_sns
        self._mask = (1 << window) - 1
        self._t: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._t)

    def contains(self, sn: str, seq: int) -> bool:
        """True if ``(sn, seq)`` counts as already stored."""
        e = self._t.get(sn)
        if e is None:
            return False
        hw, gaps = e
        if seq > hw:
            return False
        d = hw - seq
        if d == 0 or d > self.window:
            return True
        return not (gaps >> (d - 1)) & 1

    def add(self, sn: str, seq: int) -> None:
        """Record that ``(sn, seq)`` is stored."""
        t = self._t
        e = t.get(sn)
        if e is None:
            t[sn] = (seq, self._mask)
            if len(t) > self.max_sns:
                t.popitem(last=False)
                self.evicted += 1
            return
        hw, gaps = e
        if seq > hw:
            k = seq - hw
            if k > self.window:
                gaps = self._mask
            else:
                gaps = ((gaps << k) | ((1 << (k - 1)) - 1)) & self._mask
            t[sn] = (seq, gaps)
        elif seq < hw:
            d = hw - seq
            if d <= self.window:
                t[sn] = (hw, gaps & ~(1 << (d - 1)))
        t.move_to_end(sn)

    def last_seq(self, sn: str) -> int | None:
        """Highest stored sequence of ``sn``, or None if the SN is not remembered."""
        e = self._t.get(sn)
        return None if e is None else e[0]

    def items(self) -> list[tuple[str, tuple[int, int]]]:
        """A copy of the entries, least recently written first (cheap to take)."""
        return list(self._t.items())

    @staticmethod
    def encode(items: Iterable[tuple[str, tuple[int, int]]]) -> bytes:
        """Serialise entries as returned by :meth:`items`."""
        out = []
        pack = _ENTRY.pack
        for sn, (hw, gaps) in items:
            sn_b = sn.encode("ascii")
            g = gaps.to_bytes((gaps.bit_length() + 7) // 8, "little") if gaps else b""
            out.append(pack(len(sn_b), hw, len(g)))
            out.append(sn_b)
            out.append(g)
        return b"".join(out)

    def load(self, data: bytes | memoryview) -> None:
        """Replace the table's contents with entries serialised by :meth:`encode`."""
        t: OrderedDict[str, tuple[int, int]] = OrderedDict()
        pos, end = 0, len(data)
        unpack = _ENTRY.unpack_from
        while pos < end:
            slen, hw, glen = unpack(data, pos)
            pos += _ENTRY.size
            sn = bytes(data[pos:pos + slen]).decode("ascii")
            pos += slen
            gaps = int.from_bytes(data[pos:pos + glen], "little") & self._mask
            pos += glen
            t[sn] = (hw, gaps)
        while len(t) > self.max_sns:
            t.popitem(last=False)
        self._t = t
