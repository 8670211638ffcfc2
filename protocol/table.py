# The protocol table: every number and name the wire, the lock and the host share,
# written once. Edit this file, then run
#
#     python scripts/gen_protocol.py
#
# which writes from it: protocol/_constants.py (the host's constant classes), the
# `_NAME = const(value)` lines of each lock-side module (protocol/_*.py and
# firmware/lockapp/*.py, between "generated" marker comments), the compiled core's
# host/rust/src/consts.rs, and the tables of protocol/SPEC.md (between marker
# comments). tests/protocol/test_table.py regenerates everything and fails on any
# difference, naming the file and this command.
#
# Why a plain-Python data module and not, say, TOML: host code reads the names and
# the rights straight from here (security/principal.py, the CLI, the client's enums,
# Spark), so there is no second parser and no data file to ship. Why the lock gets
# const() lines in each module and not one module of constants: MicroPython folds a
# `_NAME = const(v)` into the bytecode of the module that declares it (no heap),
# while every name imported from another module is a dict entry on the lock's heap
# (docs/firmware.md "Memory"); the lock never imports this file.
#
# Rows are tuples (MicroPython's subset: no dataclasses). Names are upper case;
# the one text name of an event type (and of a method, a result) is its NAME in lower
# case (`door_left_open`: the firmware log, the client, the CLI and Spark say that);
# a command kind's row names it (`fw-update`: what the CLI takes, what the lock logs
# and the token right that allows it).

# -- numbers: (name, value, what it is) -------------------------------------------------
NUMBERS = (
    ("VERSION", 1, "the version byte of every frame"),
    ("HEADER_SIZE", 8, "version u8 | length u32 | opcode u16 | sn_len u8"),
    ("SUBHEADER_SIZE", 5, "flags u8 | opaque u32 (after the SN)"),
    ("CRC_SIZE", 2, "the crc16 that ends a frame"),
    ("MIN_FRAME", 15, "header + subheader + crc: empty SN, empty body"),
    ("MAX_SN", 64, "the longest SN a frame carries"),
    ("DEFAULT_MAX_FRAME", 64 * 1024, "the frame limit when none is configured"),
    ("HARD_MAX_FRAME", 16 * 1024 * 1024, "the frame limit no setting goes above"),
    ("NONCE_SIZE", 16, "CHALLENGE nonce and AUTH cnonce"),
    ("NO_SEQ", 0xFFFFFFFF, "CONNECT_ACK.last_seq: no sequence stored yet"),
    ("TAG_SIZE", 16, "a frame MAC: HMAC-SHA256 cut to 128 bits"),
    ("TO_BROKER", 0, "frame-MAC direction byte: client -> broker"),
    ("TO_CLIENT", 1, "frame-MAC direction byte: broker -> client (a reflected frame fails)"),
)

# -- opcodes (u16): (name, code, direction, answer) -------------------------------------
# 0x0000-0x00FF core, 0x0100-0x01FF admin, 0x8000+ vendor.
OPCODES = (
    ("CONNECT", 0x01, "peer → broker", "CHALLENGE"),
    ("CHALLENGE", 0x02, "broker → peer", "AUTH"),
    ("AUTH", 0x03, "peer → broker", "CONNECT_ACK or ERROR"),
    ("CONNECT_ACK", 0x04, "broker → peer", "—"),
    ("HEARTBEAT", 0x05, "both", "HEARTBEAT with RESPONSE (unless ONEWAY)"),
    ("DISCONNECT", 0x06, "both", "— (the sender closes)"),
    ("OK", 0x0E, "both", "generic success answer, empty body"),
    ("ERROR", 0x0F, "both", "—"),
    ("PUBLISH", 0x10, "producer → broker", "PUBLISH_ACK or ERROR (none if ONEWAY)"),
    ("PUBLISH_ACK", 0x11, "broker → producer", "—"),
    ("TXN_PUBLISH", 0x12, "producer → broker",
     "TXN_PUBLISH_ACK or ERROR (§\"Transactional messages\")"),
    ("TXN_PUBLISH_ACK", 0x13, "broker → producer", "—"),
    ("TXN_END", 0x14, "producer → broker", "OK or ERROR"),
    ("TXN_CHECK", 0x15, "broker → producer (push)", "TXN_CHECK_ANSWER"),
    ("TXN_CHECK_ANSWER", 0x16, "producer → broker", "— (never answered)"),
    ("TXN_JOIN", 0x17, "producer → broker", "OK or ERROR"),
    ("PUBLISH_AT", 0x18, "producer → broker",
     "PUBLISH_ACK (offset = schedule id) or ERROR (none if ONEWAY) — \"Scheduled delivery\""),
    ("SCHEDULE_CANCEL", 0x19, "service → broker", "OK or ERROR"),
    ("SUBSCRIBE", 0x20, "consumer → broker", "SUBSCRIBE_ACK"),
    ("SUBSCRIBE_ACK", 0x21, "broker → consumer", "—"),
    ("UNSUBSCRIBE", 0x22, "consumer → broker", "OK"),
    ("NOTIFY", 0x23, "broker → consumer", "—"),
    ("PULL", 0x24, "consumer → broker", "MESSAGES (possibly empty)"),
    ("MESSAGES", 0x25, "broker → consumer", "ACK / NACK later"),
    ("ACK", 0x26, "consumer → broker", "OK (none if ONEWAY)"),
    ("NACK", 0x27, "consumer → broker", "OK (none if ONEWAY)"),
    ("COMMAND", 0x30, "service → broker → lock", "COMMAND_RESULT"),
    ("COMMAND_RESULT", 0x31, "lock → broker → service", "—"),
    ("COMMAND_AT", 0x32, "service → broker", "COMMAND_SCHEDULED or ERROR"),
    ("COMMAND_SCHEDULED", 0x33, "broker → service", "—"),
    ("FW_FETCH", 0x34, "lock → broker", "FW_CHUNK or ERROR (\"Firmware bundles\")"),
    ("FW_CHUNK", 0x35, "broker → lock", "— (a RESPONSE)"),
    ("ADMIN_REQUEST", 0x100, "admin → broker", "ADMIN_RESPONSE"),
    ("ADMIN_RESPONSE", 0x101, "broker → admin", "—"),
)
#: ranges no opcode may take yet: (first, last, why), shown in the SPEC's table
RESERVED_OPCODES = (
    (0x1A, 0x1B, "(reserved for scheduled delivery)"),
)

