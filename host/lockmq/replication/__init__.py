"""Replication: a standby broker that follows a primary's commit log (Kafka's
follower fetch, RocketMQ's slave), synchronous acks, and promotion on failover.

- :mod:`.primary`: the primary's ``replica.fetch`` op and sync-ack sink;
- :mod:`.standby`: the follower loop and promotion;
- :mod:`.logcopy`: the byte-identical copy of the log on the standby;
- :mod:`.settings`: the ``[replication]`` table.
"""

from .settings import ReplicationSettings

__all__ = ["ReplicationSettings"]
