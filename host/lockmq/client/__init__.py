"""lockmq client library: producers, consumer-cluster members, admin requests.

Blocking flavour (threads)::

    from lockmq.client import Producer, Consumer

    with Producer("127.0.0.1:6800", token=TOKEN) as p:
        p.send_sync("lock.events", b"...")           # waits for the ack
        fut = p.send_async("lock.events", b"...")     # concurrent.futures.Future
        p.send_oneway("lock.events", b"...")

    def handle(msg):                                  # return = ack, raise = nack
        print(msg.id, msg.payload)

    Consumer("127.0.0.1:6800", topic="lock.events", cluster="billing",
             handler=handle, min_workers=1, max_workers=8).run()

asyncio flavour: :class:`AsyncProducer`, :class:`AsyncConsumer`, :class:`AsyncAdmin`.
Exactly-once effects: :mod:`lockmq.client.idempotency`. See docs/consumers.md.
"""

from .admin import Admin, AsyncAdmin
from .autoscale import Autoscaler
from .consumer import AsyncConsumer
from .errors import (
    AdminError,
    AuthError,
    BrokerError,
    BusyError,
    ClientClosed,
    CommandError,
    ConnectionLost,
    ForbiddenError,
    InsecureTransportError,
    InvalidIdentityError,
    LockmqError,
    TlsError,
)
from .events import CommandKind, CommandStatus, Event, EventType, Method, Result, decode_event
from .idempotency import (
    IdempotencyStore,
    PostgresIdempotency,
    SqliteIdempotency,
    idempotency_store,
)
from .message import Message
from .producer import AsyncProducer, CommandOutcome, SendResult
from .session import Credentials, Endpoint
from .sync import Consumer, Producer
from .transaction import TransactionProducer, TxnMessage, TxnResult, idempotent_transaction

__all__ = [
    "Admin", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "Autoscaler", "Consumer",
    "Producer", "Message", "SendResult", "CommandOutcome", "Credentials", "Endpoint",
    "IdempotencyStore", "SqliteIdempotency", "PostgresIdempotency", "idempotency_store",
    "LockmqError", "ConnectionLost", "ClientClosed", "BrokerError", "BusyError", "AuthError",
    "ForbiddenError", "CommandError", "AdminError", "InsecureTransportError", "InvalidIdentityError",
    "TlsError",
    # lock events and command kinds by their one names (events.py)
    "EventType", "Method", "Result", "CommandKind", "CommandStatus", "Event", "decode_event",
    # transactional messages (transaction.py)
    "TransactionProducer", "TxnMessage", "TxnResult", "idempotent_transaction",
]
