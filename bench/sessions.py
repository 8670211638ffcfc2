"""An established lock/broker session pair, made in memory through the protocol's
public handshake (no sockets, no broker): what the frame-MAC benchmarks seal and
open with, so that they hold the sessions the broker and a lock hold.

    from sessions import established_pair
    lock, broker = established_pair(sealed=True)

``lock`` is a :class:`~lockmq.protocol.ClientSession` (role LOCK, device key,
``mac=sealed``), ``broker`` the :class:`~lockmq.protocol.ServerSession` that
accepted it; both ESTABLISHED. With ``sealed`` both hold the same session key
(``mac_key``) and have counted the handshake's one tagged frame, the CONNECT_ACK.
"""
from __future__ import annotations

import os

from lockmq.protocol import (AuthMethod, ClientSession, ConnectAck, ESTABLISHED, Frame,
                             FrameDecoder, Role, ServerSession, session_key)


def established_pair(sealed: bool, sn: str = "LK-0A1B2C3D", key: bytes = bytes(range(32))
                     ) -> tuple[ClientSession, ServerSession]:
    """A lock's session and the broker's, through CONNECT, CHALLENGE, AUTH and
    CONNECT_ACK."""
    lock = ClientSession(Role.LOCK, sn, AuthMethod.DEVICE_HMAC, key, "bench", mac=sealed)
    broker = ServerSession()
    dec = FrameDecoder()

    def frame(data: bytes) -> Frame:
        dec.feed(data)
        got = dec.next_frame()
        assert got is not None
        return got

    broker.receive(frame(lock.connect_frame(1)))
    cnonce = os.urandom(16)
    auth = frame(lock.receive(frame(broker.challenge(os.urandom(16), 0, 1)), cnonce))
    broker.receive(auth)
    skey = session_key(key, broker.nonce, cnonce, sn, broker.transcript) if sealed else None
    lock.receive(frame(broker.accept(Role.LOCK, sn, ConnectAck(30, 1 << 20, 0), auth.opaque,
                                     mac_key=skey)))
    assert lock.state == broker.state == ESTABLISHED and (lock.mac_key is not None) == sealed
    return lock, broker
