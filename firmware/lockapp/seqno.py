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
#
# The numbers never wrap (SPEC 2, "Sequence numbers"): a message id SN:seq is used
# once for ever, and consumers drop an id they processed. A number from the network
# (CONNECT_ACK.last_seq) is taken only within this lock's own bounds: at most JUMP_MAX
# above its next number once its numbering is trusted, never above CEILING.
import struct
import binascii
from lockapp import atomic

CEILING = 0xFF000000      # no floor above this: 16M numbers left, far from NO_SEQ
JUMP_MAX = 1 << 20        # most a trusted lock moves its numbers for a broker's last_seq


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
        # Never hand out a number below n (queue's max seq + 1, broker's last + 1);
        # never above CEILING (False: refused, the numbers stay).
        if n > CEILING:
            return False
        if n > self.next:
            self.next = n
            if self.limit < n:
                self.limit = n
        return True

    def broker_floor(self, n):
        # The broker's last stored seq + 1, bounded: a trusted lock does not jump more
        # than JUMP_MAX for it (a poisoned or foreign store would wrap or waste it).
        # Below our next it is nothing to do. False: refused.
        if n <= self.next:
            return True
        if self.ok and n - self.next > JUMP_MAX:
            return False
        return self.raise_floor(n)

    def take(self):
        if self.ok and self.next >= self.limit:
            self._reserve(self.next + self.block)
        s = self.next
        self.next = s + 1
        return s

    def confirm(self, floor):
        # The broker's view is known: persist from here on (a floor above CEILING is
        # not taken: App.confirm_seq has logged it).
        self.raise_floor(floor)
        self.ok = True
        self._reserve(self.next + self.block)

    def _reserve(self, limit):
        b = struct.pack(">I", limit)
        b += struct.pack(">I", binascii.crc32(b))
        atomic.write(self.path, b)
        atomic.write(self.path + ".bak", b)
        self.limit = limit
