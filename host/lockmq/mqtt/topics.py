"""The mapping between lockmq topics and MQTT topic names, and MQTT filter matching.

A lockmq topic is 1..128 characters of ``[A-Za-z0-9._$%-]`` (it names a file); its
MQTT name replaces every ``.`` with ``/``: ``lock.events`` is ``lock/events``,
``$dlq.billing`` is ``$dlq/billing``. The mapping is reversible because ``/`` is not
a lockmq topic character. The first MQTT level ``lockmq`` is the broker's own
(commands and their results: ``lockmq/command/<SN>/<kind>``,
``lockmq/result/<client id>``), so a lockmq topic starting ``lockmq.`` has no MQTT
name.
"""

from __future__ import annotations

import hashlib
import re

from lockmq.store.records import validate_topic, InvalidRecord

#: the first MQTT level the broker keeps for itself
RESERVED_LEVEL = "lockmq"
COMMAND_PREFIX = "lockmq/command/"
RESULT_PREFIX = "lockmq/result/"
SHARE_PREFIX = "$share/"
_MQTT_NAME = re.compile(r"^[A-Za-z0-9/_$%-]{1,128}$")


class TopicError(ValueError):
    """An MQTT topic name or filter with no lockmq meaning."""


def to_mqtt(topic: str) -> str:
    """The MQTT name of a lockmq topic (None-safe callers check :func:`mappable`)."""
    return topic.replace(".", "/")


def mappable(topic: str) -> bool:
    """True if the lockmq topic has an MQTT name (not under the reserved level)."""
    return not (topic == RESERVED_LEVEL or topic.startswith(RESERVED_LEVEL + "."))


def to_lockmq(name: str) -> str:
    """The lockmq topic of an MQTT topic name; :class:`TopicError` if it has none."""
    if not _MQTT_NAME.match(name):
        raise TopicError(f"MQTT topic {name[:80]!r} has no lockmq topic: use 1..128 "
                         "characters of [A-Za-z0-9/_$%-] ('/' stands for '.')")
    topic = name.replace("/", ".")
    if not mappable(topic):
        raise TopicError(f"MQTT topics under {RESERVED_LEVEL}/ are the broker's "
                         "(lockmq/command/<SN>/<kind>)")
    try:
        return validate_topic(topic)
    except InvalidRecord as exc:
        raise TopicError(str(exc)) from None


def check_filter(flt: str) -> None:
    """Raise :class:`TopicError` unless ``flt`` is a valid MQTT topic filter."""
    if not flt or len(flt.encode()) > 0xFFFF:
        raise TopicError("empty topic filter")
    levels = flt.split("/")
    for i, lv in enumerate(levels):
        if "#" in lv and (lv != "#" or i != len(levels) - 1):
            raise TopicError(f"'#' must be a whole last level: {flt[:80]!r}")
        if "+" in lv and lv != "+":
            raise TopicError(f"'+' must be a whole level: {flt[:80]!r}")


def has_wildcard(flt: str) -> bool:
    """True if the filter matches more than one name."""
    return "+" in flt or "#" in flt


def matches(flt: str, name: str) -> bool:
    """MQTT filter matching (section 4.7): a filter starting with a wildcard does not
    match names starting with ``$``."""
    if name.startswith("$") and flt[:1] in ("+", "#"):
        return False
    fl = flt.split("/")
    nl = name.split("/")
    for i, f in enumerate(fl):
        if f == "#":
            return True
        if i >= len(nl):
            return False
        if f != "+" and f != nl[i]:
            return False
    return len(fl) == len(nl)


def split_shared(flt: str) -> tuple[str | None, str]:
    """``$share/<group>/<filter>`` -> ``(group, filter)``; a plain filter -> ``(None, it)``."""
    if not flt.startswith(SHARE_PREFIX):
        return None, flt
    group, sep, rest = flt[len(SHARE_PREFIX):].partition("/")
    if not sep or not group or not rest or "+" in group or "#" in group:
        raise TopicError(f"shared subscription {flt[:80]!r}: write $share/<cluster>/<filter>")
    return group, rest


def _short(text: str, limit: int) -> str:
    """``text`` if it fits, else its prefix and a hash (cluster names are <= 100)."""
    if len(text) <= limit:
        return text
    return text[:limit - 17] + "-" + hashlib.sha1(text.encode()).hexdigest()[:16]


def shared_cluster(group: str, flt: str, topic: str) -> str:
    """The consumer cluster a shared subscription joins on ``topic``: the group's own
    name for a filter without wildcards (shared with lockmq-client members of that
    cluster), ``<group>.<topic>`` for each topic a wildcard filter matches (a
    cluster reads one topic)."""
    return group if not has_wildcard(flt) else _short(f"{group}.{topic}", 100)


def private_cluster(owner: str, client_id: str, flt: str, topic: str) -> str:
    """The private cluster of one session's plain subscription ``flt`` on ``topic``
    (two overlapping filters of one session are two clusters: each gets every record)."""
    h = hashlib.sha1(f"{owner}\0{client_id}\0{flt}".encode()).hexdigest()[:16]
    return _short(f"mqtt.{h}.{topic}", 100)


def valid_group(group: str) -> bool:
    """True if a share group can name a cluster."""
    return bool(re.match(r"^[A-Za-z0-9._%-]{1,64}$", group))
