# The offline queue: every event is appended here (and flushed) BEFORE it is sent,
# and removed only after the broker's ack. One append-only file of records:
#
#   off size
#     0   1  magic 0xA5
#     1   1  kind  'E' event | 'H' head
#     2   2  n     body length, big-endian
#     4   n  body  E: seq u32 + data      H: head u32 + dropped u32
#   4+n   4  crc32 of bytes [1, 4+n), big-endian
#
# An H record says "every E with seq < head is gone" (acked or dropped) and carries
# the running count of dropped events. Removing = appending an H record; the file is
# rewritten (temp file + atomic rename) when dead records outweigh live ones. At load
# the file is scanned; a torn tail (power cut mid-append) fails its checksum and is
# cut off by rewriting the valid records. Bounded: when `max_len` events are waiting,
# the OLDEST is dropped and counted (never silently: the count is persisted, logged
# and reported).
import os
import struct
from array import array
from lockapp import atomic

try:
    from binascii import crc32
except ImportError:  # pragma: no cover - ports built without binascii.crc32
    def crc32(data, crc=0):
        crc = ~crc & 0xFFFFFFFF
        for b in data:
            crc ^= b
            for _ in range(8):
                crc = (crc >> 1) ^ (0xEDB88320 & -(crc & 1))
        return ~crc & 0xFFFFFFFF

MAGIC = 0xA5
KIND_E = 0x45
KIND_H = 0x48
MAX_BODY = 1024
COMPACT_MIN = 4096


def _record(kind, body):
    hdr = struct.pack(">BBH", MAGIC, kind, len(body))
    crc = crc32(body, crc32(hdr[1:]))
    return hdr + body + struct.pack(">I", crc & 0xFFFFFFFF)


