"""Helpers of the firmware tests (the design's rule: a helper module of the folder,
never another test module)."""

from __future__ import annotations

from lockmq.testing import set_config


def fast_link(folder, broker_ports, **kw):
    """A board in ``folder`` pointed at ``broker_ports`` on localhost, with short
    backoff and I/O timeouts (``kw`` overrides any setting); no frame MACs."""
    settings = {"backoff_min_ms": 100, "backoff_max_ms": 800, "io_timeout_ms": 3000, **kw}
    set_config(folder, brokers=[["127.0.0.1", p] for p in broker_ports], frame_mac=False,
               **settings)


#: Script lines that fill the heap, then free every third 200-byte block: small
#: allocations still find room, the link's 512-byte socket reads do not (a real
#: MemoryError in the link's session, on either interpreter). Frees with ``ballast = None``.
FILL_HEAP = """
ballast = []
try:
    while True:
        ballast.append(bytearray(200))
except MemoryError:
    pass
for i in range(0, len(ballast), 3):
    ballast[i] = None
gc.collect()
"""
