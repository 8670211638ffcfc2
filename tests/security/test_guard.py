"""The Guard, unit level: real registry, real HMAC, fake clock.

Each refusal the issue lists is checked for its wire code, its log line and its
counter.
"""

from __future__ import annotations

import logging
import os
import time

import pytest

from lockmq.protocol import Auth, AuthMethod, Command, CommandKind, ErrorCode, auth_proof
from lockmq.security import (AuthFailed, AuthRateLimited, CommandRefused, CommandVerifier,
                             ConnectionRefused, IdentityMismatch, Permissions, PermissionDenied,
                             RateLimited, Replayed, TokenExpired)
from lockmq.security.keys import device_proof


def lock_auth(key: bytes, sn: str, nonce: bytes, cnonce: bytes | None = None) -> Auth:
    cnonce = cnonce or os.urandom(16)
    # (over an empty transcript: Guard.authenticate's default; the broker always passes
    # its session's, tests/adversarial/test_transcript.py)
    return Auth(AuthMethod.DEVICE_HMAC, cnonce, auth_proof(key, nonce, cnonce, sn, b""))


def token_auth(token: str) -> Auth:
    return Auth(AuthMethod.TOKEN, os.urandom(16), token.encode())


def test_host_proof_equals_protocol_proof():
    key, nonce, cnonce = os.urandom(32), os.urandom(16), os.urandom(16)
    th = os.urandom(32)
    assert device_proof(key, nonce, cnonce, "SN-1", th) == auth_proof(key, nonce, cnonce, "SN-1", th)
    assert device_proof(key, nonce, cnonce, "SN-1", th) != auth_proof(key, nonce, cnonce, "SN-1", b"")


def test_lock_authenticates_and_is_bound(guard):
    key = guard.registry.add("LOCK-1")
    nonce = guard.challenge()
    p = guard.authenticate("LOCK-1", lock_auth(key, "LOCK-1", nonce), nonce, "10.0.0.5")
    assert (p.name, p.kind, p.is_admin, p.peer_ip) == ("LOCK-1", "lock", False, "10.0.0.5")
    assert p.may_publish("lock.events") and p.may_publish("locks.LOCK-1.alarm")
    assert not p.may_publish("locks.LOCK-2.alarm") and not p.may_publish("$devices")
    assert not p.may_consume("lock.events", "x") and not p.may_command("LOCK-1")
    assert p.may_receive_command("LOCK-1") and not p.may_receive_command("LOCK-2")
    guard.check_publish(p, "lock.events", sn="LOCK-1")
    guard.check_publish(p, "lock.events", sn=b"LOCK-1")


def test_unknown_sn_and_wrong_key_look_the_same(guard, caplog):
    guard.registry.add("LOCK-2")
    caplog.set_level(logging.INFO, "lockmq.security")
    errors = []
    for sn, key in (("NOPE-9", os.urandom(32)), ("LOCK-2", os.urandom(32))):
        nonce = guard.challenge()
        with pytest.raises(AuthFailed) as ei:
            guard.authenticate(sn, lock_auth(key, sn, nonce), nonce, "10.0.0.6")
        errors.append(ei.value)
    a, b = errors
    assert type(a) is type(b) is AuthFailed
    assert a.code == b.code == ErrorCode.AUTH_FAILED
    assert a.public_message == b.public_message
    assert (a.reason, b.reason) == ("unknown_sn", "bad_proof")
    assert guard.metrics.get("auth_failed", "unknown_sn") == 1
    assert guard.metrics.get("auth_failed", "bad_proof") == 1
    assert "auth_failed reason=unknown_sn sn=NOPE-9 addr=10.0.0.6" in caplog.text
    assert "auth_failed reason=bad_proof sn=LOCK-2" in caplog.text


