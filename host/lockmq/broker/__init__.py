"""lockmq.broker: the message broker on the gateway box.

Modules, one job each: ``server`` (listeners, start-up, shutdown), ``connection``
(one peer: decode, dispatch, batched writes), ``core`` (store, clusters, system
records, timers), ``clusters`` (consumer clusters, leases, retries, dead letters),
``devices`` (online list, heartbeats, ``$devices``), ``commands`` (downlink
commands), ``admin`` (admin operations), ``status`` (HTTP status page), ``auth``
(the security hook), ``logs`` (structured logs and counters).
"""

from .server import Broker, run, serve

__all__ = ["Broker", "run", "serve"]
