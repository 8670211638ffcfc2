"""The standby's copy of the primary's security registry (``security.db``).

Now and then (``registry_every_s``, at the first connect, and once more before
promotion) the follower asks ``replica.security`` with the version it holds; a
changed registry comes as a snapshot in chunks, checked against its SHA-256 and
installed whole (write, fsync, rename, fsync the directory) -- the standby serves no
one while it follows, so nothing has the file open. The master key is never sent:
the operator copies ``master.key`` once; the first answer's fingerprint must match
ours, or the standby refuses to follow (:class:`MasterKeyMismatch`).
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

from lockmq.client.errors import AdminError
from lockmq.security import db, keys

#: the largest registry a standby accepts (it holds one whole snapshot in memory)
MAX_REGISTRY_BYTES = 256 << 20


class MasterKeyMismatch(RuntimeError):
    """The standby's master key is not the primary's: its device keys would not
    unwrap here, so following would promote a gateway no lock can log in to."""


class RegistryCopy:
    """The registry file at ``db_path`` kept equal to the primary's."""

    def __init__(self, db_path: str, master_key_path: str) -> None:
        self.db_path = db_path
        self.master_key_path = master_key_path
        self.version = self._version_on_disk()
        self.key_checked = False
        #: False once the primary answered that it has no such op (an older lockmq)
        self.supported = True

    def _version_on_disk(self) -> str:
        """The SHA-256 of the file, as the primary names its snapshots; "" if there is
        none or a WAL beside it (not a snapshot we installed: fetch anew)."""
        if not os.path.exists(self.db_path) or os.path.exists(self.db_path + "-wal"):
            return ""
        with open(self.db_path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()

    def check_key(self, fingerprint: str) -> None:
        """Raise :class:`MasterKeyMismatch` unless our master key is the primary's."""
        try:
            ours = keys.master_key_fingerprint(keys.read_master_key(self.master_key_path))
        except ValueError as exc:
            raise MasterKeyMismatch(str(exc)) from None
        if ours != fingerprint:
            what = "has no master key" if not ours else "has a different master key"
            raise MasterKeyMismatch(
                f"this standby {what} ({self.master_key_path}) than the primary's: device "
                "keys in the replicated registry would not unwrap after promotion; copy "
                "the primary's master.key here (mode 0600) and start the standby again")
        self.key_checked = True

    async def sync(self, admin: Any) -> bool:
        """Fetch and install the primary's registry if it changed; True if installed."""
        if not self.supported:
            return False
        for _attempt in range(3):   # (a registry written during the transfer: again)
            data, version = await self._fetch(admin)
            if not version:
                return False
            if hashlib.sha256(data).hexdigest() == version:
                db.install(self.db_path, data)
                self.version = version
                return True
        return False

    async def _fetch(self, admin: Any) -> tuple[bytes, str]:
        """The primary's snapshot and its version; ``(b"", "")`` if nothing is new."""
        parts: list[bytes] = []
        got = 0
        version = ""
        while True:
            try:
                resp = await admin.request("replica.security", have=self.version, offset=got)
            except AdminError as exc:   # (AsyncAdmin raises every refusal)
                if "unknown op" not in str(exc):
                    raise
                self.supported = False   # an older primary: the operator copies
                return b"", ""
            self.check_key(str(resp.get("key_fingerprint", "")))
            new = str(resp.get("version") or "")
            if not new or new == self.version:
                return b"", ""
            size = int(resp.get("size", 0))
            if size > MAX_REGISTRY_BYTES:
                raise RuntimeError(f"the primary's registry is {size} bytes, over the "
                                   f"standby's limit of {MAX_REGISTRY_BYTES}")
            if version and new != version:
                return b"", version   # changed between chunks: the hash check fails
            version = new
            chunk = base64.b64decode(resp.get("data") or "")
            parts.append(chunk)
            got += len(chunk)
            if got >= size or not chunk:
                return b"".join(parts), version
