"""A lock whose heap runs out fails loudly and reboots; it never retries for ever.

bench/firmware_heap_step.py hung at its 32K step: the link's one failure handler
took the MemoryError of every new session for a link failure (``W net down
err=bug_MemoryError``), backed off and tried again, for ever -- the lock online a
moment, then down, acking nothing, its owner told nothing. A MemoryError now leaves
the task, and the app logs ``E sys fatal where=... err=MemoryError`` and reboots with
a fresh heap (a board: machine.reset); what was queued is on flash and survives.
"""

from __future__ import annotations

import re

import pytest

from lockmq.testing.lock import KEY, SN

from .helpers import LINK_OOM, fast_link
from .minibroker import MiniBroker

#: Boot a lock, queue one event, then make the link's session run out of memory
#: (helpers.LINK_OOM). Then run the app.
SCRIPT = """
import gc, asyncio
from lockapp.app import App
app = App()
app.emit("tamper")
""" + LINK_OOM + """
print("main returned", asyncio.run(app.main()))
ballast = app = None
asyncio.new_event_loop()
gc.collect()
print("after reboot queued", len(App().q))
"""


@pytest.fixture
def broker():
    b = MiniBroker({SN: KEY})
    yield b
    b.close()


def test_out_of_memory_in_the_link_reboots_instead_of_retrying(flash, broker, run_app):
    fast_link(flash, [broker.port])
    out = run_app(SCRIPT, flash, timeout=20)   # (before: no end, the lock retried for ever)
    assert "bug_MemoryError" not in out, out       # not taken for a link failure
    assert re.search(r"^E sys fatal where=link err=MemoryError free=\d+$", out, re.M), out
    assert "I sys reboot reason=oom" in out, out
    assert "main returned reboot" in out, out
    assert "after reboot queued 1" in out, out      # the event queued before is kept
