# The card list, on flash only: cards.bin holds the CARDS_SET layout without its
# count, i.e. repeated (u8 length, id bytes). A lookup scans the file: no RAM is
# spent on the list however long it is.
from lockapp import atomic

PATH = "cards.bin"


def count(blob):
    # Number of entries in a cards.bin blob; ValueError when malformed.
    n = 0
    p = 0
    while p < len(blob):
        ln = blob[p]
        if ln == 0 or p + 1 + ln > len(blob):
            raise ValueError("card list truncated")
        p += 1 + ln
        n += 1
    return n


def save(blob, path=PATH):
    count(blob)
    atomic.write(path, blob)


def contains(cred, path=PATH):
    try:
        f = open(path, "rb")
    except OSError:
        return False
    n = len(cred)
    try:
        while True:
            h = f.read(1)
            if not h:
                return False
            ln = h[0]
            if ln == n:
                if f.read(ln) == cred:
                    return True
            else:
                f.seek(ln, 1)
    finally:
        f.close()