def test_disabled_device_is_refused_like_unknown(guard):
    key = guard.registry.add("LOCK-3")
    guard.registry.set_enabled("LOCK-3", False)
    nonce = guard.challenge()
    with pytest.raises(AuthFailed) as ei:
        guard.authenticate("LOCK-3", lock_auth(key, "LOCK-3", nonce), nonce, "10.0.0.7")
    assert ei.value.code == ErrorCode.AUTH_FAILED and ei.value.reason == "device_disabled"


def test_replayed_challenge_answer_is_refused(guard, caplog):
    caplog.set_level(logging.INFO, "lockmq.security")
    key = guard.registry.add("LOCK-4")
    nonce = guard.challenge()
    answer = lock_auth(key, "LOCK-4", nonce)
    guard.authenticate("LOCK-4", answer, nonce, "10.0.0.8")
    # the same answer on the same nonce (nonce is single-use) ...
    with pytest.raises(Replayed) as ei:
        guard.authenticate("LOCK-4", answer, nonce, "10.0.0.8")
    assert ei.value.code == ErrorCode.REPLAY
    # ... and a recorded answer played on a new connection (fresh nonce)
    fresh = guard.challenge()
    with pytest.raises(Replayed):
        guard.authenticate("LOCK-4", answer, fresh, "10.0.0.9")
    # a nonce the broker never issued
    with pytest.raises(Replayed):
        guard.authenticate("LOCK-4", lock_auth(key, "LOCK-4", b"x" * 16), b"x" * 16, "10.0.0.9")
    assert guard.metrics.get("auth_failed", "replayed") == 3
    assert "auth_failed reason=replayed sn=LOCK-4" in caplog.text


def test_stale_nonce_is_refused(guard, clock):
    key = guard.registry.add("LOCK-5")
    nonce = guard.challenge()
    clock.advance(guard.cfg.nonce_ttl_s + 1)
    with pytest.raises(Replayed):
        guard.authenticate("LOCK-5", lock_auth(key, "LOCK-5", nonce), nonce, "10.0.0.10")


def test_frame_claiming_another_sn_is_refused(guard, caplog):
    caplog.set_level(logging.INFO, "lockmq.security")
    key = guard.registry.add("LOCK-6")
    nonce = guard.challenge()
    p = guard.authenticate("LOCK-6", lock_auth(key, "LOCK-6", nonce), nonce, "10.0.0.11")
    with pytest.raises(IdentityMismatch) as ei:
        guard.check_publish(p, "lock.events", sn="LOCK-7")
    assert ei.value.code == ErrorCode.SN_MISMATCH and ei.value.close
    with pytest.raises(IdentityMismatch):
        guard.check_frame_sn(p, b"\xff\xfe")
    with pytest.raises(PermissionDenied):
        guard.check_publish(p, "locks.LOCK-7.events", sn="LOCK-6")
    assert guard.metrics.get("sn_mismatch") == 2
    assert "sn_mismatch reason=sn_mismatch name=LOCK-6 kind=lock claimed=LOCK-7" in caplog.text


def test_service_permissions(guard, caplog):
    caplog.set_level(logging.INFO, "lockmq.security")
    token, _ = guard.tokens.create("billing", Permissions(
        publish=("billing.*",), consume=("lock.*:billing",), command=("LOCK-1*",)))
    nonce = guard.challenge()
    p = guard.authenticate("", token_auth(token), nonce, "127.0.0.1")
    assert (p.name, p.kind) == ("billing", "service")
    guard.check_consume(p, "lock.events", "billing")
    guard.registry.add("LOCK-10")      # commands go only to registered locks
    guard.check_command(p, "LOCK-10")
    guard.check_publish(p, "billing.out")
    for call in (lambda: guard.check_consume(p, "lock.events", "audit"),
                 lambda: guard.check_consume(p, "hr.events", "billing"),
                 lambda: guard.check_command(p, "LOCK-2"),
                 lambda: guard.check_publish(p, "lock.events"),
                 lambda: guard.check_admin(p, "dlq_replay")):
        with pytest.raises(PermissionDenied) as ei:
            call()
        assert ei.value.code == ErrorCode.FORBIDDEN
    assert guard.metrics.get("permission_denied") == 5
    assert "permission_denied reason=command_denied name=billing kind=service target=LOCK-2" \
        in caplog.text


