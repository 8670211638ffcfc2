"""Downlink command authentication: the broker signs, the lock verifies.

The MAC is the protocol's ``command_mac`` (lockmq.protocol, shared with the
firmware)::

    mac = HMAC-SHA256(device_key, "lockmq-cmd-v1" | sn | u32 cmd_id | u64 expires_ms
                      | u8 kind | args)

``cmd_id`` is strictly increasing per lock and persisted in the registry
(``devices.last_command_id``), so it never goes back, not even across broker
restarts; ``expires_ms`` is Unix milliseconds on the broker clock (the lock learns
that clock from CHALLENGE/CONNECT_ACK ``server_time_ms``). The lock refuses a
command whose MAC is wrong, whose id is not above the last id it ran (it persists
that id), or whose expiry has passed. :class:`CommandVerifier` is that lock-side
logic, for tests and as the reference the firmware mirrors.

Rights per kind: a CONFIG that changes where the lock connects (its broker list,
TLS settings, or any key outside :data:`PLAIN_CONFIG_KEYS`) needs the right
``config.network`` and must say so in its own arguments (``"network": true``): the
firmware refuses a network change without that marker, so a token with the plain
``config`` right cannot repoint a lock even if the broker's check were bypassed.
:func:`config_network_keys` is the broker's side of that rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lockmq.protocol import command_mac as _protocol_command_mac

from . import keys
from .errors import SecurityError

#: CONFIG keys that only tune a lock (the firmware's ``cfgchange.SETTABLE``): the plain
#: ``config`` right covers them. Every other key -- ``brokers``, ``tls``, the
#: ``network`` marker, and any key unknown here -- needs ``config.network``.
PLAIN_CONFIG_KEYS = frozenset({"heartbeat_s", "unlock_s", "door_open_alarm_s", "battery_low_pct",
                               "backoff_min_ms", "backoff_max_ms", "io_timeout_ms"})
#: The marker a CONFIG must carry to change network settings (checked by the lock).
NETWORK_MARKER = "network"


class InvalidCommand(SecurityError):
    """A command whose arguments the broker refuses to sign (INVALID_ARGUMENT); the
    detail is safe to send (it says nothing about the registry)."""

    code_name = "INVALID_ARGUMENT"
    fallback_code = 8
    public_message = "invalid command arguments"

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail, reason=reason)
        self.public_message = detail


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:   # parsers differ on duplicates: refuse rather than guess
            raise InvalidCommand(f"config: key {k!r} appears twice", reason="config_duplicate_key")
        seen[k] = v
    return seen


def config_network_keys(args: bytes) -> tuple[tuple[str, ...], bool]:
    """``(keys that need config.network, whether the command is marked
    "network": true)`` of a CONFIG's arguments; no keys for a plain tuning change.

    Raises :class:`InvalidCommand` when the arguments are not a UTF-8 JSON object
    with unique keys.
    """
    try:
        obj = json.loads(bytes(args).decode("utf-8"), object_pairs_hook=_unique_keys)
    except InvalidCommand:
        raise
    except (UnicodeDecodeError, ValueError):
        raise InvalidCommand("config: arguments must be a UTF-8 JSON object",
                             reason="config_not_json") from None
    if not isinstance(obj, dict):
        raise InvalidCommand("config: arguments must be a JSON object", reason="config_not_object")
    network = tuple(sorted(k for k in obj if k not in PLAIN_CONFIG_KEYS))
    return network, obj.get(NETWORK_MARKER) is True


def check_network_marked(network: tuple[str, ...], marked: bool) -> None:
    """A network change the sender may make must still say so (the lock refuses it
    otherwise): :class:`InvalidCommand`, clearly, instead of a refusal by the lock."""
    changes = [k for k in network if k != NETWORK_MARKER]
    if changes and not marked:
        raise InvalidCommand(f"config: {', '.join(changes)} can redirect the lock (not plain "
                             f"tuning settings): the command must say so with "
                             f"\"{NETWORK_MARKER}\": true", reason="config_network_unmarked")


#: Bytes of a broker-to-lock COMMAND frame besides the target and the args: header
#: (15, empty SN), target length u8, cmd_id u32, expires u64, kind u8, args length
#: u16, mac length u8 and a 32-byte HMAC-SHA256.
_COMMAND_FRAME_OVERHEAD = 15 + 1 + 4 + 8 + 1 + 2 + 1 + 32


def command_frame_size(target: str, args: bytes) -> int:
    """Size of the signed COMMAND frame the broker sends to lock ``target``."""
    return _COMMAND_FRAME_OVERHEAD + len(target.encode("utf-8")) + len(args)


def command_mac(key: bytes, sn: str, cmd_id: int, expires_ms: int, kind: int,
                args: bytes) -> bytes:
    """The protocol's command MAC (see the module docstring)."""
    return _protocol_command_mac(key, sn, cmd_id, expires_ms, kind, bytes(args))


@dataclass(frozen=True)
class SignedCommand:
    """A command ready for the lock: the fields of a protocol ``Command`` body."""

    target: str
    cmd_id: int
    expires_ms: int
    kind: int
    args: bytes
    mac: bytes

    def to_body(self):  # type: ignore[no-untyped-def]
        """The protocol ``Command`` body to send to the lock."""
        from lockmq.protocol import Command

        return Command(self.target, self.cmd_id, self.expires_ms, self.kind, self.args, self.mac)


class CommandRefused(SecurityError):
    """The lock-side refusal of a command (bad MAC, replay, expired)."""

    code_name = "REPLAY"
    fallback_code = 15
    public_message = "command refused"


class CommandVerifier:
    """What a lock does with a signed command (reference for the firmware).

    Args:
        sn: the lock's SN.
        key: its device key.
        last_id: the highest command id it ran so far (persisted by the lock).
    """

    def __init__(self, sn: str, key: bytes, last_id: int = 0) -> None:
        self.sn = sn
        self.key = key
        self.last_id = last_id

    def verify(self, command: object, now_ms: int) -> None:
        """Accept a protocol ``Command`` (updating ``last_id``) or raise CommandRefused."""
        cmd_id = int(getattr(command, "cmd_id"))
        expires_ms = int(getattr(command, "expires_ms"))
        want = command_mac(self.key, self.sn, cmd_id, expires_ms, int(getattr(command, "kind")),
                           bytes(getattr(command, "args")))
        if getattr(command, "target", self.sn) != self.sn:
            raise CommandRefused(f"command for {getattr(command, 'target')!r}", reason="not_mine")
        if not keys.equal(want, bytes(getattr(command, "mac"))):
            raise CommandRefused("command MAC does not verify", reason="bad_mac")
        if cmd_id <= self.last_id:
            raise CommandRefused(f"command id {cmd_id} <= last run {self.last_id}",
                                 reason="replayed")
        if now_ms >= expires_ms:
            raise CommandRefused(f"command expired at {expires_ms}", reason="expired")
        self.last_id = cmd_id
