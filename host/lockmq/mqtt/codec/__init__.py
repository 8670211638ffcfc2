"""A sans-IO MQTT 3.1.1 and 5 codec (no sockets, no clocks), for both sides.

    dec = Decoder(max_packet=1 << 20)
    dec.feed(data)                      # any chunking
    while (p := dec.next_packet()) is not None:
        ...                             # Connect, Publish, Ack, Subscribe ...
    sock.send(ConnAck(0).encode(version))

Errors carry the MQTT 5 reason code (``MqttError.reason``). Why our own and not a
library: see docs/design.md ("MQTT").
"""

from ._decoder import Decoder, parse
from ._errors import (MalformedPacket, MqttError, PacketTooLarge, ProtocolViolation,
                      v311_connack_code)
from ._packets import (AUTH, CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP,
                       PUBLISH, PUBREC, PUBREL, SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE, V5,
                       V311, Ack, AuthPacket, ConnAck, Connect, Disconnect, Packet, Ping,
                       Publish, SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe, Will,
                       publish_bytes)
from ._wire import encode_props, encode_str
from . import _errors as reason

__all__ = [
    "Decoder", "parse", "MalformedPacket", "MqttError", "PacketTooLarge", "ProtocolViolation",
    "v311_connack_code", "reason",
    "AUTH", "CONNACK", "CONNECT", "DISCONNECT", "PINGREQ", "PINGRESP", "PUBACK", "PUBCOMP",
    "PUBLISH", "PUBREC", "PUBREL", "SUBACK", "SUBSCRIBE", "UNSUBACK", "UNSUBSCRIBE", "V5",
    "V311", "Ack", "AuthPacket", "ConnAck", "Connect", "Disconnect", "Packet", "Ping",
    "Publish", "SubAck", "Subscribe", "Subscription", "UnsubAck", "Unsubscribe", "Will",
    "publish_bytes", "encode_props", "encode_str",
]