def test_service_cannot_pose_as_a_lock(guard):
    guard.registry.add("LOCK-8")
    token, _ = guard.tokens.create("svc", Permissions(publish=("*",)))
    nonce = guard.challenge()
    with pytest.raises(AuthFailed) as ei:
        guard.authenticate("LOCK-8", token_auth(token), nonce, "127.0.0.1")
    assert ei.value.reason == "token_claims_lock"
    nonce = guard.challenge()
    p = guard.authenticate("svc-1", token_auth(token), nonce, "127.0.0.1")
    with pytest.raises(IdentityMismatch):
        guard.check_publish(p, "lock.events", sn="LOCK-8")


def test_expired_token_is_refused(guard, wall, caplog):
    caplog.set_level(logging.INFO, "lockmq.security")
    token, _ = guard.tokens.create("temp", Permissions(admin=True), ttl_s=60, now=wall())
    wall.advance(61)
    nonce = guard.challenge()
    with pytest.raises(TokenExpired) as ei:
        guard.authenticate("", token_auth(token), nonce, "127.0.0.1")
    assert ei.value.code == ErrorCode.TOKEN_EXPIRED
    assert guard.metrics.get("auth_failed", "token_expired") == 1
    assert "auth_failed reason=token_expired" in caplog.text


def test_token_over_plain_tcp_from_afar_is_refused(guard):
    token, _ = guard.tokens.create("remote", Permissions(admin=True))
    nonce = guard.challenge()
    with pytest.raises(AuthFailed) as ei:
        guard.authenticate("", token_auth(token), nonce, "192.168.1.50")
    assert ei.value.reason == "plain_token"
    nonce = guard.challenge()
    assert guard.authenticate("", token_auth(token), nonce, "192.168.1.50", tls=True).is_admin


def test_replayed_downlink_command_is_refused_by_the_lock(guard, wall):
    key = guard.registry.add("LOCK-9")
    lock = CommandVerifier("LOCK-9", key)
    signed = guard.sign("LOCK-9", CommandKind.UNLOCK, b"\x00\x05")
    body = signed.to_body()
    now_ms = int(wall() * 1000)
    lock.verify(body, now_ms)                       # runs once
    with pytest.raises(CommandRefused) as ei:
        lock.verify(body, now_ms)                   # the same frame again
    assert ei.value.reason == "replayed"
    forged = Command("LOCK-9", signed.cmd_id + 1, signed.expires_ms, CommandKind.UNLOCK,
                     b"\x00\x05", os.urandom(32))
    with pytest.raises(CommandRefused) as ei:
        lock.verify(forged, now_ms)
    assert ei.value.reason == "bad_mac"
    late = guard.sign("LOCK-9", CommandKind.UNLOCK, b"\x00\x05", ttl_s=1).to_body()
    with pytest.raises(CommandRefused) as ei:
        lock.verify(late, now_ms + 2000)
    assert ei.value.reason == "expired"
    other = CommandVerifier("LOCK-X", key)
    with pytest.raises(CommandRefused):
        other.verify(guard.sign("LOCK-9", CommandKind.REBOOT).to_body(), now_ms)
    assert guard.next_command_id("LOCK-9") > signed.cmd_id


