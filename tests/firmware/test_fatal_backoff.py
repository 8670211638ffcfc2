"""Fatal reboots in a row slow the lock's first connect down (issue 13 review).

``App.fatal`` (a MemoryError or a bug in a task) reboots at once. When the heap runs
out at every session, a lock rebooted and reconnected at boot speed: across a fleet, a
reconnect storm. The count of consecutive fatal reboots is now kept in ``fatal.dat``
(written before the reboot); on boot with a count n > 0 the link's first connect waits
the backoff of retry n (``W sys fatal_backoff n=.. ms=..``), and a session that stays
up for a heartbeat interval clears the count (``I sys fatal_count cleared n=..``).
"""

from __future__ import annotations

import re

import pytest

from lockmq.testing.lock import KEY, SN

from .helpers import LINK_OOM, fast_link
from .minibroker import MiniBroker

FATAL_REBOOTS = 3

#: One boot that runs out of memory in the link's session (helpers.LINK_OOM) and
#: reboots; each run is a new interpreter, a fresh heap, as a board's machine.reset().
SCRIPT = """
import gc, asyncio
from lockapp.app import App
app = App()
""" + LINK_OOM + """
print("main returned", asyncio.run(app.main()))
"""


@pytest.fixture
def broker():
    b = MiniBroker({SN: KEY}, heartbeat_s=1)
    yield b
    b.close()


def test_fatal_reboots_delay_the_first_connect_until_a_session_holds(flash, broker, run_app,
                                                                     lock_factory):
    fast_link(flash, [broker.port])            # backoff 100..800 ms: a fast test
    for n in range(FATAL_REBOOTS):             # boot n comes after n fatal reboots
        boot = run_app(SCRIPT, flash, timeout=20)
        assert "main returned reboot" in boot, boot
        waits = re.findall(r"^W sys fatal_backoff n=(\d+) ms=\d+$", boot, re.M)
        assert waits == ([str(n)] if n else []), boot
        # the wait comes first, before the link's first step (which of its allocations
        # fails depends on the heap's holes); the link runs out of memory again
        order = re.findall(r"^(W sys fatal_backoff|I net \w+|E sys fatal where=link err=MemoryError)",
                           boot, re.M)
        assert order[-1] == "E sys fatal where=link err=MemoryError", boot
        if n:
            assert order[0] == "W sys fatal_backoff", boot
    assert (flash / "fatal.dat").read_bytes() == str(FATAL_REBOOTS).encode()

    # A boot with room: waits as retry 3 would (100 * 2**2 at most), connects, and
    # once the session has held a heartbeat interval the count is gone.
    lk = lock_factory(flash)
    lk.expect(r"^I sys boot ")
    ms = int(lk.expect(rf"^W sys fatal_backoff n={FATAL_REBOOTS} ms=(\d+)$").group(1))
    assert 100 <= ms <= 400
    lk.expect(r"^I net connecting ")
    lk.expect(r"^I net connected ")
    lk.expect(rf"^I sys fatal_count cleared n={FATAL_REBOOTS}$")
    assert not (flash / "fatal.dat").exists()

    lk.restart()                               # the next boot connects at once
    lk.expect(r"^I sys boot ")
    assert lk.expect(r"^(W sys fatal_backoff|I net connecting) ").group(1) == "I net connecting"
