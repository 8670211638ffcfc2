"""lockmq's test harness: real brokers, a wire peer, a simulated lock, free ports.

Every test folder (and the HIL rig) starts brokers and speaks the protocol through
this package, so there is one way to do each:

- :class:`BrokerThread` -- a real broker in this process, on its own loop thread;
- :class:`BrokerProcess` -- ``lockmq broker`` in a child process (kill, stop, restart,
  log lines, ``/metrics``);
- :class:`SecureBroker` -- that broker with auth required: its device registry, tokens
  and (optionally) a TLS port with a fresh CA;
- :class:`Peer` -- a blocking wire client whose handshake runs the protocol's
  ``ClientSession``; :func:`open_peer` logs one in to an auth-off broker;
  :class:`AsyncPeer` / :func:`open_async_peer` the same for asyncio (hundreds at once);
- :class:`Lock` -- the real firmware in the MicroPython unix port (a simulated lock);
- :class:`SparkCluster` -- a Spark standalone master and workers (separate JVMs from
  PySpark's ``spark-class``) and ``spark-submit`` to them (:mod:`.spark_cluster`);
- :func:`free_port`, :func:`wait_for` (:func:`wait_for_async` in a coroutine) -- ports
  and bounded waits; :func:`signal_until_exit` -- a service signalled again and again
  while it shuts down.

Shipped in the wheel so a deployment can test itself; nothing here imports pytest at
import time or imports the test suite. Submodules that need an extra (the firmware
tools, a MicroPython binary) load it when used.
"""

from .async_wire import AsyncPeer, open_async_peer
from .cli import run_cli
from .lock import Lock, set_config
from .micropython import require_micropython
from .ports import free_port
from .process import LOCKMQ_COMMAND, BrokerProcess, proc_status_kib, signal_until_exit
from .secure import SecureBroker
from .spark_cluster import SparkCluster
from .tables import merge_tables, to_toml
from .thread import FAST_TIMERS, BrokerThread, uvloop_wanted
from .waiting import raises, wait_for, wait_for_async
from .wire import Peer, Refused, drain, open_peer, read_until_closed, refusal

__all__ = [
    "AsyncPeer", "open_async_peer", "BrokerProcess", "LOCKMQ_COMMAND", "BrokerThread", "FAST_TIMERS", "Lock", "Peer", "Refused", "SecureBroker", "SparkCluster",
    "drain", "free_port", "merge_tables", "open_peer", "proc_status_kib", "raises", "read_until_closed",
    "refusal", "require_micropython", "run_cli", "set_config", "signal_until_exit", "to_toml",
    "uvloop_wanted",
    "wait_for", "wait_for_async",
]