def test_failed_attempts_are_rate_limited_per_source_and_sn(guard, clock):
    # (This test used to assert that a blocked address waited out its window even with
    # the right key -- the lock-out of issue 10 item 7. Now failures only ever change
    # how *failed* attempts are answered, and only for the source that fails.)
    guard.registry.add("LOCK-A")
    for i in range(guard.cfg.auth_fail_per_address):
        nonce = guard.challenge()
        with pytest.raises(AuthFailed) as ei:
            guard.authenticate(f"X{i}", lock_auth(os.urandom(32), f"X{i}", nonce), nonce, "10.1.1.1")
        assert not isinstance(ei.value, AuthRateLimited)
    nonce = guard.challenge()
    with pytest.raises(AuthRateLimited) as ei:
        guard.authenticate("X0", lock_auth(os.urandom(32), "X0", nonce), nonce, "10.1.1.1")
    assert ei.value.code == ErrorCode.RATE_LIMITED and ei.value.retry_after_ms > 0
    # per (source, SN): one source failing for LOCK-A ...
    for i in range(guard.cfg.auth_fail_per_sn):
        nonce = guard.challenge()
        with pytest.raises(AuthFailed) as ei:
            guard.authenticate("LOCK-A", lock_auth(os.urandom(32), "LOCK-A", nonce), nonce,
                               "10.2.0.1")
        assert not isinstance(ei.value, AuthRateLimited)
    nonce = guard.challenge()
    with pytest.raises(AuthRateLimited):
        guard.authenticate("LOCK-A", lock_auth(os.urandom(32), "LOCK-A", nonce), nonce, "10.2.0.1")
    # ... does not penalise another source failing for the same SN
    nonce = guard.challenge()
    with pytest.raises(AuthFailed) as ei:
        guard.authenticate("LOCK-A", lock_auth(os.urandom(32), "LOCK-A", nonce), nonce, "10.3.0.1")
    assert not isinstance(ei.value, AuthRateLimited)
    assert guard.metrics.get("auth_rate_limited", "per_address") == 1
    assert guard.metrics.get("auth_rate_limited", "per_source_sn") == 1
    # the real lock's correct proof gets in at once, from anywhere -- also from the
    # very sources that are rate-limited (a NAT it shares with the attacker)
    key = guard.registry.rekey("LOCK-A")
    for src in ("10.4.0.1", "10.2.0.1", "10.1.1.1"):
        nonce = guard.challenge()
        assert guard.authenticate("LOCK-A", lock_auth(key, "LOCK-A", nonce), nonce, src)
    # the windows end
    clock.advance(guard.cfg.auth_fail_window_s)
    nonce = guard.challenge()
    with pytest.raises(AuthFailed) as ei:
        guard.authenticate("X0", lock_auth(os.urandom(32), "X0", nonce), nonce, "10.1.1.1")
    assert not isinstance(ei.value, AuthRateLimited)


def test_one_prefix_policy_for_ipv4_and_ipv6(tmp_path, clock):
    from lockmq.security import Guard, SecurityConfig
    g = Guard(SecurityConfig(data_dir=str(tmp_path), limit_exempt_addresses=["10.9.0.0/16"],
                             max_connections_per_address=2, auth_fail_per_address=1,
                             ipv4_prefix=24, ipv6_prefix=64), clock=clock)
    try:
        src = g.sources
        assert src.key("10.0.0.7") == src.key("10.0.0.200") == "10.0.0.0/24"
        assert src.key("::ffff:10.0.0.9") == "10.0.0.0/24"       # IPv4-mapped: IPv4
        assert src.key("2001:db8:1:2::5") == src.key("2001:db8:1:2:ffff::1") \
            == "2001:db8:1:2::/64"
        assert src.key("2001:db8:1:3::5") != src.key("2001:db8:1:2::5")
        assert src.exempt("10.9.3.4") and not src.exempt("10.8.3.4")
        # the connection cap counts the same source as the failure counter
        g.admit("2001:db8:1:2::5")
        g.admit("2001:db8:1:2::6")
        with pytest.raises(ConnectionRefused) as ei:
            g.admit("2001:db8:1:2::7")
        assert ei.value.limit == "max_connections_per_address"
        g.admit("2001:db8:1:3::7")          # another /64
        for ip in ("2001:db8:1:2::8", "2001:db8:1:2::9"):
            nonce = g.challenge()
            with pytest.raises(AuthFailed) as ei:
                g.authenticate("Y", token_auth("lmq_nope"), nonce, ip)
        assert isinstance(ei.value, AuthRateLimited)   # the 2nd address of the same /64
    finally:
        g.close()


