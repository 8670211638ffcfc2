# Typed protocol errors. Every error carries an ErrorCode a peer can act on
# and a message a person can read.
from ._constants import ErrorCode


class ProtocolError(Exception):
    """Base of every lockmq protocol error.

    ``code`` is an ErrorCode; ``fatal`` says whether the byte stream can go on
    (False only when the decoder skipped a whole, well-formed frame).
    """
    code = ErrorCode.BAD_FRAME
    fatal = True

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class LocalProtocolError(ProtocolError):
    """We were asked to encode something the format cannot carry."""
    code = ErrorCode.INVALID_ARGUMENT


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the format."""


class BadFrame(RemoteProtocolError):
    code = ErrorCode.BAD_FRAME


class UnsupportedVersion(RemoteProtocolError):
    code = ErrorCode.UNSUPPORTED_VERSION


class FrameTooLarge(RemoteProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class BadChecksum(RemoteProtocolError):
    code = ErrorCode.BAD_CHECKSUM


class UnknownOpcode(RemoteProtocolError):
    """A well-formed frame with an opcode this side does not know; skipped."""
    code = ErrorCode.UNKNOWN_OPCODE
    fatal = False


class BadBody(RemoteProtocolError):
    """The frame is sound but its body does not match its opcode's layout."""
    code = ErrorCode.BAD_BODY
