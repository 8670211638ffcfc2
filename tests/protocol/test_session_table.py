"""The session's transitions live in one table per side (protocol/_session.py,
h11's ``_state.py`` rule): ``_Session._process`` is the only code in protocol/ that
writes ``state``, every move it can make is a row of CLIENT_TABLE or SERVER_TABLE, and
the frame-MAC check is an action whose fatal error the session's receive() turns into
CLOSING -- not a second writer."""
from __future__ import annotations

import ast
import os

import pytest

from lockmq import protocol as p
from lockmq.protocol import _session
from lockmq.protocol._constants import OP_NAMES
from lockmq.protocol._server_session import STATE_NAMES
from lockmq.testing.micropython import PROTOCOL

STATES = (p.CONNECTING, p.CHALLENGED, p.ESTABLISHED, p.CLOSING)


def _state_writers() -> list[str]:
    """``file:function`` of every assignment to an attribute named ``state`` in protocol/."""
    out = []
    for path in sorted(PROTOCOL.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr == "state":
                        out.append(f"{path.name}:{fn.name}")
    return out


def test_only_process_writes_the_state() -> None:
    # (__init__ sets the initial state; every later change is a move of the table)
    assert sorted(set(_state_writers())) == ["_session.py:__init__", "_session.py:_process"]


@pytest.mark.parametrize("table", [_session.CLIENT_TABLE, _session.SERVER_TABLE],
                         ids=["client", "server"])
def test_each_table_has_a_row_per_state_and_moves_within_them(table) -> None:
    assert len(table) == len(STATES) == len(STATE_NAMES)
    for moves, refusal in table:
        events = [ev for ev, _ in moves]
        assert len(events) == len(set(events))          # one move per event
        assert all(nxt in STATES for _, nxt in moves)
        assert all(abs(ev) in OP_NAMES for ev in events)   # frames, received or sent
        assert refusal is None or (isinstance(refusal[0], int) and "%s" in refusal[1])
    # only ESTABLISHED keeps a frame it has no move for (the role's rules decide)
    assert [refusal is None for _, refusal in table] == [False, False, True, False]


def _established_pair(mac: bool):
    key = os.urandom(32)
    client = p.ClientSession(p.Role.LOCK, "LOCK-1", p.AuthMethod.DEVICE_HMAC, key, "t", mac=mac)
    server = p.ServerSession()
    dec = p.FrameDecoder()

    def frame(data: bytes):
        dec.feed(data)
        return dec.next_frame()

    server.receive(frame(client.connect_frame(1)))
    cnonce = os.urandom(16)
    auth = frame(client.receive(frame(server.challenge(os.urandom(16), 0, 1)), cnonce))
    server.receive(auth)
    skey = p.session_key(key, server.nonce, cnonce, "LOCK-1", server.transcript) if mac else None
    client.receive(frame(server.accept(p.Role.LOCK, "LOCK-1", p.ConnectAck(30, 4096, 0),
                                       auth.opaque, mac_key=skey)))
    assert client.state == server.state == p.ESTABLISHED
    return client, server, frame


def test_a_bad_frame_tag_ends_the_session_through_receive() -> None:
    client, server, frame = _established_pair(mac=True)
    sealed = client.seal(p.Op.PUBLISH, "LOCK-1", b"x" * 20, 5)
    bad = frame(sealed[:-3] + bytes([sealed[-3] ^ 1]) + p.crc16(
        sealed[:-3] + bytes([sealed[-3] ^ 1])).to_bytes(2, "big"))
    with pytest.raises(p.SessionError) as err:
        server.receive(bad)
    assert err.value.code == p.ErrorCode.BAD_MAC and err.value.fatal
    assert server.state == p.CLOSING


def test_a_refused_request_keeps_the_session_and_disconnect_ends_it() -> None:
    _, server, _ = _established_pair(mac=False)
    with pytest.raises(p.SessionError) as err:      # a lock may not PULL: refused, not fatal
        server.receive(p.Frame(p.Op.PULL, "", 0, 3, b""))
    assert not err.value.fatal and server.state == p.ESTABLISHED
    server.receive(p.Frame(p.Op.DISCONNECT, "", 0, 4, b""))
    assert server.state == p.CLOSING
    with pytest.raises(p.SessionError) as err:
        server.receive(p.Frame(p.Op.HEARTBEAT, "", 0, 5, b""))
    assert err.value.fatal and err.value.code == p.ErrorCode.UNEXPECTED_FRAME


def test_accept_is_a_move_of_the_challenged_state_only() -> None:
    server = p.ServerSession()
    with pytest.raises(p.ProtocolError):
        server.accept(p.Role.SERVICE, "svc", p.ConnectAck(30, 4096, 0), 2)
    assert server.state == p.CLOSING