def test_connection_limits(guard, clock):
    cfg = guard.cfg
    for _ in range(cfg.max_connections_per_address):
        guard.admit("10.9.9.9")
        clock.advance(1.0)
    with pytest.raises(ConnectionRefused) as ei:
        guard.admit("10.9.9.9")
    assert ei.value.limit == "max_connections_per_address"
    assert ei.value.code == ErrorCode.TOO_MANY_CONNECTIONS
    guard.release("10.9.9.9")
    guard.admit("10.9.9.9")
    # connect rate: a burst from a new address
    for _ in range(cfg.connect_burst):
        guard.admit("10.8.8.8")
        guard.release("10.8.8.8")
    with pytest.raises(ConnectionRefused) as ei:
        guard.admit("10.8.8.8")
    assert ei.value.limit == "connect_rate" and ei.value.retry_after_ms > 0
    assert guard.metrics.get("connection_refused", "connect_rate") == 1
    assert guard.connections.open_from("10.8.8.8") == 0


def test_max_connections_total(tmp_path, clock):
    from lockmq.security import Guard, SecurityConfig
    g = Guard(SecurityConfig(data_dir=str(tmp_path), max_connections=3), clock=clock)
    try:
        for i in range(3):
            g.admit(f"10.0.{i}.1")
        with pytest.raises(ConnectionRefused) as ei:
            g.admit("127.0.0.1")          # exempt from per-address limits, not from the total
        assert ei.value.limit == "max_connections"
    finally:
        g.close()


def test_lock_message_rate(guard, clock):
    key = guard.registry.add("LOCK-R")
    nonce = guard.challenge()
    p = guard.authenticate("LOCK-R", lock_auth(key, "LOCK-R", nonce), nonce, "10.0.0.12")
    guard.check_publish(p, "lock.events", n=guard.cfg.lock_message_burst)
    with pytest.raises(RateLimited) as ei:
        guard.check_publish(p, "lock.events")
    assert ei.value.code == ErrorCode.RATE_LIMITED and not ei.value.close
    clock.advance(1.0)
    guard.check_publish(p, "lock.events")
    assert guard.metrics.get("rate_limited", "lock_message_rate") == 1


def test_publish_quota_grants_what_check_publish_would(guard, clock):
    # the broker checks a read's run of publishes to one topic in one step: the same
    # records pass as with one check_publish each, and it refuses (audits) nothing
    key = guard.registry.add("LOCK-Q")
    nonce = guard.challenge()
    p = guard.authenticate("LOCK-Q", lock_auth(key, "LOCK-Q", nonce), nonce, "10.0.0.14")
    burst = guard.cfg.lock_message_burst
    assert guard.publish_quota(p, "lock.events", burst - 3) == burst - 3
    assert guard.publish_quota(p, "lock.events", 10) == 3       # the rest of the burst
    assert guard.publish_quota(p, "lock.events", 10) == 0
    with pytest.raises(RateLimited):
        guard.check_publish(p, "lock.events")
    clock.advance(2.5 / guard.cfg.lock_message_rate)            # 2.5 messages' worth
    assert guard.publish_quota(p, "lock.events", 10) == 2
    guard.check_publish(p, "lock.events", n=0)                  # (half a token is left)
    with pytest.raises(RateLimited):
        guard.check_publish(p, "lock.events")
    assert guard.publish_quota(p, "$sys.x", 5) == 0 and guard.publish_quota(p, "other", 5) == 0
    assert guard.metrics.get("rate_limited", "lock_message_rate") == 2   # check_publish's only


