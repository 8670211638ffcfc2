# Checks of protocol/session_vectors.json that run unchanged under CPython
# (test_session.py) and MicroPython (mpy_session.py). MicroPython subset only.
import json

from lockmq.protocol import (Op, AuthMethod, Frame, Connect, Auth, Challenge, ConnectAck,
                             ErrorReply, ClientSession, SessionError, UnknownOpcode)
from lockmq.protocol._server_session import ServerSession, STATE_NAMES

_NONCE = b"\x01" * 16


def _body(step, op):
    if op == Op.CONNECT:
        return Connect(step["role"], 30, "vectors").encode()
    if op == Op.AUTH:
        return Auth(AuthMethod.TOKEN, _NONCE, b"token").encode()
    if op == Op.CHALLENGE:
        return Challenge(_NONCE, 0).encode()
    if op == Op.CONNECT_ACK:
        return ConnectAck(30, 4096, 0).encode()
    if op == Op.ERROR:
        return ErrorReply(step.get("code", 1), "refused").encode()
    return b""


def _outcome(call):
    # "ok", "send" (the session returned bytes to send) or [code, fatal]
    try:
        out = call()
    except SessionError as e:
        return [e.code, e.fatal]
    return "send" if out else "ok"


def _server_step(s, step):
    if step.get("challenge"):
        s.challenge(_NONCE, 0, 1)
        return None
    if "accept" in step:
        s.accept(step["accept"], step["name"], ConnectAck(30, 4096, 0), 2)
        return None
    if step.get("unknown"):
        e = s.unknown_opcode(UnknownOpcode("unknown opcode 0x7777"))
        return [e.code, e.fatal]
    op = getattr(Op, step["op"])
    frame = Frame(op, step.get("sn", ""), step.get("flags", 0), 1, _body(step, op))
    got = _outcome(lambda: s.receive(frame))
    return "ok" if got == "send" else got


def _client_step(c, step):
    op = getattr(Op, step["op"])
    frame = Frame(op, "", step.get("flags", 0), 1, _body(step, op))
    return _outcome(lambda: c.receive(frame, _NONCE, 2))


def run(path):
    """Run every case; returns (passed, [failure descriptions])."""
    with open(path) as f:
        cases = json.load(f)
    passed = 0
    failures = []
    for side in ("server", "client"):
        for case in cases[side]:
            if side == "server":
                session = ServerSession()
            else:
                session = ClientSession(case["role"], case["sn"], AuthMethod.DEVICE_HMAC,
                                        b"k" * 32, "vectors")
                session.connect_frame(1)
            for i, step in enumerate(case["steps"]):
                got = (_server_step if side == "server" else _client_step)(session, step)
                where = "%s %r step %d" % (side, case["name"], i)
                if "expect" in step and got != step["expect"]:
                    failures.append("%s: expected %r, got %r" % (where, step["expect"], got))
                    break
                if "state" in step and STATE_NAMES[session.state] != step["state"]:
                    failures.append("%s: state %s, expected %s" % (
                        where, STATE_NAMES[session.state], step["state"]))
                    break
                passed += 1
    return passed, failures
