"""The compiled core's layout constants (host/rust/src/consts.rs) are the Python ones.

The core carries the wire's and the commit log's numbers as Rust constants and
exports them as ``lockmq._core.CONSTANTS``; each is held here to the Python module it
is generated from (scripts/gen_protocol.py writes consts.rs), so a build older than
its source fails here (the C
extension's ``#define``s had no such check).
"""
from __future__ import annotations

import pytest

from lockmq.protocol import _constants, _mac
from lockmq.protocol._bodies import PublishAck
from lockmq.protocol._consume import _MSG_SIZE
from lockmq.store import records

from .helpers import NOT_BUILT, SPEEDUPS

#: each name of CONSTANTS, and its value in the Python source
PYTHON = {
    "VERSION": _constants.VERSION,
    "HEADER_SIZE": _constants.HEADER_SIZE,
    "SUBHEADER_SIZE": _constants.SUBHEADER_SIZE,
    "CRC_SIZE": _constants.CRC_SIZE,
    "MIN_FRAME": _constants.MIN_FRAME,
    "MAX_SN": _constants.MAX_SN,
    "Op.PUBLISH": _constants.Op.PUBLISH,
    "Op.PUBLISH_ACK": _constants.Op.PUBLISH_ACK,
    "Flag.ONEWAY": _constants.Flag.ONEWAY,
    "Flag.RESPONSE": _constants.Flag.RESPONSE,
    "Flag.MAC": _constants.Flag.MAC,
    "PublishAck.STORED": PublishAck.STORED,
    "PublishAck.DUPLICATE": PublishAck.DUPLICATE,
    "TAG_SIZE": _mac.TAG_SIZE,
    "TO_BROKER": _mac.TO_BROKER,
    "TO_CLIENT": _mac.TO_CLIENT,
    "MSG_FIXED": _MSG_SIZE,
    "records.HEADER_SIZE": records.HEADER_SIZE,
    "records.FORMAT_VERSION": records.FORMAT_VERSION,
    "records.FLAG_SYSTEM": records.FLAG_SYSTEM,
    "records.MAX_SN_LEN": records.MAX_SN_LEN,
    "records.MAX_SEQ": records.MAX_SEQ,
}
# ... and every opcode, flag and error code (consts.rs is generated from protocol/table.py)
for _cls in (_constants.Op, _constants.Flag, _constants.ErrorCode):
    for _name, _value in vars(_cls).items():
        if not _name.startswith("_"):
            PYTHON[f"{_cls.__name__}.{_name}"] = _value


@pytest.mark.skipif(SPEEDUPS is None, reason=NOT_BUILT.kwargs["reason"])
def test_every_constant_of_the_core_is_its_python_sources() -> None:
    assert SPEEDUPS.CONSTANTS == PYTHON


@pytest.mark.skipif(SPEEDUPS is None, reason=NOT_BUILT.kwargs["reason"])
def test_the_core_says_the_interface_version_this_tree_calls() -> None:
    from lockmq import accel

    assert SPEEDUPS.API == accel.API
    assert all(hasattr(SPEEDUPS, name) for name in accel.REQUIRED)
