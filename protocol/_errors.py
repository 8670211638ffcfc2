# Typed protocol errors. Every error carries an ErrorCode a peer can act on,
# a message a person can read and a ``kind``: the error's name.
#
# The host raises (and catches) a distinct class per kind. A lock has one class,
# ProtocolError, with the kind in an attribute: nine classes took ~1.2 KiB of its
# heap, and it only ever catches ProtocolError. There BadBody(...) etc. are functions
# that make a ProtocolError of that kind, so `raise BadBody("...")` reads the same.
import sys

from ._const import const

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_E_BAD_BODY = const(6)
_E_BAD_CHECKSUM = const(4)
_E_BAD_FRAME = const(1)
_E_FRAME_TOO_LARGE = const(3)
_E_INVALID_ARGUMENT = const(8)
_E_UNKNOWN_OPCODE = const(5)
_E_UNSUPPORTED_VERSION = const(2)
# -- end of generated protocol numbers --


class ProtocolError(Exception):
    """Base of every lockmq protocol error.

    ``code`` is an ErrorCode; ``fatal`` says whether the byte stream can go on
    (False only when the decoder skipped a whole, well-formed frame); ``kind`` is
    the error's name (its class name on the host).
    """
    code = _E_BAD_FRAME
    fatal = True

    def __init__(self, message, code=None, kind=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.kind = kind or type(self).__name__


if sys.implementation.name == "micropython":
    def LocalProtocolError(message):
        return ProtocolError(message, _E_INVALID_ARGUMENT, "LocalProtocolError")

    def RemoteProtocolError(message, code=_E_BAD_FRAME):
        return ProtocolError(message, code, "RemoteProtocolError")

    def BadFrame(message):
        return ProtocolError(message, _E_BAD_FRAME, "BadFrame")

    def UnsupportedVersion(message):
        return ProtocolError(message, _E_UNSUPPORTED_VERSION, "UnsupportedVersion")

    def FrameTooLarge(message):
        return ProtocolError(message, _E_FRAME_TOO_LARGE, "FrameTooLarge")

    def BadChecksum(message):
        return ProtocolError(message, _E_BAD_CHECKSUM, "BadChecksum")

    def UnknownOpcode(message):
        e = ProtocolError(message, _E_UNKNOWN_OPCODE, "UnknownOpcode")
        e.fatal = False
        return e

    def BadBody(message):
        return ProtocolError(message, _E_BAD_BODY, "BadBody")

else:
    class LocalProtocolError(ProtocolError):
        """We were asked to encode something the format cannot carry."""
        code = _E_INVALID_ARGUMENT

    class RemoteProtocolError(ProtocolError):
        """The peer sent bytes that break the format."""

    class BadFrame(RemoteProtocolError):
        code = _E_BAD_FRAME

    class UnsupportedVersion(RemoteProtocolError):
        code = _E_UNSUPPORTED_VERSION

    class FrameTooLarge(RemoteProtocolError):
        code = _E_FRAME_TOO_LARGE

    class BadChecksum(RemoteProtocolError):
        code = _E_BAD_CHECKSUM

    class UnknownOpcode(RemoteProtocolError):
        """A well-formed frame with an opcode this side does not know; skipped."""
        code = _E_UNKNOWN_OPCODE
        fatal = False

    class BadBody(RemoteProtocolError):
        """The frame is sound but its body does not match its opcode's layout."""
        code = _E_BAD_BODY
