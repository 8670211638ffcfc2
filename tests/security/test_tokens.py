"""Tokens on real SQLite: only hashes stored, expiry, revocation, permissions."""

from __future__ import annotations

import pytest

from lockmq.security import Permissions, TokenStore
from lockmq.security.tokens import TokenError, parse_duration, parse_token


@pytest.fixture
def store(tmp_path):
    s = TokenStore(str(tmp_path / "security.db"))
    yield s
    s.close()


def test_create_verify_and_only_hash_stored(store):
    token, info = store.create("billing", Permissions(consume=("lock.*:billing",)), ttl_s=3600)
    assert token.startswith("lmq_") and info.id in token
    got = store.verify(token)
    assert got.name == "billing" and got.permissions.consume == ("lock.*:billing",)
    secret = parse_token(token)[1]
    raw = open(store.path, "rb").read()
    wal = open(store.path + "-wal", "rb").read()
    assert secret.encode() not in raw + wal


def test_wrong_secret_unknown_id_malformed(store):
    token, _ = store.create("svc", Permissions())
    tid, secret = parse_token(token)
    for bad, reason in ((f"lmq_{tid}_{secret[:-1]}x", "bad_token"),
                        (f"lmq_{'0' * 16}_{secret}", "bad_token"),
                        ("nope", "malformed_token"), ("lmq_zz", "malformed_token")):
        with pytest.raises(TokenError) as ei:
            store.verify(bad)
        assert ei.value.reason == reason


def test_expired_and_revoked(store):
    token, info = store.create("short", Permissions(), ttl_s=10, now=1000.0)
    assert store.verify(token, now=1009.0).id == info.id
    with pytest.raises(TokenError) as ei:
        store.verify(token, now=1010.0)
    assert ei.value.reason == "token_expired"
    t2, i2 = store.create("gone", Permissions())
    assert store.revoke(i2.id) and not store.revoke(i2.id)
    with pytest.raises(TokenError) as ei:
        store.verify(t2)
    assert ei.value.reason == "token_revoked"
    states = {t.name: t.state(now=2000.0) for t in store.list()}
    assert states == {"short": "expired", "gone": "revoked"}


def test_durations():
    assert parse_duration("90d") == 90 * 86400
    assert parse_duration("12h") == 43200
    assert parse_duration("never") is None
    with pytest.raises(ValueError):
        parse_duration("-1h")
