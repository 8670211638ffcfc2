# The per-lock sequence number, persisted so it is never reused after a reboot.
# seq.dat (and its copy seq.bak) hold the end of the reserved block (u32 big-endian
# + crc32). A block of `block` numbers is reserved (both files written, each
# atomically) before its first number is used; after a power cut the rest of the
# block is skipped. One pair of small writes per `block` events.
#
# With neither file readable (a board flashed with a fresh file system, or flash
# damage) the numbers are PROVISIONAL: nothing is persisted until the broker says,
# at connect, the last seq it stored for this lock; the app then renumbers the
# queued events above it (see App.confirm_seq) and confirm() starts reserving.
import struct
import binascii
from lockapp import atomic


def _read(path):
    raw = atomic.read(path)
    if raw is not None and len(raw) == 8 and struct.unpack(">I", raw[4:])[0] == binascii.crc32(raw[:4]):
        return struct.unpack(">I", raw[:4])[0]
    return None


class SeqNo:
    def __init__(self, path, block=64):
        if block < 1:
            raise ValueError("seq_block must be >= 1")
        self.path = path
        self.block = block
        found = [v for v in (_read(path), _read(path + ".bak")) if v is not None]
        self.ok = bool(found)           # False: provisional until confirm()
        self.limit = max(found) if found else 1
        self.next = self.limit

    def raise_floor(self, n):
        # Never hand out a number below n (queue's max seq + 1, broker's last + 1).
        if n > self.next:
            self.next = n
            if self.limit < n:
                self.limit = n

    def take(self):
        if self.ok and self.next >= self.limit:
            self._reserve(self.next + self.block)
        s = self.next
        self.next = s + 1
        return s

    def confirm(self, floor):
        # The broker's view is known: persist from here on.
        self.raise_floor(floor)
        self.ok = True
        self._reserve(self.next + self.block)

    def _reserve(self, limit):
        b = struct.pack(">I", limit)
        b += struct.pack(">I", binascii.crc32(b))
        atomic.write(self.path, b)
        atomic.write(self.path + ".bak", b)
        self.limit = limit
