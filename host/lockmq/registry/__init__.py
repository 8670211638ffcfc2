"""Discovery for a campus of gateways (issue #16): RocketMQ's NameServer, small.

* :mod:`.table` -- the gateways, their topics and eviction (no I/O);
* :mod:`.server` -- the registry process (``lockmq registry``);
* :mod:`.announce` -- a broker registering and heartbeating (``[registry]``);
* lookups (the client side) are :mod:`lockmq.client.registry`, for
  :mod:`lockmq.client.campus` and the CLI.
"""

from .table import Gateway, GatewayTable, RegistryError

__all__ = ["Gateway", "GatewayTable", "RegistryError"]
