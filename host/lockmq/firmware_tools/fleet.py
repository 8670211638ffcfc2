"""Fleet updates: release a bundle to a broker, roll it out to a share of the locks.

``release`` uploads a bundle (:mod:`.bundle`) with the admin op ``fw.put`` in
pieces (resumed from what the broker already holds). ``rollout`` sends the signed
FW_UPDATE command to the chosen locks in waves and watches what they report back at
CONNECT (the broker's ``fw.status``: the running version and the last update's state):

* ``updated``: the lock runs the new version and has sent a heartbeat with it (the
  moment the lock itself confirms the update and drops the old app);
* ``failed:<why>``: the lock refused the bundle (``digest``, ``unknown_bundle``...) or
  booted the old app again (``deadline``, ``boot_loop``, ``crash_<Exception>``);
* ``refused:<why>``: the command itself was refused or not answered in time;
* ``timeout``: none of these within ``deadline_s``.

When the failures reach ``halt_after`` (a count; :func:`halt_threshold` turns an
operator's ``N`` or ``P%`` into one) the rollout stops: locks not yet sent the
command stay ``not_started``. Locks already updating carry on (an update on its way is
safe to finish or to fail: the lock keeps a running app either way).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lockmq.protocol import CommandKind

from .bundle import BundleInfo

#: Bytes per ``fw.put`` (base64 makes it a third larger; well under any frame limit).
PUT_PIECE = 12 * 1024


async def release(admin: Any, data: bytes, info: BundleInfo) -> dict[str, Any]:
    """Upload ``data`` (a bundle) with ``fw.put``; returns the last answer."""
    have = 0
    while True:
        piece = data[have:have + PUT_PIECE]
        resp = await admin.request("fw.put", sha256=info.sha256, size=info.size,
                                   version=info.version, offset=have,
                                   data=base64.b64encode(piece).decode())
        if resp.get("released"):
            return resp
        if resp["have"] == have and not piece:
            raise RuntimeError("the broker took no more bytes")
        have = resp["have"]


def pick(sns: list[str], percent: float) -> list[str]:
    """A stable share of ``sns``: the same locks for the same percentage (by a hash of
    the SN), and a larger share includes a smaller one."""
    ranked = sorted(sns, key=lambda sn: hashlib.sha256(sn.encode()).digest())
    n = max(1, round(len(ranked) * percent / 100)) if ranked and percent > 0 else 0
    return sorted(ranked[:n])


def halt_threshold(spec: str, total: int) -> int:
    """The failures that halt a rollout of ``total`` locks: ``"N"`` is N locks, ``"P%"``
    that share of the rollout rounded up (at least 1: a canary of 20 locks at 5 % halts
    at its first failure). ValueError names what is wrong with ``spec``."""
    text = spec.strip()
    try:
        number = float(text[:-1]) if text.endswith("%") else int(text)
    except ValueError:
        raise ValueError(f"{spec!r} is neither a count (2) nor a share (5%)") from None
    if text.endswith("%"):
        if not 0 < number <= 100:
            raise ValueError(f"a share must be in (0, 100] %, not {spec!r}")
        return max(1, -(-round(total * number * 100) // 10000))
    if number < 1:
        raise ValueError(f"a count must be 1 or more, not {spec!r}")
    return int(number)


@dataclass
class Rollout:
    """The state of a rollout: per lock, and whether it halted."""

    info: BundleInfo
    status: dict[str, str] = field(default_factory=dict)
    halted: bool = False

    @property
    def failures(self) -> int:
        return sum(1 for s in self.status.values() if s.startswith(("failed", "refused", "timeout")))


def outcome(row: dict[str, Any] | None) -> str | None:
    """A rollout's verdict on a lock from its ``fw.status`` row (the broker's
    ``update_state``: one rule for the rollout, ``lockmq firmware status`` and
    ``/metrics``), or None (not decided yet)."""
    if row is None:
        return None
    if row["state"] in ("updated", "running"):
        return "updated"
    if row["state"] == "failed":
        return "failed:" + (row.get("why") or "unknown")
    return None


async def rollout(producer: Any, admin: Any, info: BundleInfo, sns: list[str], *,
                  halt_after: int = 1, wave: int = 10, deadline_s: float = 600.0,
                  expires_s: float = 300.0, poll_s: float = 1.0,
                  say: Callable[[str], None] = print) -> Rollout:
    """Update ``sns`` in waves of ``wave`` (module docstring)."""
    r = Rollout(info)
    for sn in sns:
        r.status[sn] = "not_started"
    args = json.dumps(info.command_args()).encode()
    for i in range(0, len(sns), wave):
        if r.failures >= halt_after:
            r.halted = True
            break
        batch = sns[i:i + wave]

        async def send(sn: str) -> None:
            try:
                out = await producer.command(sn, CommandKind.FW_UPDATE, args, expires_in_s=expires_s)
                r.status[sn] = "sent"
                say(f"{sn}: {out.detail}")
            except Exception as e:  # noqa: BLE001 -- CommandError, a lost connection
                r.status[sn] = "refused:" + (getattr(e, "reason", "") or type(e).__name__)
                say(f"{sn}: command refused: {e}")

        await asyncio.gather(*(send(sn) for sn in batch))
        waiting = {sn for sn in batch if r.status[sn] == "sent"}
        end = time.monotonic() + deadline_s
        while waiting and time.monotonic() < end:
            rows = (await admin.request("fw.status", version=info.version)).get("locks", [])
            by_sn = {r["sn"]: r for r in rows if r["version"] == info.version}
            for sn in sorted(waiting):
                st = outcome(by_sn.get(sn))
                if st is not None:
                    r.status[sn] = st
                    waiting.discard(sn)
                    say(f"{sn}: {st}")
            if waiting:
                await asyncio.sleep(poll_s)
        for sn in waiting:
            r.status[sn] = "timeout"
            say(f"{sn}: timeout")
    if r.failures >= halt_after and any(s == "not_started" for s in r.status.values()):
        r.halted = True
    return r
