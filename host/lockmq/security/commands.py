"""Downlink command authentication: the broker signs, the lock verifies.

A command to lock ``sn`` carries a command id (strictly increasing per lock,
persisted in the registry), an expiry (Unix seconds, broker clock) and a MAC::

    mac = HMAC-SHA256(device_key, "lockmq-cmd-v1" | u8 len(sn) | sn
                      | u64 command_id | u32 expires_at | session_nonce | body)

(integers big-endian). ``session_nonce`` is the broker's challenge nonce of the
lock's current session (16 bytes; empty when no session binding is used), so a
command captured in one session is refused in any other even by a lock that lost
its stored counter. The lock refuses a command whose MAC is wrong, whose id is not
above the last id it accepted (it persists that id), or whose expiry has passed.

The broker signs at delivery time (a command queued for an offline lock is signed
when the lock is back), so the expiry counts from delivery, not from queueing.
:class:`CommandVerifier` is the lock-side reference the firmware mirrors.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import keys
from .errors import SecurityError

CMD_LABEL = b"lockmq-cmd-v1"


def command_message(sn: str | bytes, command_id: int, expires_at: int,
                    session_nonce: bytes, body: bytes) -> bytes:
    """The exact bytes the command MAC covers."""
    s = keys.sn_bytes(sn)
    return (CMD_LABEL + bytes((len(s),)) + s + struct.pack(">QI", command_id, expires_at)
            + bytes(session_nonce) + bytes(body))


def command_mac(key: bytes, sn: str | bytes, command_id: int, expires_at: int,
                session_nonce: bytes, body: bytes) -> bytes:
    """HMAC-SHA256 of :func:`command_message` under the device key."""
    return keys.hmac_sha256(key, command_message(sn, command_id, expires_at, session_nonce, body))


@dataclass(frozen=True)
class SignedCommand:
    """What the broker puts in a downlink COMMAND frame besides the body."""

    sn: str
    command_id: int
    expires_at: int
    mac: bytes


class CommandRefused(SecurityError):
    """The lock-side refusal of a command (bad MAC, replay, expired)."""

    code_name = "FORBIDDEN"
    public_message = "command refused"


class CommandVerifier:
    """What a lock does with a signed command (reference for the firmware).

    Args:
        sn: the lock's SN.
        key: its device key.
        last_id: the highest command id it accepted so far (persisted by the lock).
    """

    def __init__(self, sn: str, key: bytes, last_id: int = 0) -> None:
        self.sn = sn
        self.key = key
        self.last_id = last_id

    def verify(self, command_id: int, expires_at: int, session_nonce: bytes, body: bytes,
               mac: bytes, now: float) -> None:
        """Accept the command (updating ``last_id``) or raise :class:`CommandRefused`."""
        want = command_mac(self.key, self.sn, command_id, expires_at, session_nonce, body)
        if not keys.equal(want, bytes(mac)):
            raise CommandRefused("command MAC does not verify", reason="bad_mac")
        if command_id <= self.last_id:
            raise CommandRefused(f"command id {command_id} <= last accepted {self.last_id}",
                                 reason="replayed")
        if now >= expires_at:
            raise CommandRefused(f"command expired at {expires_at}", reason="expired")
        self.last_id = command_id
