"""lockmq.broker: the message broker on the gateway box.

Modules, one job each: ``server`` (wiring, listeners, start-up, shutdown),
``connection`` (one peer's transport: decode, dispatch through the one handler
table, batched writes, flow control) with ``login`` (the handshake) and ``intake``
(PUBLISH), ``peer`` (what a feature may use of a connection), ``core`` (store,
clusters, system records, timers), ``clusters`` (consumer clusters, leases,
retries, dead letters), ``consumers``, ``devices``, ``commands``, ``scheduler``,
``transactions``, ``admin`` (each the handlers of its opcodes), ``admission`` (the
one rights decision), ``status`` (HTTP status page), ``auth`` (the security hook),
``logs`` (structured logs and counters), ``embedded`` (a broker on a thread).

The broker itself is :class:`lockmq.broker.server.Broker` (``run``, ``serve``). This
file imports nothing: importing one broker module (``logs``, ``admin``) must not
build the whole broker, nor close a circle through what the server wires in
(replication, the registry announcer).
"""
