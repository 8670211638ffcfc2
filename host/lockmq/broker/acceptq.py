"""The kernel's accept queue in front of the broker: connections not yet accepted.

In a reconnect storm the event loop can fall behind the locks' handshakes. The
kernel then holds the new connections in each listener's accept queue (``[broker]
backlog``, capped by ``net.core.somaxconn``); once that is full it drops further
handshakes, and a dropped lock's TCP sends its SYN again only after 1 s (then 2, 4
...). Nothing is refused or lost, but those locks connect seconds late, and the
broker never sees them to count them. Two readings show it:

* :func:`accept_queue` -- the connections waiting in the broker's own listeners now,
  and the queue's size (``TCP_INFO`` of a listening socket);
* :func:`tcp_ext_counters` -- the host's ``TcpExt`` counters, e.g. ``ListenOverflows``:
  handshakes dropped because an accept queue was full (every listener of the host's
  network namespace, since boot).

Linux only; elsewhere both answer None.
"""

from __future__ import annotations

import socket
import sys
from typing import Iterable

#: ``tcp_info``: eight one-byte fields, then native u32 ``rto``, ``ato``, ``snd_mss``,
#: ``rcv_mss``, ``unacked``, ``sacked``; for a socket in LISTEN the kernel reports its
#: accept queue's length as ``unacked`` and its size as ``sacked``
_UNACKED = slice(24, 28)
_SACKED = slice(28, 32)
_TCP_LISTEN = 10   # tcpi_state of a listening socket (TCP_LISTEN)
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def accept_queue(listeners: Iterable[socket.socket]) -> tuple[int, int] | None:
    """``(waiting, size)``: connections the kernel holds for ``listeners`` to accept,
    and how many their queues can hold, summed; None where the kernel cannot tell."""
    if _TCP_INFO is None:
        return None
    waiting = size = 0
    known = False
    for sock in listeners:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 104)
        except OSError:
            continue
        if len(info) < _SACKED.stop or info[0] != _TCP_LISTEN:
            continue
        waiting += int.from_bytes(info[_UNACKED], sys.byteorder)
        size += int.from_bytes(info[_SACKED], sys.byteorder)
        known = True
    return (waiting, size) if known else None


def tcp_ext_counters(names: tuple[str, ...]) -> dict[str, int] | None:
    """The ``TcpExt`` counters ``names`` of this network namespace (every socket in it,
    since boot) from ``/proc/net/netstat``; None where they cannot be read."""
    try:
        with open("/proc/net/netstat") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for head, values in zip(lines[::2], lines[1::2]):
        if head.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(head.split()[1:], values.split()[1:]))
            try:
                return {name: int(table[name]) for name in names}
            except (KeyError, ValueError):
                return None
    return None