def test_frame_and_buffer_limits(guard):
    from lockmq.security import FrameTooLarge, LimitExceeded
    guard.check_frame_size(guard.max_frame_bytes)
    with pytest.raises(FrameTooLarge) as ei:
        guard.check_frame_size(guard.max_frame_bytes + 1)
    assert ei.value.code == ErrorCode.FRAME_TOO_LARGE and ei.value.close
    with pytest.raises(LimitExceeded) as ei:
        guard.check_buffered(guard.max_buffered_bytes + 1)
    assert ei.value.limit == "max_buffered_bytes"


def test_auth_timeout_is_logged_and_counted(guard, caplog):
    caplog.set_level(logging.INFO, "lockmq.security")
    nonce = guard.challenge()
    err = guard.auth_timed_out("10.0.0.13", nonce)
    assert err.code == ErrorCode.AUTH_TIMEOUT
    assert len(guard.nonces) == 0 and guard.metrics.get("auth_timeout") == 1
    assert "auth_timeout reason=auth_timeout addr=10.0.0.13" in caplog.text


def test_tracking_tables_stay_bounded(tmp_path, clock):
    from lockmq.security import Guard, SecurityConfig
    g = Guard(SecurityConfig(data_dir=str(tmp_path), max_tracked_keys=100,
                             limit_exempt_addresses=[]), clock=clock)
    try:
        for i in range(1000):
            g.challenge()
            nonce = g.challenge()
            with pytest.raises(AuthFailed):
                g.authenticate(f"S{i}", lock_auth(os.urandom(32), f"S{i}", nonce), nonce,
                               f"10.{i // 250}.{i % 250}.1")
        assert len(g.nonces) <= 100
        assert len(g._fail_sn._fails) <= 100 and len(g._fail_addr._fails) <= 100
    finally:
        g.close()


def test_broker_log_sink_gets_events(tmp_path, clock):
    from lockmq.security import Guard, SecurityConfig
    seen = []
    g = Guard(SecurityConfig(data_dir=str(tmp_path)), clock=clock,
              log=lambda event, level="info", **f: seen.append((event, level, f)))
    try:
        nonce = g.challenge()
        with pytest.raises(AuthFailed):
            g.authenticate("Q1", lock_auth(os.urandom(32), "Q1", nonce), nonce, "10.0.0.1")
        assert seen[-1][0] == "security_auth_failed" and seen[-1][1] == "warning"
        assert seen[-1][2]["reason"] == "unknown_sn"
        assert 'security_auth_failed_total{reason="unknown_sn"}' in g.status()
    finally:
        g.close()


def test_from_broker_config(tmp_path):
    from lockmq.config import load_config
    from lockmq.security import Guard
    cfg = load_config(overrides={"broker": {"data_dir": str(tmp_path), "max_frame": 4096},
                                 "security": {"lock_message_rate": 5}})
    g = Guard.from_broker_config(cfg)
    try:
        assert g.max_frame_bytes == 4096 and g.cfg.lock_message_rate == 5.0
    finally:
        g.close()
    with pytest.raises(ValueError, match="security.nope"):
        Guard.from_broker_config(load_config(overrides={"broker": {"data_dir": str(tmp_path)},
                                                        "security": {"nope": 1}}))


def test_log_lines_are_rate_limited_but_counters_count_everything(tmp_path, clock):
    from lockmq.security import Guard, SecurityConfig
    from lockmq.security.audit import LOG_BURST
    seen = []
    g = Guard(SecurityConfig(data_dir=str(tmp_path), limit_exempt_addresses=[],
                             auth_fail_per_address=10**6, auth_fail_per_sn=10**6),
              clock=clock, log=lambda event, level="info", **f: seen.append((event, f)))
    try:
        n = LOG_BURST + 300
        for i in range(n):
            g.record_protocol_error(f"10.0.{i % 200}.1", "BadChecksum")
        assert g.metrics.get("bad_frame") == n
        lines = [f for e, f in seen if e == "security_bad_frame"]
        assert LOG_BURST <= len(lines) < n
        time.sleep(0.2)   # the log budget uses the real monotonic clock
        g.record_protocol_error("10.9.9.9", "BadChecksum")
        last = [f for e, f in seen if e == "security_bad_frame"][-1]
        assert last.get("suppressed", 0) >= 1
    finally:
        g.close()