# -- frame flags (u8): (name, bit value, meaning) ---------------------------------------
FLAGS = (
    ("ONEWAY", 0x01, "the sender wants no answer (oneway publish)"),
    ("RESPONSE", 0x02, "this frame answers the request with the same opaque"),
    ("MAC", 0x04, "the body ends with a 16-byte frame tag; on CONNECT: the lock asks for them"),
)

# -- CONNECT.role (u8) and the AUTH methods (u8, also a bitmask in CHALLENGE) -----------
ROLES = (
    ("LOCK", 1, "a lock"),
    ("SERVICE", 2, "a service (producer, consumer)"),
    ("ADMIN", 3, "an admin tool"),
)
AUTH_METHODS = (
    ("DEVICE_HMAC", 1, "a lock's device key"),
    ("TOKEN", 2, "a service token"),
)

# -- error codes (u16): (name, code, meaning and what the peer should do) ---------------
ERROR_CODES = (
    ("BAD_FRAME", 1, "frame length or SN length impossible; connection closed"),
    ("UNSUPPORTED_VERSION", 2, "version byte is not 1; connection closed"),
    ("FRAME_TOO_LARGE", 3, "length over the receiver's `max_frame`; connection closed"),
    ("BAD_CHECKSUM", 4, "CRC mismatch; connection closed"),
    ("UNKNOWN_OPCODE", 5, "frame skipped; the stream goes on"),
    ("BAD_BODY", 6, "body does not match its opcode's layout"),
    ("UNEXPECTED_FRAME", 7, "valid frame at the wrong moment (e.g. PULL from a lock)"),
    ("INVALID_ARGUMENT", 8, "a field value is not acceptable (bad topic name, ...)"),
    ("NOT_AUTHENTICATED", 10, "frame before CONNECT_ACK"),
    ("AUTH_FAILED", 11, "unknown SN, wrong key, bad token — deliberately the same answer"),
    ("FORBIDDEN", 12, "authenticated, but not allowed to do this"),
    ("SN_MISMATCH", 13, "a lock's frame carries another SN"),
    ("TOKEN_EXPIRED", 14, "the service token is past its expiry"),
    ("REPLAY", 15, "a nonce or command id seen before"),
    ("AUTH_TIMEOUT", 16, "did not authenticate in time; connection closed"),
    ("BAD_MAC", 17, "frame tag missing, wrong, replayed or reordered (§2 \"Frame MACs\"); "
                    "connection closed, the frame was not acted on"),
    ("BUSY", 20, "broker cannot take it now; retry after `retry_after_ms`"),
    ("RATE_LIMITED", 21, "over a configured rate; retry after `retry_after_ms`"),
    ("TOO_MANY_CONNECTIONS", 22, "connection limit reached; retry later"),
    ("STORAGE_FULL", 23, "disk reserve reached; retry after `retry_after_ms`"),
    ("LIMIT_EXCEEDED", 24, "a configured cap on what this connection or principal holds "
                           "(subscriptions per connection, clusters per token ...) is reached; "
                           "the request is refused, nothing else changes, the connection stays "
                           "open. Retrying as is will not help: release something first "
                           "(unsubscribe, an admin deletes a cluster)"),
    ("UNKNOWN_TOPIC", 30, "no such topic"),
    ("UNKNOWN_SUBSCRIPTION", 31, "`sub_id` not open on this connection"),
    ("UNKNOWN_LEASE", 32, "ack/nack of a lease that expired or is not yours"),
    ("INFLIGHT_LIMIT", 33, "member or cluster in-flight cap reached"),
    ("LOCK_OFFLINE", 40, "command target offline (and the command expired)"),
    ("COMMAND_EXPIRED", 41, "command past `expires_ms`"),
    ("COMMAND_FAILED", 42, "the lock ran the command and it failed"),
    ("INTERNAL", 50, "broker bug; logged"),
    ("SHUTTING_DOWN", 51, "broker is stopping; reconnect elsewhere or later"),
)

