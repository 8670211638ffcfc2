"""lockmq.mqtt: MQTT 3.1.1 and 5 for backends, on the broker's own clusters.

``codec`` is the sans-IO MQTT codec; ``topics`` the topic mapping; ``rights`` the one
adapter to the broker's guard; ``sessions`` the persistent sessions; ``connection``
one client; ``server`` the listener the broker starts when ``[mqtt] enabled``.
See docs/mqtt.md.
"""

from .server import MqttServer, start_mqtt

__all__ = ["MqttServer", "start_mqtt"]