def test_service_cannot_claim_a_disabled_locks_sn_either(guard):
    guard.registry.add("LOCK-OFF")
    guard.registry.set_enabled("LOCK-OFF", False)
    token, _ = guard.tokens.create("svc2", Permissions(publish=("*",)))
    nonce = guard.challenge()
    with pytest.raises(AuthFailed) as ei:
        guard.authenticate("LOCK-OFF", token_auth(token), nonce, "127.0.0.1")
    assert ei.value.reason == "token_claims_lock"


def test_registry_lookup_states(guard):
    key = guard.registry.add("LOCK-L")
    assert guard.registry.lookup("LOCK-L") == (key, "enabled")
    guard.registry.set_enabled("LOCK-L", False)
    assert guard.registry.lookup("LOCK-L") == (None, "disabled")
    assert guard.registry.lookup("NOPE") == (None, "unknown")


def test_producer_ids_reserved_lookalike_and_owned(guard):
    guard.registry.add("LOCK-20")
    tok_a, _ = guard.tokens.create("svc-a", Permissions(publish=("*",)))
    tok_b, _ = guard.tokens.create("svc-b", Permissions(publish=("*",)))
    adm, _ = guard.tokens.create("ops", Permissions(admin=True))
    for claimed in ("lock-20", "Lock-20", "$broker", "bad id"):   # lookalikes, charset
        nonce = guard.challenge()
        with pytest.raises(AuthFailed):
            guard.authenticate(claimed, token_auth(tok_a), nonce, "127.0.0.1")
    a = guard.authenticate("svc-a-1", token_auth(tok_a), guard.challenge(), "127.0.0.1")
    b = guard.authenticate("svc-a-1", token_auth(tok_b), guard.challenge(), "127.0.0.1")
    ops = guard.authenticate("ops-1", token_auth(adm), guard.challenge(), "127.0.0.1")
    assert guard.check_producer_id(a, "svc-a-1") == "svc-a-1"     # first use: claimed
    with pytest.raises(PermissionDenied) as ei:
        guard.check_producer_id(b, "svc-a-1")                     # another principal
    assert ei.value.code == ErrorCode.FORBIDDEN and ei.value.reason == "producer_id_taken"
    taken = ei.value.public_message
    with pytest.raises(PermissionDenied) as ei:
        guard.check_producer_id(ops, "lock-20")                   # a lock's SN, folded
    assert ei.value.public_message.replace("'lock-20'", "'svc-a-1'") == taken   # same answer
    with pytest.raises(PermissionDenied) as ei:
        guard.check_producer_id(ops, "$broker")
    assert ei.value.reason == "producer_id_reserved" and "reserved" in ei.value.public_message


def test_system_topics_need_the_explicit_system_right(guard):
    wild, _ = guard.tokens.create("wild", Permissions(publish=("*", "$*")))
    alarms, _ = guard.tokens.create("alarms", Permissions(system=("$alerts",)))
    adm, _ = guard.tokens.create("ops", Permissions(admin=True))
    w, s, o = (guard.authenticate("", token_auth(t), guard.challenge(), "127.0.0.1")
               for t in (wild, alarms, adm))
    guard.check_publish(w, "billing.x")
    guard.check_publish(s, "$alerts")
    for p, topic, reason in ((w, "$alerts", "system_topic"), (o, "$alerts", "system_topic"),
                             (w, "$devices", "internal_topic"), (s, "$retry.c.0", "internal_topic"),
                             (o, "$dlq.c", "internal_topic"), (s, "$heartbeats", "internal_topic")):
        with pytest.raises(PermissionDenied) as ei:
            guard.check_publish(p, topic)
        assert ei.value.reason == reason, (p.name, topic)
    assert Permissions.from_dict(Permissions(system=("$a",)).to_dict()).system == ("$a",)
