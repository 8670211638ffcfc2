"""lockmq.security: identity, permissions, TLS and limits of the broker.

The broker uses one :class:`Guard`; the CLI uses :class:`DeviceRegistry` and
:class:`TokenStore` directly. See docs/security.md.
"""

from .commands import CommandRefused, CommandVerifier, SignedCommand, command_mac
from .config import SecurityConfig
from .errors import (AuthFailed, AuthRateLimited, AuthTimeout, ConnectionRefused, FrameTooLarge,
                     IdentityMismatch, Replayed, TokenExpired,
                     LimitExceeded, PermissionDenied, RateLimited, SecurityError)
from .guard import METHOD_DEVICE, METHOD_TOKEN, BrokerGuard, Guard
from .keys import device_proof, hmac_sha256, session_key
from .principal import Permissions, Principal
from .registry import DeviceRegistry, check_sn, provisioning_config
from .tokens import TokenStore

__all__ = [
    "BrokerGuard", "Guard", "Principal", "Permissions", "SecurityConfig",
    "SecurityError", "AuthFailed", "AuthRateLimited", "PermissionDenied", "IdentityMismatch",
    "LimitExceeded", "ConnectionRefused", "RateLimited", "Replayed", "TokenExpired",
    "AuthTimeout", "FrameTooLarge",
    "DeviceRegistry", "TokenStore", "check_sn", "provisioning_config",
    "CommandRefused", "CommandVerifier", "SignedCommand", "command_mac",
    "device_proof", "hmac_sha256", "session_key",
    "METHOD_DEVICE", "METHOD_TOKEN",
]
