"""Regenerate protocol/vectors.json, the shared test vectors.

The vectors pin the wire format: CPython (tests/protocol/test_vectors.py) and
MicroPython (tests/protocol/mpy_vectors.py) both check every one of them. Run
this only when the format changes on purpose:  python tests/protocol/make_vectors.py
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from lockmq import protocol as p
from lockmq.protocol import schedule as sched
from lockmq.protocol import txn as t

OUT = Path(__file__).resolve().parents[2] / "protocol" / "vectors.json"
SN = "LK-0A1B2C3D"
TS = 1_763_800_000_123          # 2025-11-22T08:26:40.123Z


def frame_vector(name: str, opcode: int, body_obj, opaque: int = 0, flags: int = 0,
                 sn: str = SN) -> dict:
    body = body_obj.encode() if hasattr(body_obj, "encode") else body_obj
    data = p.encode_frame(opcode, sn, body, opaque, flags)
    return {"name": name, "hex": data.hex(), "opcode": opcode, "sn": sn, "flags": flags,
            "opaque": opaque, "body_hex": body.hex(), "fields": fields_of(body_obj)}


def fields_of(obj) -> dict:
    if isinstance(obj, (bytes, bytearray)):
        return {}
    out = {}
    for k in obj.__slots__:
        v = getattr(obj, k)
        if isinstance(v, (bytes, bytearray)):
            out[k] = {"hex": bytes(v).hex()}
        elif isinstance(v, list):
            out[k] = [fields_of(x) if hasattr(x, "__slots__") else list(x) for x in v]
        else:
            out[k] = v
    return out


def main() -> None:
    event = p.LockEvent(p.EventType.UNLOCK, TS, p.Method.CARD, p.Result.OK, 0,
                        bytes.fromhex("0a1b2c3d4e5f6071"))
    denied = p.LockEvent(p.EventType.FAILED_ATTEMPT, TS + 1500, p.Method.PIN,
                         p.Result.DENIED_UNKNOWN, 0, b"")
    nonce = bytes(range(16))
    cnonce = bytes(range(16, 32))
    key = bytes.fromhex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
    # the session transcript of the vectors' "connect" and "challenge" frames below
    transcript = p.transcript_hash(SN, 0, p.Connect(p.Role.LOCK, 30, "lockapp/0.1").encode(),
                                   p.Challenge(nonce, TS, 3).encode())
    proof = p.auth_proof(key, nonce, cnonce, SN, transcript)
    cmd = p.Command(SN, 7, TS + 60_000, p.CommandKind.UNLOCK, struct.pack(">H", 5))
    cmd.mac = p.command_mac(key, SN, cmd.cmd_id, cmd.expires_ms, cmd.kind, cmd.args)
    msg = p.Message(1041, 1, SN, 42, TS, TS * 1000 + 250, "lock.events", event.encode())

    frames = [
        frame_vector("connect", p.Op.CONNECT, p.Connect(p.Role.LOCK, 30, "lockapp/0.1"), 1),
        # a lock stating the largest frame it can receive (optional trailing u32)
        frame_vector("connect_max_frame", p.Op.CONNECT,
                     p.Connect(p.Role.LOCK, 30, "lockapp/0.2", p.VERSION, 4096), 1),
        frame_vector("challenge", p.Op.CHALLENGE, p.Challenge(nonce, TS, 3), 1, p.Flag.RESPONSE),
        frame_vector("auth", p.Op.AUTH, p.Auth(p.AuthMethod.DEVICE_HMAC, cnonce, proof), 2),
        frame_vector("connect_ack", p.Op.CONNECT_ACK, p.ConnectAck(30, 65536, TS, 41, 9), 2,
                     p.Flag.RESPONSE),
        frame_vector("publish_unlock", p.Op.PUBLISH, p.Publish("lock.events", 42, TS, event.encode()), 3),
        frame_vector("publish_oneway", p.Op.PUBLISH,
                     p.Publish("lock.events", 43, TS + 1500, denied.encode()), 0, p.Flag.ONEWAY),
        frame_vector("publish_ack", p.Op.PUBLISH_ACK, p.PublishAck(0, 8192), 3, p.Flag.RESPONSE),
        frame_vector("publish_dup_ack", p.Op.PUBLISH_ACK, p.PublishAck(1, 8192), 4, p.Flag.RESPONSE),
        frame_vector("heartbeat", p.Op.HEARTBEAT, p.Heartbeat(TS, 3600, 2, 0, 87, 61440), 5),
        frame_vector("heartbeat_empty", p.Op.HEARTBEAT, b"", 6, 0, "svc-billing-1"),
        frame_vector("error_busy", p.Op.ERROR, p.ErrorReply(p.ErrorCode.BUSY, "store is full", 250),
                     3, p.Flag.RESPONSE),
        frame_vector("disconnect", p.Op.DISCONNECT, p.Disconnect(0, "bye"), 0),
        frame_vector("subscribe", p.Op.SUBSCRIBE,
                     p.Subscribe("lock.events", "billing", p.Subscribe.ORDERED, 64, 30000), 10, 0,
                     "svc-billing-1"),
        frame_vector("subscribe_ack", p.Op.SUBSCRIBE_ACK, p.SubscribeAck(1, 1200), 10,
                     p.Flag.RESPONSE, "svc-billing-1"),
        frame_vector("notify", p.Op.NOTIFY, p.Notify(1, 17), 0, 0, "svc-billing-1"),
        frame_vector("pull", p.Op.PULL, p.Pull(1, 32, 1000), 11, 0, "svc-billing-1"),
        frame_vector("messages", p.Op.MESSAGES, p.Messages(1, [msg]), 11, p.Flag.RESPONSE,
                     "svc-billing-1"),
        frame_vector("ack", p.Op.ACK, p.Ack(1, [(1041, 1), (1042, 1)]), 12, 0, "svc-billing-1"),
        frame_vector("nack", p.Op.NACK, p.Nack(1, [(1043, 2)], 0, "db timeout"), 13, 0,
                     "svc-billing-1"),
        frame_vector("unsubscribe", p.Op.UNSUBSCRIBE, p.Unsubscribe(1), 14, 0, "svc-billing-1"),
        frame_vector("command", p.Op.COMMAND, cmd, 20),
        frame_vector("command_result", p.Op.COMMAND_RESULT,
                     p.CommandResult(SN, 7, p.CommandStatus.OK, "unlocked 5 s"), 20, p.Flag.RESPONSE),
        frame_vector("ok", p.Op.OK, b"", 21, p.Flag.RESPONSE),
        frame_vector("admin_request", p.Op.ADMIN_REQUEST,
                     p.encode_json({"op": "topics", "args": {}}), 30, 0, "admin"),
    ]

    # bodies a lock never loads (transactional and scheduled messages): checked apart
    # (host_vector_checks.py), not in the lock-sized heap of the frames above
    host_frames = [
        # scheduled delivery (SPEC "Scheduled delivery"; protocol/schedule.py), then
        # transactional messages (SPEC "Transactional messages"; protocol/txn.py)
        frame_vector("publish_at", p.Op.PUBLISH_AT,
                     sched.PublishAt("door.reminders", 44, TS, TS + 300_000, b"still open?"), 40,
                     0, "svc-billing-1"),
        frame_vector("publish_at_ack", p.Op.PUBLISH_ACK, p.PublishAck(0, 17), 40,
                     p.Flag.RESPONSE, "svc-billing-1"),
        frame_vector("schedule_cancel", p.Op.SCHEDULE_CANCEL, sched.ScheduleCancel(17), 41, 0,
                     "svc-billing-1"),
        frame_vector("command_at", p.Op.COMMAND_AT,
                     sched.CommandAt(SN, 8, 0, p.CommandKind.UNLOCK, struct.pack(">H", 600),
                                     TS + 3_600_000), 42, 0, "svc-billing-1"),
        frame_vector("command_scheduled", p.Op.COMMAND_SCHEDULED,
                     sched.CommandScheduled(SN, 8, 18), 42, p.Flag.RESPONSE, "svc-billing-1"),
        frame_vector("txn_publish", p.Op.TXN_PUBLISH,
                     t.TxnPublish("card-grants", "cards.granted", 7, TS, b'{"card":"0a1b"}'), 40, 0,
                     "svc-cards-1"),
        frame_vector("txn_publish_ack", p.Op.TXN_PUBLISH_ACK, p.PublishAck(0, 81920), 40,
                     p.Flag.RESPONSE, "svc-cards-1"),
        frame_vector("txn_end_commit", p.Op.TXN_END, t.TxnEnd(81920, t.TxnOutcome.COMMIT), 41, 0,
                     "svc-cards-1"),
        frame_vector("txn_check", p.Op.TXN_CHECK,
                     t.TxnCheck(81920, "cards.granted", "svc-cards-1", 7, '{"checks":1}',
                                b'{"card":"0a1b"}'), 0, 0, "svc-cards-2"),
        frame_vector("txn_check_answer_unknown", p.Op.TXN_CHECK_ANSWER,
                     t.TxnEnd(81920, t.TxnOutcome.UNKNOWN), 0, p.Flag.ONEWAY, "svc-cards-2"),
        frame_vector("txn_join", p.Op.TXN_JOIN, t.TxnJoin("card-grants"), 42, 0, "svc-cards-2"),
    ]

    good = p.encode_frame(p.Op.PUBLISH, SN, p.Publish("lock.events", 42, TS, event.encode()).encode(), 3)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0x01
    flipped = bytearray(good)
    flipped[20] ^= 0x40
    huge = bytearray(good)
    huge[1:5] = struct.pack(">I", 100_000_000)
    tiny = bytearray(good)
    tiny[1:5] = struct.pack(">I", 9)
    v2 = bytearray(good)
    v2[0] = 2
    unknown = p.encode_frame(0x7ABC, SN, b"future", 0)
    sn_too_long = bytearray(good)
    sn_too_long[7] = 200
    invalid = [
        {"name": "bad_checksum", "hex": bytes(bad_crc).hex(), "error": "BadChecksum", "code": 4},
        {"name": "bit_flip_in_body", "hex": bytes(flipped).hex(), "error": "BadChecksum", "code": 4},
        {"name": "length_over_limit", "hex": bytes(huge[:5]).hex(), "error": "FrameTooLarge", "code": 3},
        {"name": "length_below_minimum", "hex": bytes(tiny).hex(), "error": "BadFrame", "code": 1},
        {"name": "unknown_version", "hex": bytes(v2).hex(), "error": "UnsupportedVersion", "code": 2},
        {"name": "unknown_opcode", "hex": unknown.hex(), "error": "UnknownOpcode", "code": 5},
        {"name": "sn_longer_than_frame", "hex": bytes(sn_too_long).hex(), "error": "BadFrame", "code": 1},
    ]
    connect_old = p.Connect(p.Role.LOCK, 30, "lockapp/0.1").encode()
    bad_bodies = [
        {"name": "connect_max_frame_truncated", "opcode": p.Op.CONNECT,
         "body_hex": (connect_old + b"\x00\x10").hex(), "error": "BadBody", "code": 6},
        {"name": "connect_trailing_after_max_frame", "opcode": p.Op.CONNECT,
         "body_hex": (connect_old + b"\x00\x00\x10\x00\xff").hex(), "error": "BadBody",
         "code": 6},
        {"name": "publish_truncated", "opcode": p.Op.PUBLISH, "body_hex": "0b6c6f636b2e657665",
         "error": "BadBody", "code": 6},
        {"name": "ack_trailing_bytes", "opcode": p.Op.ACK, "body_hex": "000000010000ff",
         "error": "BadBody", "code": 6},
        {"name": "error_message_not_utf8", "opcode": p.Op.ERROR, "body_hex": "0014000000000002fffe",
         "error": "BadBody", "code": 6},
        {"name": "event_credential_overrun", "opcode": -1,
         "body_hex": event.encode()[:-2].hex(), "error": "BadBody", "code": 6},
    ]
    host_bad_bodies = [
        {"name": "command_at_truncated", "opcode": p.Op.COMMAND_AT,
         "body_hex": "0000019aa8d0", "error": "BadBody", "code": 6},
        {"name": "txn_end_outcome_not_0_1_2", "opcode": p.Op.TXN_END, "body_hex": "000000000001400003",
         "error": "BadBody", "code": 6},
        {"name": "txn_publish_truncated", "opcode": p.Op.TXN_PUBLISH, "body_hex": "0167017400",
         "error": "BadBody", "code": 6},
    ]
    crc = [{"data_hex": d.hex(), "crc": p.crc16(d)} for d in
           (b"123456789", b"", b"\x00", bytes(range(256)), good[:-2])]
    hmac = [  # RFC 4231 cases 1, 2 and 6, then the lockmq proof above
        {"key_hex": "0b" * 20, "msg_hex": b"Hi There".hex(),
         "mac_hex": "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"key_hex": b"Jefe".hex(), "msg_hex": b"what do ya want for nothing?".hex(),
         "mac_hex": "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {"key_hex": "aa" * 131,
         "msg_hex": b"Test Using Larger Than Block-Size Key - Hash Key First".hex(),
         "mac_hex": "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {"key_hex": key.hex(), "msg_hex": (b"lockmq-auth-v2" + nonce + cnonce + bytes([len(SN)])
                                           + SN.encode() + transcript).hex(),
         "mac_hex": proof.hex()},
    ]
    events = [{"hex": e.encode().hex(), "fields": fields_of(e)} for e in (event, denied)]
    mac = frame_mac_vectors(key, nonce, cnonce, event)
    doc = {"comment": "lockmq protocol v1 shared test vectors; generated by "
                      "tests/protocol/make_vectors.py",
           "crc16": crc, "hmac_sha256": hmac, "frames": frames, "events": events,
           "invalid_frames": invalid, "invalid_bodies": bad_bodies,
           "auth": {"key_hex": key.hex(), "nonce_hex": nonce.hex(), "cnonce_hex": cnonce.hex(),
                    "sn": SN, "transcript_hex": transcript.hex(), "proof_hex": proof.hex()},
           "transcript": transcript_vectors(key, nonce, cnonce),
           "frame_mac": mac, "host_frames": host_frames,
           "host_invalid_bodies": host_bad_bodies}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}: {len(frames)} frames, {len(invalid)} invalid frames")


def frame_mac_vectors(key: bytes, nonce: bytes, cnonce: bytes, event) -> dict:
    """A lock session with frame MACs (SPEC "Frame MACs"), both sides driven by the
    protocol's sessions: the frames on the wire, in order, and a tampered, a replayed
    and an untagged publish each refused with BAD_MAC."""
    from lockmq.protocol import ServerSession

    def one(data: bytes):
        dec = p.FrameDecoder()
        dec.feed(data)
        return dec.next_frame()

    lock = p.ClientSession(p.Role.LOCK, SN, p.AuthMethod.DEVICE_HMAC, key, "lockapp/0.1", 30,
                           mac=True)
    broker = ServerSession()
    connect = lock.connect_frame(1)
    broker.receive(one(connect))
    challenge = broker.challenge(nonce, TS, 1)
    skey = p.session_key(key, nonce, cnonce, SN, broker.transcript)
    auth = lock.receive(one(challenge), cnonce)
    broker.receive(one(auth))
    ack = broker.accept(p.Role.LOCK, SN, p.ConnectAck(30, 4096, TS, p.NO_SEQ, 9), 2, mac_key=skey)
    lock.receive(one(ack))
    pub1 = lock.seal(p.Op.PUBLISH, SN, p.Publish("lock.events", 1, TS, event.encode()).encode(), 101)
    broker.receive(one(pub1))
    puback = broker.seal(p.Op.PUBLISH_ACK, "", p.PublishAck(0, 8192).encode(), 101, p.Flag.RESPONSE)
    lock.receive(one(puback))
    hb = lock.seal(p.Op.HEARTBEAT, SN, p.Heartbeat(TS, 60, 0, 0, 90, 50000).encode(), 1)
    broker.receive(one(hb))
    tampered = bytearray(pub1)
    tampered[-6] ^= 0x01                      # a payload byte, CRC fixed after
    tampered[-2:] = struct.pack(">H", p.crc16(bytes(tampered[:-2])))
    untagged = p.encode_frame(p.Op.PUBLISH, SN, p.Publish("lock.events", 2, TS, event.encode()).encode(), 102)
    return {
        "transcript_hex": broker.transcript.hex(),
        "session_key_hex": skey.hex(),
        # in wire order; "to": which side receives it
        "frames": [{"name": n, "to": to, "hex": d.hex()} for n, to, d in (
            ("connect", "broker", connect), ("challenge", "lock", challenge),
            ("auth", "broker", auth), ("connect_ack", "lock", ack),
            ("publish", "broker", pub1), ("publish_ack", "lock", puback),
            ("heartbeat", "broker", hb))],
        # each refused (BAD_MAC, code 17) by a broker that has received the frames above
        "refused": [{"name": "tampered_publish_crc_fixed", "hex": bytes(tampered).hex()},
                    {"name": "replayed_publish", "hex": pub1.hex()},
                    {"name": "untagged_publish", "hex": untagged.hex()}],
    }


def transcript_vectors(key: bytes, nonce: bytes, cnonce: bytes) -> dict:
    """SPEC 2 "The session transcript": a lock's MAC session with a broker that names
    itself, and what an on-path relay's changes do. Each "altered" case is the same
    handshake with one thing the relay changed on its way (the MAC flag cleared, the
    frame limit lowered, another client, another broker id, the nonce): the lock's
    proof and session key no longer match the broker's view."""
    connect_body = p.Connect(p.Role.LOCK, 30, "lockapp/0.3", p.VERSION, 4096).encode()
    challenge_body = p.Challenge(nonce, TS, 1, "gw-north").encode()
    flags = p.Flag.MAC

    def case(name, sn=SN, fl=flags, cb=connect_body, chb=challenge_body):
        # an altered case carries only what differs from the agreed one (a lock's
        # heap loads the whole file)
        out = {"name": name}
        if sn != SN:
            out["sn"] = sn
        if fl != flags or name == "agreed":
            out["connect_flags"] = fl
        if cb != connect_body or name == "agreed":
            out["connect_body_hex"] = cb.hex()
        if chb != challenge_body or name == "agreed":
            out["challenge_body_hex"] = chb.hex()
        if name == "agreed":
            th = p.transcript_hash(sn, fl, cb, chb)
            out.update(sn=sn, transcript_hex=th.hex(),
                       proof_hex=p.auth_proof(key, nonce, cnonce, sn, th).hex(),
                       session_key_hex=p.session_key(key, nonce, cnonce, sn, th).hex())
        return out

    return {
        "key_hex": key.hex(), "nonce_hex": nonce.hex(), "cnonce_hex": cnonce.hex(),
        "agreed": case("agreed"),
        "altered": [
            case("mac_flag_cleared", fl=0),
            case("frame_limit_lowered", cb=p.Connect(p.Role.LOCK, 30, "lockapp/0.3", p.VERSION,
                                                     512).encode()),
            case("client_changed", cb=p.Connect(p.Role.LOCK, 30, "lockapp/0.2", p.VERSION,
                                                4096).encode()),
            case("proto_max_changed", cb=p.Connect(p.Role.LOCK, 30, "lockapp/0.3", 2,
                                                   4096).encode()),
            case("broker_id_changed", chb=p.Challenge(nonce, TS, 1, "gw-evil").encode()),
            case("broker_id_dropped", chb=p.Challenge(nonce, TS, 1).encode()),
            case("methods_changed", chb=p.Challenge(nonce, TS, 3, "gw-north").encode()),
        ],
    }


if __name__ == "__main__":
    main()
