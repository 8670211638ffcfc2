"""The broker's counters: one registry, read by :class:`~lockmq.broker.logs.Stats`
(every counter exists from the start, at 0) and by ``/metrics``
(:mod:`lockmq.broker.metrics`: ``lockmq_<name>_total`` with this help text; a name
ending in ``_ms`` is exported in seconds, ``lockmq_<name>_seconds_total``).

A new counter is one line here, then ``stats.inc("name")`` where it happens;
``tests/broker/test_counters.py`` fails on a counter the code counts that is not
listed. The store's and each cluster's own counters are theirs
(``STORE_COUNTER_HELP``, ``CLUSTER_COUNTER_HELP`` in metrics.py).
"""

from __future__ import annotations

#: name -> help, in the order the ``stats`` op lists them.
COUNTERS: dict[str, str] = {
    # connections and frames
    "connections_accepted": "Protocol connections accepted",
    "connections_closed": "Protocol connections closed",
    "connections_refused": "Connections refused (over max_connections or a security limit)",
    "handshakes_ok": "CONNECT/AUTH handshakes completed",
    "handshakes_failed": "CONNECT/AUTH handshakes refused or timed out",
    "frames_in": "Frames received",
    "frames_out": "Frames sent",
    "bytes_in": "Bytes received on protocol connections",
    "bytes_out": "Bytes sent on protocol connections",
    "bad_frames": "Malformed frames received",
    "errors_sent": "ERROR frames sent",
    "reads_paused": "Times the broker stopped reading a connection whose peer does not drain",
    "frame_mac_refused": "Frames refused for a bad frame MAC",
    "session_violations": "Connections closed for breaking the session rules",
    "producer_ids_refused": "Producer ids refused (reserved or another principal's)",
    "internal_errors": "Requests that failed inside the broker",
    # publishing
    "publish_received": "PUBLISH frames received",
    "publish_stored": "Records stored durably and acknowledged to their producer",
    "publish_duplicates": "Publishes dropped as producer duplicates (acknowledged again)",
    "publish_busy": "Publishes answered BUSY or STORAGE_FULL (store back-pressure)",
    "publish_refused": "Publishes refused (rights, bad topic)",
    "publish_oneway": "One-way publishes received",
    "publish_oneway_refused": "One-way publishes dropped",
    "publish_batches": "Publish batches handed to the store",
    "system_records": "Records the broker wrote itself ($devices, retries, dead letters)",
    "system_records_duplicate": "System records dropped as duplicates",
    # the compiled lane
    "lane_joins": "Times a lock's connection joined the compiled lane (steady publishes in C)",
    "lane_bails": "Times the lane gave a connection back to the Python path (another frame, EOF)",
    "lane_commit_reads": "Lane reads the event loop made as a group commit of the lane's "
                         "records was answered (what arrived during it), before its acks",
    "lane_commit_stalls": "Times a group commit of the lane's records had no answer after "
                          "0.2 s (a slow disk) and the event loop watched the lane again",
    # consuming
    "acks": "Leases acknowledged by consumers",
    "nacks": "Leases negatively acknowledged by consumers",
    "unknown_leases": "ACK/NACK of a lease the broker does not hold",
    "pulls": "PULL requests served",
    "messages_delivered": "Messages delivered to consumers",
    "notifies": "NOTIFY frames sent to idle consumers",
    "clusters_refused_owner": "Subscriptions refused: cluster owned by another principal",
    "clusters_refused_topic": "Subscriptions refused: cluster bound to another topic",
    "clusters_refused_cap": "Subscriptions refused: max_clusters_per_owner reached",
    "subscriptions_refused": "Subscriptions refused (max_subscriptions_per_connection)",
    "retention_skipped": "Messages clusters skipped because retention deleted them unread",
    "clusters_expired": "Clusters expired after [clusters] offsets_retention_ms unused",
    # devices
    "devices_online_events": "Locks that came online",
    "devices_offline_events": "Locks that went offline",
    "devices_evicted": "Locks closed after staying silent for evict_after_s",
    "heartbeats": "HEARTBEAT frames received",
    "heartbeats_refused": "HEARTBEAT frames refused by the rate limit",
    "heartbeat_records": "Heartbeat records written to the heartbeats topic",
    "heartbeat_records_skipped": "Heartbeats not stored (one record per lock per gap)",
    # downlink commands
    "commands_received": "Downlink commands received",
    "commands_forwarded": "Downlink commands sent to a lock",
    "commands_results": "Command results received from locks",
    "commands_expired": "Downlink commands expired before a result",
    "commands_refused": "Downlink commands refused",
    "commands_refused_too_large": "Downlink commands refused as larger than the lock accepts",
    "commands_refused_cap": "Downlink commands refused over the pending caps",
    "commands_undeliverable": "Downlink commands that could not be delivered",
    # firmware bundles
    "fw_bundles_released": "Firmware bundles released to locks",
    "fw_chunks_sent": "Firmware bundle chunks sent (FW_FETCH answers)",
    "fw_bytes_sent": "Firmware bundle bytes sent",
    "fw_fetch_refused": "FW_FETCH requests refused",
    # scheduled delivery
    "scheduled_accepted": "Scheduled publishes and commands accepted",
    "scheduled_refused": "Scheduled publishes and commands refused",
    "scheduled_refused_cap": "Scheduled items refused over the [scheduled] caps",
    "scheduled_dedup": "Scheduled items dropped as duplicates",
    "scheduled_cancelled": "Scheduled items cancelled",
    "scheduled_cancelled_revoked": "Scheduled items cancelled because their owner was revoked",
    "scheduled_delivered": "Scheduled publishes written to their topic when due",
    "scheduled_commands_due": "Scheduled commands sent when due",
    "scheduled_command_results": "Results of scheduled commands received",
    "scheduled_refreshed": "Scheduled items re-read from the store (refresh_after_s)",
    "scheduled_lateness_ms": "Total lateness of scheduled items past their due time",
    # transactions
    "txn_half_stored": "Half (transactional) messages stored",
    "txn_committed": "Transactions committed",
    "txn_rolled_back": "Transactions rolled back",
    "txn_rolled_back_revoked": "Transactions rolled back because their producer was revoked",
    "txn_checks_sent": "TXN_CHECK frames sent to producers",
    "txn_check_no_producer": "Transaction checks with no producer connected",
    "txn_check_unknown": "Transaction checks answered UNKNOWN (checked again later)",
    "txn_check_limit": "Transactions ended after [transactions] max_checks",
    "txn_refused": "Transactional requests refused",
    "txn_limit_exceeded": "Transactions refused over the [transactions] caps",
    "txn_commands_issued": "Commands issued by committed transactions",
    "txn_commands_refused": "Commands of transactions refused",
    "txn_command_results": "Results of transactional commands received",
    # revocation (lockmq.broker.admission)
    "admission_refused_revoked": "Requests refused because their credential was revoked",
    "sessions_closed_revoked": "Sessions closed because their credential was revoked",
    "pending_cancelled_revoked": "Pending commands cancelled because their sender was revoked",
    # admin and status page
    "admin_requests": "Admin requests served",
    "status_requests": "Status-page requests answered",
    "status_timeouts": "Status-page requests over status_request_timeout_s (408)",
    "status_refused": "Status-page connections over status_max_connections (503)",
    "status_bad_requests": "Status-page requests that could not be parsed (400)",
    "status_unauthorized": "Status-page requests without the right token (401)",
    "clock_steps": "Steps of the wall clock the broker saw (durations it judges are on "
                   "steady time and do not move)",
    # replication (lockmq.replication)
    "replication_fences": "Times this broker fenced itself: no acks with the standby unseen for fence_after_s",
    "replication_degraded": "Times acks stopped waiting for the standby (it fell behind)",
    "replication_released_on_shutdown": "Acks held for the standby released at shutdown",
    # MQTT front end, bridge and webhooks (lockmq.mqtt)
    "mqtt_connects": "MQTT connections accepted",
    "mqtt_connect_refused": "MQTT CONNECTs refused",
    "mqtt_connect_timeouts": "MQTT connections closed before their CONNECT",
    "mqtt_connections_refused": "MQTT connections refused over max_connections",
    "mqtt_keepalive_timeouts": "MQTT connections closed after 1.5 keepalives of silence",
    "mqtt_protocol_errors": "MQTT connections closed for a protocol error",
    "mqtt_internal_errors": "MQTT requests that failed inside the broker",
    "mqtt_publish_received": "MQTT PUBLISH packets received",
    "mqtt_publish_stored": "MQTT publishes stored",
    "mqtt_publish_refused": "MQTT publishes refused",
    "mqtt_publish_failed": "MQTT publishes the broker could not store (busy, disk full, error)",
    "mqtt_subscribe_refused": "MQTT subscriptions refused",
    "mqtt_delivered": "Messages delivered to MQTT subscribers",
    "mqtt_acked": "Deliveries acknowledged by MQTT subscribers",
    "mqtt_late_acks": "MQTT acks of deliveries that had expired and been leased again",
    "mqtt_commands": "Downlink commands sent over MQTT",
    "mqtt_retained_sent": "Retained messages sent to new MQTT subscribers",
    "mqtt_retained_refused": "Retained messages refused",
    "mqtt_too_large_for_client": "Messages not sent: larger than the MQTT client accepts",
    "mqtt_takeovers": "MQTT sessions taken over by a new connection with the same client id",
    "mqtt_wills": "MQTT will messages published",
    "mqtt_sessions_expired": "MQTT sessions expired",
    "mqtt_sessions_revoked": "MQTT sessions closed because their credential was revoked",
    "bridge_connects": "Connections of the MQTT bridge to its upstream broker",
    "bridge_errors": "Errors of the MQTT bridge's upstream connection",
    "bridge_sent": "Messages the MQTT bridge sent upstream",
    "bridge_forwarded": "Messages the upstream broker acknowledged (acked here)",
    "bridge_refused": "Messages the upstream broker refused (nacked here: retried, then dead-lettered)",
    "bridge_commands": "Downlink commands received from upstream through the MQTT bridge",
    "bridge_late_acks": "Bridge acks of deliveries that had expired and been leased again",
    "webhooks_delivered": "Messages delivered to webhooks",
    "webhooks_failed": "Webhook deliveries that failed",
    "webhooks_late": "Webhook deliveries whose lease expired meanwhile (sent again)",
}
