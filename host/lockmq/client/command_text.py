"""A downlink command in its text form: a kind's one name and its arguments as words
(``unlock --seconds 5``, ``cards 0a1b...``, ``config '{...}'``, ``fw-update V SIZE SHA``)
turned into the protocol's ``(kind, args)`` (SPEC §4).

The one text form, shared by ``lockmq command`` and the MQTT command topics
(``lockmq/command/<SN>/<kind>``): it lives in the client library, below both.
"""

from __future__ import annotations

import json
import struct

from lockmq.security.principal import COMMAND_KINDS

#: the kinds by their one name (protocol/table.py): the choices, the lock's log, the rights
KINDS = tuple(COMMAND_KINDS)


def command_args(kind: str, values: list[str], seconds: int,
                 network: bool = False) -> tuple[int, bytes]:
    """The protocol's (kind, args) for a command given on the command line (SPEC §4).

    ``network`` marks a config change as a network change (``"network": true``)."""
    if kind not in ARGS:
        raise ValueError(f"unknown command kind {kind!r} (kinds: {', '.join(KINDS)})")
    return COMMAND_KINDS[kind], ARGS[kind](values, seconds, network)


def _unlock_args(values: list[str], seconds: int, network: bool) -> bytes:
    if not 1 <= seconds <= 0xFFFF:
        raise ValueError("--seconds must be within 1..65535")
    return struct.pack(">H", seconds)


def _cards_args(values: list[str], seconds: int, network: bool) -> bytes:
    cards = [bytes.fromhex(v) for v in values]
    if any(not 1 <= len(c) <= 255 for c in cards):
        raise ValueError("each card id is 1..255 bytes of hex")
    return struct.pack(">H", len(cards)) + b"".join(bytes([len(c)]) + c for c in cards)


def _config_args(values: list[str], seconds: int, network: bool) -> bytes:
    settings = json.loads(values[0]) if values else None
    if not isinstance(settings, dict):
        raise ValueError("config takes one JSON object")
    if network:
        settings["network"] = True
    return json.dumps(settings).encode()


def _no_args(values: list[str], seconds: int, network: bool) -> bytes:
    return b""


def fw_update_args(values: list[str], seconds: int = 0, network: bool = False) -> bytes:
    """FW_UPDATE's args from ``VERSION SIZE SHA256`` (what `lockmq firmware release`
    prints): the bundle the lock fetches from the broker over its own link."""
    if len(values) != 3 or not values[1].isdigit():
        raise ValueError("fw-update takes VERSION SIZE SHA256 (printed by `lockmq firmware release`)")
    sha = values[2].lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ValueError("fw-update: SHA256 must be 64 hex digits")
    return json.dumps({"version": values[0], "size": int(values[1]), "sha256": sha}).encode()


#: each kind's args from the command line, by its one name; a kind of the protocol
#: table without an entry here fails tests/client/test_command_cli.py
ARGS = {"unlock": _unlock_args, "cards": _cards_args, "config": _config_args,
        "reboot": _no_args, "fw-update": fw_update_args}