class OQueue:
    def __init__(self, path, max_len=256):
        if max_len < 1:
            raise ValueError("queue_max must be >= 1")
        self.path = path
        self.max_len = max_len
        self.head = 0          # every seq < head is gone
        self.dropped = 0       # events dropped because the queue was full (persisted)
        self.max_seq = 0       # highest seq ever seen in the file
        self.torn = 0          # bytes cut off at load
        # Live entries' seqs in one fixed ring (allocated once: no heap growth or
        # fragmentation however full the queue gets). Their records lie in the file
        # in ring order from the oldest's: only that offset is kept (a ring of
        # offsets cost 4 bytes of heap per entry); `_skip` counts the entries that
        # left the head since it was known (found by walking the file when needed).
        self._seq = array("I", bytes(4 * max_len))
        self._off0 = 0
        self._skip = 0
        self._h = 0            # ring index of the oldest live entry
        self._n = 0            # live entries
        self._acked = []       # acked but not yet at the head
        self._size = 0
        self._dirty = False
        self.load()

    def __len__(self):
        return self._n

    def seq_at(self, i):
        return self._seq[(self._h + i) % self.max_len]

    def _push(self, seq, off):
        if not self._n:
            self._off0 = off
            self._skip = 0
        self._seq[(self._h + self._n) % self.max_len] = seq
        self._n += 1

    def _next_e(self, f, off):
        # (offset, body length) of the first event record at or after `off`.
        while True:
            f.seek(off)
            hdr = f.read(4)
            if len(hdr) < 4:
                raise OSError("queue: live record past the end of the file")
            n = struct.unpack(">H", hdr[2:])[0]
            if hdr[1] == KIND_E:
                return off, n
            off += n + 8

    def _live_off(self, f, i):
        # (offset, body length) of live entry i, walking the file from the oldest's
        # offset (which it brings up to date).
        off, n = self._next_e(f, self._off0)
        for _ in range(self._skip):
            off, n = self._next_e(f, off + n + 8)
        self._off0 = off
        self._skip = 0
        for _ in range(i):
            off, n = self._next_e(f, off + n + 8)
        return off, n

    def index(self, seq):
        # Position of live entry seq, or -1.
        for i in range(self._n):
            if self.seq_at(i) == seq:
                return i
        return -1

    def load(self):
        self._index()
        if self.torn:
            self._rewrite()
        return self.torn

    def _index(self):
        # Scan the file into the ring index; returns the bytes of whole records.
        atomic.remove(self.path + ".new")
        self._h = 0
        self._n = 0
        self._off0 = 0
        self._skip = 0
        self._acked = []
        good = 0
        try:
            f = open(self.path, "rb")
        except OSError:
            f = None
        if f is not None:
            try:
                good = self._scan(f)
            finally:
                f.close()
        size = atomic.size(self.path)
        self._size = good
        self.torn = size - good if size > good else 0
        return good

    def _scan(self, f):
        off = 0
        while True:
            hdr = f.read(4)
            if len(hdr) < 4:
                break
            magic, kind, n = struct.unpack(">BBH", hdr)
            if magic != MAGIC or kind not in (KIND_E, KIND_H) or n > MAX_BODY or n < 4:
                break
            rest = f.read(n + 4)
            if len(rest) < n + 4:
                break
            body = rest[:n]
            if crc32(body, crc32(hdr[1:])) & 0xFFFFFFFF != struct.unpack(">I", rest[n:])[0]:
                break
            if kind == KIND_E:
                seq = struct.unpack(">I", body[:4])[0]
                if seq > self.max_seq:
                    self.max_seq = seq
                if seq >= self.head:
                    if self._n >= self.max_len:   # queue_max lowered since: oldest go
                        self._pop_head()
                        self.dropped += 1
                    self._push(seq, off)
            else:
                self.head, self.dropped = struct.unpack(">II", body[:8])
                while self._n and self.seq_at(0) < self.head:
                    self._pop_head()
            off += n + 8
        return off

    # -- adding ------------------------------------------------------------------
    def append(self, seq, data):
        # Durably add one event. Returns the seq of the entry dropped to make room,
        # or None. Raises ValueError on a seq that is not increasing.
        if seq <= self.max_seq or seq < self.head:
            raise ValueError("queue: seq %d not above %d" % (seq, self.max_seq))
        if len(data) + 4 > MAX_BODY:
            raise ValueError("queue: event too large")
        out = b""
        dropped_seq = None
        if self._n >= self.max_len:
            dropped_seq = self.seq_at(0)
            self.dropped += 1
            self._pop_head()
            self.head = self.seq_at(0) if self._n else seq
            out = _record(KIND_H, struct.pack(">II", self.head, self.dropped))
        rec = _record(KIND_E, struct.pack(">I", seq) + data)
        off = self._append(out + rec) + len(out)
        self._push(seq, off)
        if seq > self.max_seq:
            self.max_seq = seq
        if dropped_seq is not None:
            self._maybe_compact()   # full and offline for days: the file stays bounded
        return dropped_seq

    def _append(self, b):
        # A failed append (flash full) may leave part of a record behind: nothing is
        # appended after it until a rewrite has cut it off (else a reboot's scan
        # would stop there and lose what came after).
        if self._dirty:
            self._rewrite()
            self._dirty = False
        try:
            f = open(self.path, "ab")
            try:
                f.write(b)
                f.flush()
            finally:
                f.close()
        except OSError:
            self._dirty = True
            raise
        off = self._size
        self._size += len(b)
        return off

    # -- reading -----------------------------------------------------------------
    def seqs(self):
        # A list of the live seqs, oldest first (allocates: for tests and tools).
        return [self.seq_at(i) for i in range(self._n)]

    def read(self, start, count):
        # Up to `count` live entries from index `start`: list of (seq, data).
        out = []
        if start >= self._n:
            return out
        f = open(self.path, "rb")
        try:
            off, n = self._live_off(f, start)
            for i in range(start, min(self._n, start + count)):
                if i > start:
                    off, n = self._next_e(f, off + n + 8)
                f.seek(off + 4)
                body = f.read(n)
                out.append((struct.unpack(">I", body[:4])[0], body[4:]))
        finally:
            f.close()
        return out

    def get(self, seq):
        # The data of live entry `seq`, or None.
        i = self.index(seq)
        if i < 0:
            return None
        return self.read(i, 1)[0][1]

    def is_acked(self, seq):
        return seq in self._acked

    # -- removing ----------------------------------------------------------------
    def ack(self, seq):
        # The broker acked seq. Entries leave only from the head (in order); an ack
        # that arrives early is remembered in RAM. Returns how many left the queue.
        if seq in self._acked or self.index(seq) < 0:
            return 0
        self._acked.append(seq)
        n = 0
        last = None
        while self._n and self.seq_at(0) in self._acked:
            last = self.seq_at(0)
            self._pop_head()
            n += 1
        if n:
            self.head = self.seq_at(0) if self._n else last + 1
            self._append(_record(KIND_H, struct.pack(">II", self.head, self.dropped)))
            self._maybe_compact()
        return n

    def reject(self, seq):
        # The broker refused seq for good: remove it, counted with the dropped.
        if seq not in self._acked and self.index(seq) >= 0:
            self.dropped += 1
            self.ack(seq)

    def _pop_head(self):
        seq = self.seq_at(0)
        self._h = (self._h + 1) % self.max_len
        self._n -= 1
        self._skip += 1
        if seq in self._acked:
            self._acked.remove(seq)

    def _maybe_compact(self):
        # Dead bytes are (nearly) the prefix before the oldest live record.
        if self._size < COMPACT_MIN:
            return
        if self._n and self._skip:
            f = open(self.path, "rb")
            try:
                self._live_off(f, 0)
            finally:
                f.close()
        dead = self._off0 if self._n else self._size
        if dead >= COMPACT_MIN and 2 * dead >= self._size:
            self._rewrite()

    def file_bytes(self):
        return self._size

    def _rewrite(self, base=None):
        # Copy the live records into a new file, then rename it over the old one.
        # On any failure the in-RAM index is rebuilt from what is on flash.
        try:
            self._copy_live(base)
        except Exception:
            self._index()      # what is on flash (never a second rewrite from here)
            raise

    def renumber(self, base):
        # Give the live entries the seqs base, base+1, ... (one atomic rewrite).
        # Only for provisional numbers that were never sent (see seqno.py).
        self._acked = []
        self.head = base
        self._rewrite(base)
        for i in range(self._n):
            self._seq[(self._h + i) % self.max_len] = base + i
        self.max_seq = base + self._n - 1 if self._n else base - 1

    def _copy_live(self, base=None):
        tmp = self.path + ".new"
        src = None
        try:
            src = open(self.path, "rb")
        except OSError:
            pass
        dst = open(tmp, "wb")
        try:
            h = _record(KIND_H, struct.pack(">II", self.head, self.dropped))
            dst.write(h)
            off = len(h)
            at = n = 0
            for i in range(self._n):
                at, n = self._live_off(src, 0) if i == 0 else self._next_e(src, at + n + 8)
                src.seek(at)
                rec = src.read(n + 8)
                if base is not None:
                    rec = _record(KIND_E, struct.pack(">I", base + i) + rec[8:4 + n])
                dst.write(rec)
                off += len(rec)
            dst.flush()
        finally:
            dst.close()
            if src is not None:
                src.close()
        os.rename(tmp, self.path)
        self._size = off
        self._off0 = len(h)    # the live records now follow the head record
        self._skip = 0
