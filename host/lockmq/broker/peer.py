"""What a feature may ask of a connection: the :class:`Peer` interface, and the
table of open connections (:class:`Connections`).

Commands, devices, the scheduler, transactions, admin and the consumer handlers
are handed a ``Peer`` -- never the connection class -- and use only what is
declared here: who is on the other end (its principal, address, limits), whether
it is still there, and how to answer it. ``connection.py`` implements it; a
stand-in (``commands.DetachedSender``, a test's fake) implements the part its user
needs. This module sits below every feature and imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from .handshakes import HandshakeDeadlines

if TYPE_CHECKING:   # (types only)
    from lockmq.security import Principal, SecurityError


class Peer(Protocol):
    """One authenticated connection, as the features see it."""

    #: the broker's number for this connection (logs, admin views)
    id: int
    #: ``host:port`` of the other end
    peer: str
    #: who authenticated (None before the handshake ends)
    principal: "Principal | None"
    #: the socket is closed or closing: anything sent now is dropped
    closed: bool
    #: largest frame the peer said it can receive (CONNECT); 0 = unstated
    peer_max_frame: int
    #: monotonic time of its last frame (the silence sweep)
    last_seen: float
    #: wall time it connected at
    connected_at: float
    #: registered in the online list (``Devices`` sets and clears it)
    is_device: bool
    #: its last HEARTBEAT body (None before the first) and when one was last answered
    heartbeat: Any
    heartbeat_answered_at: "float | None"
    #: the protocol session (what it said at CONNECT: ``session.connect``)
    session: Any

    @property
    def established(self) -> bool:
        """Authenticated and not closed."""
        ...

    def send_frame(self, opcode: int, body: bytes, opaque: int = 0, flags: int = 0) -> None:
        """Queue one frame to the peer (written with the rest of this loop iteration's)."""
        ...

    def send_error(self, code: int, message: str, opaque: int, retry_after_ms: int = 0,
                   response: bool = True) -> None:
        """Queue an ERROR frame answering ``opaque``."""
        ...

    def refused(self, exc: "SecurityError", opaque: int) -> None:
        """Answer a refusal of the guard (ERROR; closed if the refusal says so)."""
        ...

    def fatal(self, code: int, message: str, retry_after_ms: int = 0, opaque: int = 0) -> None:
        """ERROR, then close."""
        ...

    def close(self, reason: str) -> None:
        """Flush what is queued and close."""
        ...

    def check_producer_id(self, sn: str) -> None:
        """May this session publish under producer id ``sn``? Raises the guard's
        SecurityError; a yes is remembered for the session (asked once per id)."""
        ...


#: ``handler(peer, frame)``: what a feature does with one frame of its opcode
Handler = Callable[[Any, Any], None]


def handler_table(*tables: dict[int, Handler]) -> dict[int, Handler]:
    """The one opcode -> handler table a connection dispatches through, merged from
    each feature's own (an opcode claimed twice is a wiring bug, refused here)."""
    out: dict[int, Handler] = {}
    for table in tables:
        for op, handler in table.items():
            if op in out:
                raise ValueError(f"opcode {op:#06x} has two handlers")
            out[op] = handler
    return out


class Connections:
    """The open connections of the broker, their cap, and whether it is closing."""

    def __init__(self) -> None:
        self.by_id: dict[int, Any] = {}
        #: most connections held at once (set at start from the file limit); 0 = none
        self.limit = 0
        #: the broker is shutting down: publishes are answered SHUTTING_DOWN
        self.closing = False
        #: the connections still in their handshake, and their deadlines
        self.handshakes = HandshakeDeadlines()

    def __len__(self) -> int:
        return len(self.by_id)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.by_id.values()))

    def established(self) -> list[Any]:
        """Every connection past its handshake and not closed."""
        return [c for c in self.by_id.values() if c.established]

    def publishes_pending(self) -> bool:
        """Is any connection still waiting for the store to answer its publishes?"""
        return any(c.publishes_pending for c in self.by_id.values())
