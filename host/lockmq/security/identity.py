"""Names nobody may take over: producer ids, the broker's own ids, system topics.

Three rules, each checked on the broker for every request that uses a name:

* **Producer ids** (the SN field of a PUBLISH: the ``sn`` of ``(sn, seq)``, the key of
  the store's duplicate table). A lock publishes only as its own SN. A token holder
  publishes under an id that (1) follows the identity charset
  of :func:`lockmq.protocol.identity_problem` (so never ``$...``: that space is the
  broker's), (2) does not fold (case-insensitively) onto a registered lock SN, and
  (3) is *owned* by its principal: the first principal that publishes under an id owns
  it (persisted in the registry, so it survives restarts) and any other principal is
  refused. Without (3) one service could publish ``seq 0xFFFFFFFF`` under another's id
  and make the store drop that producer's records as duplicates.
* **Broker ids**: the broker writes its own records (``$devices``, ``$heartbeats``,
  retries, dead letters) under ``$broker``; the store never runs those through
  producer dedup (``lockmq.store.dedup.is_system_sn``).
* **System topics** (``$...``): writable by a token only with the explicit ``system``
  right (never implied by ``*``, ``$*`` or ``--admin``); the broker-internal ones
  (:data:`INTERNAL_TOPICS`, :data:`INTERNAL_TOPIC_PREFIXES`) by no client at all.

Refusals that depend on the registry answer the same whether the colliding name is a
registered lock or another principal's id (no SN enumeration).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from lockmq.protocol import IDENTITY_RULE, identity_problem

from .errors import PermissionDenied

#: Names starting with this belong to the broker (ids and system topics).
RESERVED_PREFIX = "$"
#: The producer ids the broker writes its own records under.
BROKER_IDS = frozenset({"$broker"})
#: System topics only the broker writes (plus the configured devices topics).
INTERNAL_TOPICS = frozenset({"$devices", "$heartbeats",
                             # the scheduler's items and op records (broker/scheduler.py)
                             "$scheduled",
                             # a transaction's command half (broker/transactions.py): only
                             # through TXN_PUBLISH, never a direct publish
                             "$command"})
#: Prefixes of broker-internal topics: retry queues, dead letters, anything ``$broker``.
INTERNAL_TOPIC_PREFIXES = ("$retry.", "$dlq.", "$broker", "$sys.")


def fold(ident: str) -> str:
    """The case-folded form two ids are compared in (``lock-0001`` == ``LOCK-0001``)."""
    return ident.casefold()


def is_internal_topic(topic: str, extra: Iterable[str] = ()) -> bool:
    """True for a topic no client may ever write (``$retry.*``, ``$dlq.*``,
    ``$devices``, ``$heartbeats``, ... and the topics in ``extra``)."""
    return (topic in INTERNAL_TOPICS or topic.startswith(INTERNAL_TOPIC_PREFIXES)
            or topic in extra)


def owner_of(principal: Any) -> str:
    """The owner key of a principal for ids and clusters it creates.

    A token holder is its *token name* (``token:billing``): a rotated token of the same
    name keeps what the old one owned; locks are ``lock:<SN>``; with ``auth = "off"``
    the claimed name (``admin:<client id>``).
    """
    name = getattr(principal, "token_name", "") or ""
    if name:
        return f"token:{name}"
    return f"{getattr(principal, 'kind', '?')}:{getattr(principal, 'name', '')}"


def _refuse(reason: str, detail: str, public: str) -> PermissionDenied:
    exc = PermissionDenied(detail, reason=reason)
    exc.public_message = public
    return exc


def system_topic_refusal(principal: Any, topic: str, internal: bool) -> PermissionDenied:
    """The FORBIDDEN error for a publish to a ``$`` topic (``internal``: one only the
    broker writes; else one that needs the ``system`` right)."""
    shown = repr(topic[:130])
    if internal:
        return _refuse("internal_topic", f"{principal.kind} {principal.name} may not publish "
                       f"to broker-internal topic {shown}",
                       f"topic {shown} is written only by the broker")
    return _refuse("system_topic", f"{principal.kind} {principal.name} has no system right "
                   f"for {shown}", f"publishing to system topic {shown} needs the system "
                   "right (lockmq tokens create --system)")


def check_producer_id(principal: Any, producer_id: str, *,
                      taken: Callable[[str, str], bool] | None = None) -> str:
    """Check that ``principal`` may publish under ``producer_id``; return it.

    ``taken(producer_id, owner)`` (the registry's claim, see
    ``DeviceRegistry.claim_producer_id``) is asked last, for token holders only: True
    means the id folds onto a registered lock SN or is owned by another principal.
    Without it (``auth = "off"``) only the charset and the reserved space are checked.

    Raises :class:`PermissionDenied` (FORBIDDEN) with a readable public message; the
    registry-dependent refusal says the same for a lock's SN and another service's id.
    """
    pid = producer_id
    # the one identity rule of SNs, client ids and producer ids (the protocol's: the
    # session refuses anything else at CONNECT; this checks again per PUBLISH)
    if not isinstance(pid, str) or identity_problem(pid) is not None:
        shown = repr(pid)[:80]
        if isinstance(pid, str) and pid.startswith(RESERVED_PREFIX):
            raise _refuse("producer_id_reserved", f"{principal.name} used producer id {shown}",
                          f"producer id {shown} is reserved: ids starting with '$' "
                          "belong to the broker")
        raise _refuse("producer_id_invalid", f"{principal.name} used producer id {shown}",
                      f"producer id {shown} is not {IDENTITY_RULE}")
    if getattr(principal, "kind", "") == "lock":
        if pid != principal.name:   # (check_frame_sn refuses this earlier, with SN_MISMATCH)
            raise _refuse("producer_id_not_own", f"lock {principal.name} used {pid!r}",
                          "a lock publishes only under its own SN")
        return pid
    if taken is not None and taken(pid, owner_of(principal)):
        raise _refuse("producer_id_taken",
                      f"{owner_of(principal)} may not use producer id {pid!r} (a registered "
                      "lock's SN, or another principal's id)",
                      f"producer id {pid!r} is not available to this token: it belongs to "
                      "another principal; use another id")
    return pid
