"""lockmq wire protocol: a sans-IO codec shared by the lock firmware
(MicroPython) and the host (CPython).

Feed received bytes to a :class:`FrameDecoder` and take :class:`Frame`
objects out; build bytes with :func:`encode_frame` and the body classes.
No sockets, files or clocks here. The format is specified in SPEC.md.
"""
import sys

if sys.implementation.name != "micropython":
    from ._constants import (VERSION, MIN_FRAME, MAX_SN, DEFAULT_MAX_FRAME, HARD_MAX_FRAME,
                             NONCE_SIZE, NO_SEQ, Op, Flag, Role, AuthMethod, ErrorCode,
                             EventType, Method, Result, CommandKind, CommandStatus, op_name)
    from ._errors import (ProtocolError, LocalProtocolError, RemoteProtocolError, BadFrame,
                          UnsupportedVersion, FrameTooLarge, BadChecksum, UnknownOpcode, BadBody)
    from ._crc import crc16
    from ._hmac import hmac_sha256, compare_digest
    from ._frame import Frame, FrameDecoder, encode_frame
    from ._bodies import (Connect, Challenge, Auth, ConnectAck, Heartbeat, Disconnect, ErrorReply,
                          Publish, PublishAck, Command, CommandResult, encode_json, decode_json,
                          decode_body, BODY_TYPES)
    from ._event import LockEvent, EVENT_HEADER_SIZE
    from ._event import _EVT as EVENT_FORMAT        # the record's fixed part, a struct format
    from ._auth import (auth_proof, command_mac, verify_auth_proof, verify_command,
                        transcript_hash)
    from ._session import (ClientSession, SessionError, BROKER_PUSHES, CONNECTING, CHALLENGED,
                           ESTABLISHED, CLOSING)

    # A lock never consumes: on the device these stay out of RAM (import
    # lockmq.protocol._consume explicitly to have them there).
    from ._consume import (Subscribe, SubscribeAck, Unsubscribe, Notify, Pull, Message,
                           Messages, Ack, Nack)
    # Firmware bundles over the lock's link (the broker's half).
    from ._firmware import DIGEST_SIZE, chunk_body, chunk_fields, fetch_body, fetch_fields
    # Likewise the broker's side of the session and the identity rules.
    from ._server_session import ServerSession, CLIENT_REQUESTS, error_frame
    from ._identity import check_identity, identity_problem, IDENTITY_RULE
    # Frame MACs: a lock loads _mac only when its session turns them on.
    from ._mac import session_key, frame_tag, TAG_SIZE

    __all__ = [
        "VERSION", "MIN_FRAME", "MAX_SN", "DEFAULT_MAX_FRAME", "HARD_MAX_FRAME", "NONCE_SIZE",
        "NO_SEQ", "Op", "Flag", "Role", "AuthMethod", "ErrorCode", "EventType", "Method", "Result",
        "CommandKind", "CommandStatus", "op_name",
        "ProtocolError", "LocalProtocolError", "RemoteProtocolError", "BadFrame",
        "UnsupportedVersion", "FrameTooLarge", "BadChecksum", "UnknownOpcode", "BadBody",
        "crc16", "hmac_sha256", "compare_digest",
        "Frame", "FrameDecoder", "encode_frame",
        "Connect", "Challenge", "Auth", "ConnectAck", "Heartbeat", "Disconnect", "ErrorReply",
        "Publish", "PublishAck", "Subscribe", "SubscribeAck", "Unsubscribe", "Notify", "Pull",
        "Message", "Messages", "Ack", "Nack", "Command", "CommandResult", "encode_json",
        "decode_json", "decode_body", "BODY_TYPES", "LockEvent", "EVENT_HEADER_SIZE", "EVENT_FORMAT",
        "DIGEST_SIZE", "chunk_body", "chunk_fields", "fetch_body", "fetch_fields",
        "auth_proof", "command_mac", "verify_auth_proof", "verify_command", "session_key",
        "transcript_hash",
        "frame_tag", "TAG_SIZE",
        "ServerSession", "ClientSession", "SessionError", "check_identity", "identity_problem",
        "IDENTITY_RULE", "error_frame", "CLIENT_REQUESTS", "BROKER_PUSHES",
        "CONNECTING", "CHALLENGED", "ESTABLISHED", "CLOSING",
    ]
else:
    # A lock imports what it uses from the submodules (lockapp does), so the package
    # holds no table of ~60 names in its heap; other MicroPython code (the vector
    # checks) still reads lockmq.protocol.X, looked up here on first use.
    def __getattr__(name):
        if name.startswith("_"):      # `from lockmq.protocol import _mac` asks here first
            try:
                return __import__("lockmq.protocol." + name, None, None, ("*",))
            except ImportError:
                raise AttributeError(name)
        for sub in ("_constants", "_errors", "_crc", "_hmac", "_frame", "_bodies", "_event",
                    "_auth", "_session"):
            mod = __import__("lockmq.protocol." + sub, None, None, ("*",))
            if hasattr(mod, name):
                return getattr(mod, name)
        raise AttributeError(name)
