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
"""

from __future__ import annotations

from dataclasses import dataclass

from lockmq.protocol import command_mac as _protocol_command_mac

from . import keys
from .errors import SecurityError


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
