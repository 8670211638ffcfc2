"""Replication: a standby broker that follows a primary's commit log (Kafka's
follower fetch, RocketMQ's slave), synchronous acks, and promotion on failover.

- :mod:`.primary`: the primary's ``replica.fetch`` op and sync-ack gate
  (``core.after_durable``);
- :mod:`.standby`: the follower loop and promotion;
- :mod:`.logcopy`: the byte-identical copy of the log on the standby;
- :mod:`.registry_source` / :mod:`.registry_copy`: the security registry
  (``replica.security``) served by the primary, installed on the standby;
- :mod:`.settings`: the ``[replication]`` table.
"""

from .settings import ReplicationSettings

__all__ = ["ReplicationSettings"]
