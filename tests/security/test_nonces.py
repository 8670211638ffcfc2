"""Challenge nonces (``keys.new_nonce``): 16 fresh bytes each, never handed out twice --
across many draws, threads and a fork."""

from __future__ import annotations

import os
import threading

from lockmq.security.keys import NONCE_BYTES, new_nonce


def test_nonces_are_16_bytes_and_never_repeat():
    n = 1000
    nonces = [new_nonce() for _ in range(n)]
    assert all(type(x) is bytes and len(x) == NONCE_BYTES for x in nonces)
    assert len(set(nonces)) == n


def test_threads_never_get_the_same_nonce():
    got: list[list[bytes]] = [[] for _ in range(4)]

    def draw(out: list[bytes]) -> None:
        for _ in range(2000):
            out.append(new_nonce())

    threads = [threading.Thread(target=draw, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [x for out in got for x in out]
    assert len(set(every)) == len(every) == 8000


def test_a_forked_child_does_not_hand_out_its_parents_next_nonces():
    new_nonce()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                      # the child: its next nonces, to the parent
        try:
            os.write(w, b"".join(new_nonce() for _ in range(4)))
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while len(child) < 4 * NONCE_BYTES:
        part = os.read(r, 4 * NONCE_BYTES)
        if not part:
            break
        child += part
    os.close(r)
    os.waitpid(pid, 0)
    parent = [new_nonce() for _ in range(4)]
    assert len(child) == 4 * NONCE_BYTES
    assert not {child[i:i + NONCE_BYTES] for i in range(0, len(child), NONCE_BYTES)} & set(parent)
