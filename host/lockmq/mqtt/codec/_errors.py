"""MQTT errors: each carries the MQTT 5 reason code a peer can act on."""

from __future__ import annotations

# Reason codes (MQTT 5, section 2.4) this package names; v3.1.1 maps the CONNACK ones.
SUCCESS = 0x00
GRANTED_QOS_1 = 0x01
NO_MATCHING_SUBSCRIBERS = 0x10
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BAD_AUTH_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_ID_IN_USE = 0x91
RECEIVE_MAXIMUM_EXCEEDED = 0x93
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
PAYLOAD_FORMAT_INVALID = 0x99
QOS_NOT_SUPPORTED = 0x9B
SERVER_SHUTTING_DOWN = 0x8B
SHARED_SUBS_NOT_SUPPORTED = 0x9E
WILDCARD_SUBS_NOT_SUPPORTED = 0xA2


class MqttError(Exception):
    """A packet that breaks MQTT: ``reason`` is the MQTT 5 reason code to answer with
    (a DISCONNECT in v5; v3.1.1 just closes), ``message`` a sentence for a person."""

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class MalformedPacket(MqttError):
    """The bytes do not parse (0x81)."""

    def __init__(self, message: str) -> None:
        super().__init__(MALFORMED_PACKET, message)


class ProtocolViolation(MqttError):
    """The bytes parse but break a rule of the protocol (0x82)."""

    def __init__(self, message: str) -> None:
        super().__init__(PROTOCOL_ERROR, message)


class PacketTooLarge(MqttError):
    """A packet over the receiver's maximum packet size (0x95), refused before
    its body is buffered."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(PACKET_TOO_LARGE,
                         f"packet of {size} bytes is over the {limit}-byte maximum")
        self.size = size
        self.limit = limit


#: MQTT 5 CONNACK reason -> the v3.1.1 CONNACK return code closest to it
V311_CONNACK = {
    SUCCESS: 0,
    UNSUPPORTED_PROTOCOL_VERSION: 1,
    CLIENT_ID_NOT_VALID: 2,
    SERVER_UNAVAILABLE: 3,
    SERVER_BUSY: 3,
    SERVER_SHUTTING_DOWN: 3,
    BAD_USERNAME_OR_PASSWORD: 4,
    NOT_AUTHORIZED: 5,
}


def v311_connack_code(reason: int) -> int:
    """The v3.1.1 CONNACK return code for an MQTT 5 reason (5, not authorized, for
    any other refusal)."""
    return V311_CONNACK.get(reason, 5 if reason >= 0x80 else 0)
