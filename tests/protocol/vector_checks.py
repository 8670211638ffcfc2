# Checks of protocol/vectors.json that run unchanged under CPython (pytest,
# test_vectors.py) and MicroPython (mpy_vectors.py). MicroPython subset only.
import gc
import json
import sys
from binascii import unhexlify

from lockmq import protocol as p
import lockmq.protocol._consume  # noqa: F401  (consumer bodies, not loaded on a lock by default)
from lockmq.protocol._crc import crc16_table


def _h(s):
    return unhexlify(s)


def _plain(obj):
    # The JSON form of a decoded body, to compare with the vector's "fields".
    if isinstance(obj, (bytes, bytearray)):
        return {"hex": bytes(obj).hex() if hasattr(obj, "hex") else _hex(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if hasattr(obj, "__slots__"):
        out = {}
        for k in obj.__slots__:
            out[k] = _plain(getattr(obj, k))
        return out
    return obj


def _hex(b):
    from binascii import hexlify
    return hexlify(b).decode()


def _expect_error(fn, name, code):
    try:
        fn()
    except p.ProtocolError as e:
        # the error's kind: its class name on the host; on a lock, which has one
        # ProtocolError class, the name it carries (protocol/_errors.py)
        host_class = sys.implementation.name != "micropython"
        if e.kind != name or e.code != code or (host_class and type(e).__name__ != name):
            return "raised %s(code %d), expected %s(code %d)" % (e.kind, e.code, name, code)
        return None
    return "no error, expected %s" % name


def _decode_all(data, chunk):
    dec = p.FrameDecoder()
    out = []
    for i in range(0, len(data), chunk):
        dec.feed(data[i:i + chunk])
        for f in dec.frames():
            out.append(f)
    return out, dec


def run(path, crc_functions=None):
    """Check every vector; returns (passed, [failure messages])."""
    with open(path) as fh:
        v = json.load(fh)
    # (the host-only sections are checked by host_vector_checks: not held in a lock's heap)
    v.pop("host_frames", None)
    v.pop("host_invalid_bodies", None)
    crc_functions = crc_functions or [crc16_table, p.crc16]
    passed = 0
    failures = []
    check = checker(failures)
    for c in v["crc16"]:
        for fn in crc_functions:
            passed += check(fn(_h(c["data_hex"])) == c["crc"], "crc16 %s" % c["data_hex"][:16])
    for c in v["hmac_sha256"]:
        passed += check(p.hmac_sha256(_h(c["key_hex"]), _h(c["msg_hex"])) == _h(c["mac_hex"]),
                        "hmac %s" % c["mac_hex"][:16])
    a = v["auth"]
    passed += check(p.verify_auth_proof(_h(a["key_hex"]), _h(a["nonce_hex"]), _h(a["cnonce_hex"]),
                                        a["sn"], _h(a["transcript_hex"]), _h(a["proof_hex"])),
                    "auth proof")
    parts = []             # joined once: += would copy the growing stream every frame
    for f in v["frames"]:
        n, data, fr = check_frame(f, check)
        passed += n
        parts.append(data)
        if f["name"] == "command":
            body = p.decode_body(fr.opcode, fr.body)
            passed += check(p.verify_command(_h(a["key_hex"]), f["sn"], body), "command mac")
            body.args = b"\x00\x3c"
            passed += check(not p.verify_command(_h(a["key_hex"]), f["sn"], body),
                            "tampered command refused")
    all_frames = b"".join(parts)
    parts = None
    passed += check_stream(all_frames, len(v["frames"]), (1, 7, 64, 4096), check)
    for e in v["events"]:
        ev = p.LockEvent.decode(_h(e["hex"]))
        passed += check(_plain(ev) == e["fields"] and ev.encode() == _h(e["hex"]), "lock event")
    for bad in v["invalid_frames"]:
        def decode_bad(data=_h(bad["hex"])):
            dec = p.FrameDecoder()
            dec.feed(data)
            for _ in dec.frames():
                pass
        passed += check(_expect_error(decode_bad, bad["error"], bad["code"]) is None,
                        "invalid frame %s: %s" % (bad["name"], _expect_error(decode_bad, bad["error"], bad["code"])))
    for bad in v["invalid_bodies"]:
        passed += check_invalid_body(bad, check)
    frames = dict((f["name"], f) for f in v["frames"])
    passed += check(p.transcript_hash(a["sn"], 0, _h(frames["connect"]["body_hex"]),
                                      _h(frames["challenge"]["body_hex"]))
                    == _h(a["transcript_hex"]), "auth transcript of the connect/challenge frames")
    frames = None
    for section in ("frames", "events", "invalid_frames", "invalid_bodies", "crc16",
                    "hmac_sha256"):
        v.pop(section)      # checked: room for the session modules on a lock-sized heap
    gc.collect()
    passed += _check_frame_macs(v["frame_mac"], a, check)
    passed += _check_transcript(v["transcript"], check)
    return passed, failures


def _check_transcript(t, check):
    # SPEC 2 "The session transcript": every case's hash, proof and key from its parts;
    # then the lock's own ClientSession, fed the agreed CHALLENGE, proves exactly that
    # transcript, and every altered view gives another proof and another key.
    passed = 0
    key, nonce, cnonce = _h(t["key_hex"]), _h(t["nonce_hex"]), _h(t["cnonce_hex"])
    from lockmq.protocol import _mac
    g = t["agreed"]

    def view(c):
        # (an altered case holds only what the relay changed)
        sn = c.get("sn", g["sn"])
        th = p.transcript_hash(sn, c.get("connect_flags", g["connect_flags"]),
                               _h(c.get("connect_body_hex", g["connect_body_hex"])),
                               _h(c.get("challenge_body_hex", g["challenge_body_hex"])))
        return th, p.auth_proof(key, nonce, cnonce, sn, th), _mac.session_key(key, nonce, cnonce,
                                                                              sn, th)

    th, proof, skey = view(g)
    passed += check(th == _h(g["transcript_hex"]) and proof == _h(g["proof_hex"])
                    and skey == _h(g["session_key_hex"]), "transcript: hash, proof, key")
    for c in t["altered"]:
        th2, proof2, skey2 = view(c)
        passed += check(th2 != th and proof2 != proof and skey2 != skey,
                        "transcript %s: changes the proof and the key" % c["name"])
    challenge = p.encode_frame(p.Op.CHALLENGE, "", _h(g["challenge_body_hex"]), 1, p.Flag.RESPONSE)
    for pinned in ("", "gw-north"):
        lock = p.ClientSession(p.Role.LOCK, g["sn"], p.AuthMethod.DEVICE_HMAC, key,
                               "lockapp/0.3", 30, 4096, True, pinned)
        connect = _one(lock.connect_frame(1))
        passed += check(connect.flags == g["connect_flags"]
                        and connect.body == _h(g["connect_body_hex"]),
                        "transcript: the lock's CONNECT is the agreed one")
        auth = p.Auth.decode(_one(lock.receive(_one(challenge), cnonce)).body)
        passed += check(lock.transcript == _h(g["transcript_hex"])
                        and auth.proof == _h(g["proof_hex"])
                        and lock.mac_key == _h(g["session_key_hex"]),
                        "transcript: the lock proves the agreed transcript (pinned %r)" % pinned)
    other = [c for c in t["altered"] if c["name"] == "broker_id_changed"][0]
    gc.collect()
    lock = p.ClientSession(p.Role.LOCK, g["sn"], p.AuthMethod.DEVICE_HMAC, key,
                           "lockapp/0.3", 30, 4096, True, "gw-north")
    lock.connect_frame(1)
    evil = p.encode_frame(p.Op.CHALLENGE, "", _h(other["challenge_body_hex"]), 1, p.Flag.RESPONSE)
    err = _expect_error(lambda: lock.receive(_one(evil), cnonce), "SessionError", 11)
    passed += check(err is None and lock.state == p.CLOSING,
                    "transcript: a lock pinned to gw-north sends no proof to gw-evil: %s" % err)
    return passed


def checker(failures):
    """check(ok, what): 1 when ok, else 0 with ``what`` appended to ``failures``."""
    def check(ok, what):
        if ok:
            return 1
        failures.append(what)
        return 0
    return check


def check_frame(f, check):
    """One frame vector: encode, decode (in 1-byte chunks), body fields and re-encode.
    Returns (passed, the frame's bytes, the decoded frame or None)."""
    data = _h(f["hex"])
    passed = check(p.encode_frame(f["opcode"], f["sn"], _h(f["body_hex"]), f["opaque"],
                                  f["flags"]) == data, "encode %s" % f["name"])
    got, _ = _decode_all(data, 1)
    fr = got[0] if len(got) == 1 else None
    passed += check(fr is not None and fr.opcode == f["opcode"] and fr.sn == f["sn"]
                    and fr.flags == f["flags"] and fr.opaque == f["opaque"]
                    and fr.body == _h(f["body_hex"]), "decode %s" % f["name"])
    if fr is not None and f["fields"]:
        body = p.decode_body(fr.opcode, fr.body)
        passed += check(_plain(body) == f["fields"], "body fields %s" % f["name"])
        passed += check(body.encode() == fr.body, "body re-encode %s" % f["name"])
    return passed, data, fr


def check_stream(stream, count, chunks, check):
    """The frames of ``stream`` fed in chunks of each size: ``count`` frames, no rest."""
    passed = 0
    for chunk in chunks:
        got, dec = _decode_all(stream, chunk)
        passed += check(len(got) == count and dec.buffered() == 0,
                        "stream of %d frames in chunks of %d" % (count, chunk))
        got = dec = None   # one stream's frames at a time, in a lock-sized heap
    return passed


def check_invalid_body(bad, check):
    """An invalid body vector (opcode -1: a lock event) is refused with its error."""
    if bad["opcode"] < 0:
        def decode_bad(data=_h(bad["body_hex"])):
            p.LockEvent.decode(data)
    else:
        def decode_bad(op=bad["opcode"], data=_h(bad["body_hex"])):
            p.decode_body(op, data)
    err = _expect_error(decode_bad, bad["error"], bad["code"])
    return check(err is None, "invalid body %s: %s" % (bad["name"], err))


def _one(data):
    dec = p.FrameDecoder()
    dec.feed(data)
    return dec.next_frame()


def _check_frame_macs(m, a, check):
    from lockmq.protocol import _mac
    # The lock's side, driven by its ClientSession exactly as the firmware does; the
    # broker's side by tag recomputation (ServerSession is not loaded on a lock).
    passed = 0
    key, nonce, cnonce, sn = _h(a["key_hex"]), _h(a["nonce_hex"]), _h(a["cnonce_hex"]), a["sn"]
    skey = _mac.session_key(key, nonce, cnonce, sn, _h(m["transcript_hex"]))
    passed += check(skey == _h(m["session_key_hex"]), "frame mac: session key")
    fr = {f["name"]: _h(f["hex"]) for f in m["frames"]}
    lock = p.ClientSession(p.Role.LOCK, sn, p.AuthMethod.DEVICE_HMAC, key, "lockapp/0.1", 30, mac=True)
    passed += check(lock.connect_frame(1) == fr["connect"], "frame mac: CONNECT asks (flag MAC)")
    passed += check(lock.receive(_one(fr["challenge"]), cnonce) == fr["auth"], "frame mac: AUTH")
    lock.receive(_one(fr["connect_ack"]))
    passed += check(lock.state == p.ESTABLISHED and lock.mac_key == skey and lock.ack.max_frame == 4096,
                    "frame mac: tagged CONNECT_ACK opened")
    pub = _one(fr["publish"]).body[:-_mac.TAG_SIZE]
    passed += check(lock.seal(p.Op.PUBLISH, sn, pub, 101) == fr["publish"], "frame mac: sealed PUBLISH")
    f = _one(fr["publish_ack"])
    lock.receive(f)
    passed += check(p.PublishAck.decode(f.body).status == 0, "frame mac: PUBLISH_ACK opened")
    hb = _one(fr["heartbeat"])
    passed += check(lock.seal(p.Op.HEARTBEAT, sn, hb.body[:-_mac.TAG_SIZE], 1) == fr["heartbeat"],
                    "frame mac: sealed HEARTBEAT, counter 1")
    # the broker's view: the tag check ServerSession runs on every frame once
    # established (_Session._open -> _mac.open_frame), on a bare broker-side session
    # (ServerSession itself is not loaded on a lock, and this runs in a lock's heap)
    from lockmq.protocol._session import _Session
    broker = _Session()
    broker._OUT = _mac.TO_CLIENT
    broker.mac_key = skey
    broker.state = p.ESTABLISHED
    for name in ("publish", "heartbeat"):
        f = _one(fr[name])
        body = f.body[:-_mac.TAG_SIZE]
        try:
            broker._open(f)
            err = None
        except p.ProtocolError as e:
            err = e
        passed += check(err is None and f.body == body,
                        "frame mac: broker checks %s: %s" % (name, err))
    rx = broker.rx
    for bad in m["refused"]:
        broker.rx = rx          # each as the next frame after the heartbeat
        err = _expect_error(lambda: broker._open(_one(_h(bad["hex"]))), "SessionError", 17)
        try:
            broker._open(_one(_h(bad["hex"])))
            fatal = False
        except p.ProtocolError as e:
            fatal = e.fatal
        # the tag check is an action: it refuses (fatally) and leaves the state to the
        # session's one writer (_Session._process), which a receive() then runs
        passed += check(err is None and fatal and broker.state == p.ESTABLISHED,
                        "frame mac: %s refused: %s" % (bad["name"], err))
    # the lock refuses a broker frame replayed to it (BAD_MAC, fatal)
    err = _expect_error(lambda: lock.receive(_one(fr["publish_ack"])), "SessionError", 17)
    passed += check(err is None, "frame mac: replayed PUBLISH_ACK refused: %s" % err)
    return passed
