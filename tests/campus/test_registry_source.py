"""``replica.security`` names the primary's master key by its fingerprint in every
answer (a standby asks every ``registry_every_s``): the key file is read once, and
again only when it changed (replaced, chmodded, removed)."""

from __future__ import annotations

import asyncio
import os

import pytest

from lockmq.admin_error import AdminError
from lockmq.replication.registry_source import RegistrySource
from lockmq.security import keys


def test_the_master_key_is_read_once_and_again_when_the_file_changes(tmp_path, monkeypatch):
    key_path = str(tmp_path / "master.key")
    first = keys.master_key_fingerprint(keys.load_or_create_master_key(key_path))
    reads: list[str] = []
    real_read = keys.read_master_key

    def counted(path: str) -> bytes | None:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(keys, "read_master_key", counted)
    source = RegistrySource(str(tmp_path / "security.db"), key_path)

    def serve() -> dict:
        return asyncio.run(source.serve({}))

    try:
        assert [serve()["key_fingerprint"] for _ in range(3)] == [first] * 3
        assert len(reads) == 1                       # read once for three answers

        os.replace(key_path, str(tmp_path / "old.key"))   # a new key in its place
        second = keys.master_key_fingerprint(keys.load_or_create_master_key(key_path))
        assert second != first
        assert serve()["key_fingerprint"] == second
        assert len(reads) == 2

        os.chmod(key_path, 0o644)                    # checked again: a leaked mode fails
        with pytest.raises(AdminError, match="readable by group/others"):
            serve()
        os.chmod(key_path, 0o600)
        assert serve()["key_fingerprint"] == second

        os.remove(key_path)                          # no key: no fingerprint
        assert serve()["key_fingerprint"] == ""
    finally:
        source.close()
