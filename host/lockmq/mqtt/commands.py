"""Downlink commands from MQTT: a topic ``.../<SN>/<kind>`` and a payload become a
``Command`` for the broker's command path, and its result a JSON PUBLISH.

Used by the listener (``lockmq/command/<SN>/<kind>``) and the bridge (commands from
the upstream on ``[bridge] command_filter``). The rights, caps and expiry are the
command path's (``broker/commands.py``: ``Commands.submit`` asks the guard).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from lockmq.client.command_text import command_args as cli_args   # the one text form
from lockmq.protocol import Command, CommandResult, CommandStatus, ErrorCode, Op
from lockmq.security import SecurityError
from lockmq.security.principal import COMMAND_KINDS, KIND_NAMES

from .codec import reason as rc
from .delivery import command_result
from .rights import message_of, reason_of


def _error_name(code: int) -> str:
    for k, v in vars(ErrorCode).items():
        if v == code and k.isupper():
            return k
    return str(code)


class CommandSender:
    """Stands in for a lockmq connection in the command path (``Commands.submit``):
    the lock's result, or a refusal, goes to ``reply(json_payload)``."""

    def __init__(self, principal: Any, is_closed: Callable[[], bool],
                 reply: Callable[[bytes], None]) -> None:
        self.principal = principal
        self._is_closed = is_closed
        self._reply = reply
        self.sn = ""
        self.kind = ""
        #: set while ``submit`` runs if it refused the command: (reason, message)
        self.refusal: tuple[int, str] | None = None

    @property
    def closed(self) -> bool:
        """Where the result would go is gone (the command path then drops it)."""
        return self._is_closed()

    def send_frame(self, opcode: int, body: bytes, opaque: int = 0, flags: int = 0) -> None:
        """The command's answer (COMMAND_RESULT)."""
        if opcode == Op.COMMAND_RESULT:
            res = CommandResult.decode(body)
            self._reply(command_result(self.sn, self.kind, res.status, res.detail))

    def send_error(self, code: int, message: str, opaque: int, retry_after_ms: int = 0) -> None:
        """Refused by the command path (caps, size, expiry) or a bad command."""
        name = _error_name(code)
        self.refusal = (rc.QUOTA_EXCEEDED if name == "BUSY" else rc.IMPLEMENTATION_SPECIFIC,
                        message)
        self._reply(command_result(self.sn, self.kind, CommandStatus.REFUSED, message, name))

    def refused(self, exc: SecurityError, opaque: int) -> None:
        """Refused by the guard."""
        self.refusal = (reason_of(exc), message_of(exc))
        self._reply(command_result(self.sn, self.kind, CommandStatus.REFUSED, message_of(exc),
                                   exc.code_name))


def command_args(kind_name: str, payload: bytes, raw: bool) -> bytes:
    """A command's protocol arguments from an MQTT payload: ``raw`` (MQTT 5 content
    type ``application/octet-stream``) as they are; else the text ``lockmq command``
    takes (unlock: seconds, default 5; cards: hex ids; config: JSON; fw-update:
    URL and SHA-256)."""
    if raw:
        return payload
    text = payload.decode("utf-8", "replace").strip()
    if kind_name == "unlock":
        seconds = int(text) if text else 5
        return cli_args("unlock", [], seconds)[1]
    if kind_name == "config":
        return cli_args("config", [text] if text else [], 0)[1]
    return cli_args(kind_name, text.split(), 0)[1]


def submit_command(commands: Any, sender: CommandSender, tail: str, p: Any) -> None:
    """Submit the command of PUBLISH ``p`` whose topic ends ``tail`` = ``<SN>/<kind>``;
    a malformed one is refused through ``sender`` (INVALID_ARGUMENT)."""
    sn, _, kind_name = tail.partition("/")
    sender.sn, sender.kind = sn, kind_name
    kind = COMMAND_KINDS.get(kind_name)
    if kind is None and kind_name.isdigit():
        kind = int(kind_name)
        sender.kind = kind_name = KIND_NAMES.get(kind, kind_name)
    try:
        if not sn or kind is None or "/" in kind_name:
            raise ValueError(f"a command topic ends <SN>/<kind>, kind one of "
                             f"{', '.join(COMMAND_KINDS)}")
        args = command_args(kind_name, p.payload,
                            p.props.get("content_type") == "application/octet-stream")
    except ValueError as exc:
        sender.send_error(int(ErrorCode.INVALID_ARGUMENT), str(exc), 0)
        return
    expires_ms = 0
    if "message_expiry" in p.props:
        expires_ms = int(time.time() * 1000) + int(p.props["message_expiry"]) * 1000
    commands.submit(sender, 0, Command(sn, 0, expires_ms, kind, args))
