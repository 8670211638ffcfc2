"""Tokens for backend services and admin tools.

A token is ``lmq_<id>_<secret>``: a 16-hex-digit public id (for lookup, listing and
revocation) and 256 random bits of secret. The registry stores only the SHA-256 of
the secret, the permissions, the expiry and the revocation time; the token itself is
shown once, at creation.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from . import db, keys
from .principal import Permissions

PREFIX = "lmq_"
_ID_HEX = 16


@dataclass(frozen=True)
class TokenInfo:
    """A token's registry row (never its secret)."""

    id: str
    name: str
    permissions: Permissions
    created_at: float
    expires_at: float | None
    revoked_at: float | None

    def state(self, now: float | None = None) -> str:
        """``active``, ``expired`` or ``revoked``."""
        now = time.time() if now is None else now
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``lockmq tokens list --json``."""
        return {"id": self.id, "name": self.name, "permissions": self.permissions.to_dict(),
                "created_at": self.created_at, "expires_at": self.expires_at,
                "revoked_at": self.revoked_at, "state": self.state()}


class TokenError(ValueError):
    """A token that is malformed, unknown, revoked or expired (``reason`` says which)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def parse_token(token: str) -> tuple[str, str]:
    """Split ``lmq_<id>_<secret>`` into ``(id, secret)``; ``TokenError`` if malformed."""
    if (not isinstance(token, str) or not token.startswith(PREFIX)
            or len(token) < len(PREFIX) + _ID_HEX + 2 or len(token) > 200
            or token[len(PREFIX) + _ID_HEX] != "_"):
        raise TokenError("malformed_token", "token is not of the form lmq_<id>_<secret>")
    tid = token[len(PREFIX):len(PREFIX) + _ID_HEX]
    if any(c not in "0123456789abcdef" for c in tid):
        raise TokenError("malformed_token", "token id is not hex")
    return tid, token[len(PREFIX) + _ID_HEX + 1:]


class TokenStore:
    """Tokens in the security registry file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db: sqlite3.Connection = db.connect(path)

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def create(self, name: str, permissions: Permissions,
               ttl_s: float | None = None, now: float | None = None) -> tuple[str, TokenInfo]:
        """Create a token; return ``(token_string, info)``. The string is shown once.

        ``ttl_s`` None means no expiry (discouraged; the CLI defaults to 90 days).
        """
        if not name or len(name) > 64 or not name.isprintable():
            raise ValueError("token name must be 1-64 printable characters")
        permissions.validate()   # a malformed command right is refused, not stored
        now = time.time() if now is None else now
        tid = secrets.token_hex(_ID_HEX // 2)
        secret = secrets.token_urlsafe(32)
        expires = None if ttl_s is None else now + ttl_s
        self._db.execute(
            "INSERT INTO tokens(id, name, secret_hash, perms, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (tid, name, keys.token_hash(secret), json.dumps(permissions.to_dict()), now, expires))
        return f"{PREFIX}{tid}_{secret}", TokenInfo(tid, name, permissions, now, expires, None)

    def verify(self, token: str, now: float | None = None) -> TokenInfo:
        """The info of a valid token; ``TokenError`` (with a reason) otherwise.

        The secret is compared in constant time against the stored hash.
        """
        tid, secret = parse_token(token)
        row = self._db.execute(
            "SELECT id, name, perms, created_at, expires_at, revoked_at, secret_hash "
            "FROM tokens WHERE id=?", (tid,)).fetchone()
        # Hash even when the id is unknown so both paths cost the same.
        digest = keys.token_hash(secret)
        if row is None or not keys.equal(digest, row[6]):
            raise TokenError("bad_token", f"unknown token id {tid} or wrong secret")
        info = _info(row)
        state = info.state(now)
        if state != "active":
            raise TokenError(f"token_{state}", f"token {tid} ({info.name}) is {state}")
        return info

    def get(self, tid: str) -> TokenInfo | None:
        """The row of token ``tid`` (any state), or None: what the broker re-reads when
        a deferred item takes effect (``lockmq.broker.admission``)."""
        row = self._db.execute("SELECT id, name, perms, created_at, expires_at, revoked_at "
                               "FROM tokens WHERE id=?", (tid,)).fetchone()
        return None if row is None else _info(row)

    def active_by_name(self, name: str, now: float | None = None) -> list[TokenInfo]:
        """The active tokens named ``name`` (items stored before token ids were kept)."""
        rows = self._db.execute("SELECT id, name, perms, created_at, expires_at, revoked_at "
                                "FROM tokens WHERE name=?", (name,)).fetchall()
        return [i for i in map(_info, rows) if i.state(now) == "active"]

    def not_active(self, now: float | None = None) -> set[str]:
        """Ids of every revoked or expired token."""
        now = time.time() if now is None else now
        return {r[0] for r in self._db.execute(
            "SELECT id FROM tokens WHERE revoked_at IS NOT NULL OR "
            "(expires_at IS NOT NULL AND expires_at <= ?)", (now,))}

    def revoke(self, tid: str, now: float | None = None) -> bool:
        """Revoke token ``tid`` (or every token of a name); False if none was active."""
        now = time.time() if now is None else now
        cur = self._db.execute(
            "UPDATE tokens SET revoked_at=? WHERE (id=? OR name=?) AND revoked_at IS NULL",
            (now, tid, tid))
        return cur.rowcount > 0

    def list(self) -> list[TokenInfo]:
        """Every token, newest first."""
        rows = self._db.execute(
            "SELECT id, name, perms, created_at, expires_at, revoked_at FROM tokens "
            "ORDER BY created_at DESC").fetchall()
        return [_info(r) for r in rows]


def _info(row: tuple[Any, ...]) -> TokenInfo:
    return TokenInfo(id=row[0], name=row[1], permissions=Permissions.from_dict(json.loads(row[2])),
                     created_at=float(row[3]),
                     expires_at=None if row[4] is None else float(row[4]),
                     revoked_at=None if row[5] is None else float(row[5]))


def parse_duration(text: str) -> float | None:
    """``90d``, ``12h``, ``30m``, ``45s`` or ``never`` → seconds (None for never)."""
    text = text.strip().lower()
    if text in ("never", "none", "0"):
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text and text[-1] in units:
        value = float(text[:-1])
        mult = units[text[-1]]
    else:
        value, mult = float(text), 1
    if value <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return value * mult