# -- the lock event: the PUBLISH payload on "lock.events" -------------------------------
#: (field, type): the record in order. The fixed fields' types are struct codes'
#: names; ``credential`` (a u8 length, then the bytes) ends it.
EVENT_RECORD = (
    ("event_type", "u8"),
    ("method", "u8"),
    ("result", "u8"),
    ("value", "u16"),
    ("ts_ms", "u64"),
    ("credential", "bytes8"),
)
#: event_type (u8): (NAME, code, what happened). The lock emits 1-5.
EVENT_TYPES = (
    ("UNLOCK", 1, "unlock"),
    ("FAILED_ATTEMPT", 2, "failed attempt"),
    ("DOOR_LEFT_OPEN", 3, "door left open (value = seconds)"),
    ("TAMPER", 4, "tamper (value = sensor id)"),
    ("LOW_BATTERY", 5, "low battery (value = percent)"),
    ("DOOR_OPENED", 6, "door opened"),
    ("DOOR_CLOSED", 7, "door closed"),
    ("LOCKED", 8, "locked"),
)
#: method (u8): how the lock was operated
METHODS = (
    ("NONE", 0, "none"),
    ("CARD", 1, "card"),
    ("PIN", 2, "PIN"),
    ("REMOTE", 3, "remote"),
    ("KEY", 4, "mechanical key"),
    ("FINGERPRINT", 5, "fingerprint"),
)
#: result (u8)
RESULTS = (
    ("OK", 0, "ok"),
    ("DENIED_UNKNOWN", 1, "denied: unknown credential"),
    ("DENIED_EXPIRED", 2, "denied: expired"),
    ("DENIED_SCHEDULE", 3, "denied: schedule"),
    ("ERROR", 4, "error"),
)

# -- downlink commands ------------------------------------------------------------------
#: COMMAND.kind (u8): (NAME, code, name, args layout, what it does). ``name`` is the one
#: text name: what the CLI takes, what the lock logs, and the token right that allows
#: the kind (``--command fw-update:LOCK-*``, security/principal.py).
COMMAND_KINDS = (
    ("UNLOCK", 1, "unlock", "seconds u16", "open the door for that long (the lock takes 1..600)"),
    ("CARDS_SET", 2, "cards", "count u16 · count × credential bytes8",
     "replace the lock's card list"),
    ("CONFIG", 3, "config", "UTF-8 JSON object of settings",
     "change settings (where the lock connects: only with the config.network right)"),
    ("REBOOT", 4, "reboot", "empty", "reboot the lock"),
    ("FW_UPDATE", 5, "fw-update", "UTF-8 JSON `{\"version\", \"size\", \"sha256\"}`",
     "fetch a bundle released to the broker (FW_FETCH, \"Firmware bundles\") and switch to it"),
)
#: COMMAND_RESULT.status (u8): (NAME, code, meaning)
COMMAND_STATUS = (
    ("OK", 0, "ok"),
    ("FAILED", 1, "failed"),
    ("REFUSED", 2, "refused (bad MAC, replay, unauthorised)"),
    ("EXPIRED", 3, "expired"),
    ("OFFLINE", 4, "offline (the broker gave up: the lock stayed offline past the expiry)"),
    ("UNSUPPORTED", 5, "unsupported"),
)

#: the constant classes of protocol/_constants.py: (class, rows, docstring)
CLASSES = (
    ("Op", OPCODES, "Opcodes (u16). 0x0000-0x00FF core, 0x0100-0x01FF admin, 0x8000+ vendor."),
    ("Flag", FLAGS, "Frame flags (u8). Reserved bits are sent as 0 and ignored on receipt."),
    ("Role", ROLES, "Who connects (CONNECT body)."),
    ("AuthMethod", AUTH_METHODS,
     "How a peer proves who it is (AUTH body); also a bitmask in CHALLENGE."),
    ("ErrorCode", ERROR_CODES, "Error codes (u16) carried by ERROR frames and by ProtocolError.code."),
    ("EventType", EVENT_TYPES, "LockEvent.event_type (u8)."),
    ("Method", METHODS, "LockEvent.method (u8): how the lock was operated."),
    ("Result", RESULTS, "LockEvent.result (u8)."),
    ("CommandKind", COMMAND_KINDS, "COMMAND.kind (u8); the text names in protocol/table.py."),
    ("CommandStatus", COMMAND_STATUS, "COMMAND_RESULT.status (u8)."),
)


def event_name(name):
    """The one text name of an event type: ``DOOR_LEFT_OPEN`` -> ``door_left_open``."""
    return name.lower()


def names(rows):
    """``{code: one text name}`` of a table's rows: the command kinds' name column,
    else NAME in lower case."""
    if rows is COMMAND_KINDS:
        return {row[1]: row[2] for row in rows}
    return {row[1]: event_name(row[0]) for row in rows}
