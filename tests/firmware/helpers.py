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
LINK_OOM = """
# The link's session runs out of memory. Injected where a session starts: the link
# sizes its frames to the heap it finds free (frame limit = free/24), so filling
# the heap first no longer makes one of its allocations fail reliably, and which
# one fails would depend on the heap's holes.
from lockapp import link as _link
async def _session_out_of_memory(self, host, port):
    raise MemoryError("memory allocation failed (injected)")
_link.Link._session = _session_out_of_memory
ballast = None
"""
