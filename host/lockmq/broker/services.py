"""What a connection works with: one :class:`Services`, built once by the server.

Each field is the narrow piece the connection itself calls -- settings, counters,
log, the guard, the one admission decision, the publish path, the pieces a
connection's life reaches (devices, commands, consumers) -- never the whole broker.
Every other request goes through :attr:`Services.handlers`, the one opcode ->
handler table the features registered when the broker was built
(:func:`~.peer.handler_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lockmq.config import Config
from lockmq.security import BrokerGuard

from .admission import Admission
from .commands import Commands
from .consumers import Consumers
from .core import BrokerCore
from .devices import Devices
from .logs import EventLog, Stats
from .peer import Connections, Handler
from .publish import PublishPath


@dataclass(frozen=True)
class Services:
    """A connection's collaborators (see the module docstring)."""

    config: Config
    stats: Stats
    log: EventLog
    guard: BrokerGuard
    core: BrokerCore
    publisher: PublishPath
    devices: Devices
    commands: Commands
    consumers: Consumers
    connections: Connections
    #: the one rights decision (admission.py): every publish asks it
    admission: Admission
    #: opcode -> handler(connection, frame) of every request after the handshake
    handlers: dict[int, Handler] = field(default_factory=dict)
    #: the compiled lane for steady publish reads (lane.py); None: every read is Python's
    lane: Any = None
