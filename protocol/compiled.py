# Where a host's compiled core plugs into the protocol (CPython only; a lock never
# imports this module). lockmq.accel chooses the core once per process, at import, and
# calls use() then; the protocol's own code stays the reference and the fallback, the
# same bytes (the shared vectors and tests/protocol/test_frame_macs.py hold them equal).
import hmac

from . import _crc, _mac
from ._mac import session_pads

__all__ = ["use", "session_pads"]


def use(crc16, mac_pads, frame_tag):
    """Encode, decode, seal and open every frame from now on with the compiled CRC-16
    (``crc16(data, crc)``) and frame tags (``frame_tag(mac_pads(session key), direction,
    counter, opcode, flags, opaque, sn, body)``), compared by CPython's
    ``hmac.compare_digest``: the bytes and answers of ``_crc`` and ``_mac``, computed
    faster. :func:`session_pads` is then a session's ``mac_pads``, made once, which the
    core's batch calls over sealed frames take too."""
    _crc.use(crc16)
    _mac._keyed, _mac._tag, _mac._equal = mac_pads, frame_tag, hmac.compare_digest
