"""Admin requests: ``ADMIN_REQUEST {"op", "args"}`` -> ``ADMIN_RESPONSE`` JSON.

The operations themselves (topics, clusters, dlq.list, dlq.replay, devices ...) are
the broker's; docs/operators.md lists them. This module only carries them.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from lockmq.protocol import Op, Role, decode_json, encode_json

from ._base import SessionClient, default_client_id
from .errors import AdminError
from .session import Credentials, Endpoint, error_from_body


class AsyncAdmin(SessionClient):
    """Send admin operations to a broker (asyncio)."""

    def __init__(
        self,
        endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800",
        *,
        token: str | None = None,
        credentials: Credentials | None = None,
        client_id: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(endpoint, client_id=client_id or default_client_id("admin"),
                         role=Role.ADMIN, credentials=credentials, token=token, reconnect=False)
        self.timeout_s = timeout_s

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        """Run ``op`` with ``args``; return the response object.

        Raises :class:`AdminError` when the broker refuses or the op fails.
        """
        conn = self._require_conn()
        fut = conn.request(Op.ADMIN_REQUEST, encode_json({"op": op, "args": args}))
        frame = await asyncio.wait_for(fut, self.timeout_s)
        if frame.opcode == Op.ERROR:
            raise AdminError(str(error_from_body(frame.body)))
        resp = decode_json(frame.body)
        if resp.get("ok") is False or "error" in resp and resp.get("ok") is not True:
            error = str(resp.get("error") or resp)
            raise AdminError(f"{error}: {resp['message']}" if resp.get("message") else error,
                             error)
        return resp

    async def scheduled_result(self, schedule_id: int, timeout_s: float = 60.0,
                               poll_s: float = 0.2) -> dict[str, Any]:
        """The result of scheduled command ``schedule_id`` (from
        ``Producer.schedule_command``), once the lock answered: ``{"id", "target",
        "status", "detail", "at_ms"}`` (status 0 = ok, a lock's CommandStatus, or a
        refusal as the negated error code). The broker does not push it: this polls
        the admin op ``scheduled.result`` every ``poll_s`` -- wrap it in
        ``asyncio.ensure_future`` for a future. Raises :class:`AdminError`
        (``error`` "UNKNOWN") when the broker has no such item or result any more,
        ``TimeoutError`` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            resp = await self.request("scheduled.result", id=schedule_id)
            state = resp.get("state")
            if state == "done":
                return resp["result"]
            if state not in ("waiting", "sent"):
                raise AdminError(f"scheduled item {schedule_id}: {resp.get('hint') or state}",
                                 "UNKNOWN")
            if loop.time() >= deadline:
                raise TimeoutError(f"scheduled item {schedule_id} still {state} after "
                                   f"{timeout_s} s")
            await asyncio.sleep(poll_s)

    async def __aenter__(self) -> "AsyncAdmin":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Admin:
    """Blocking admin client: ``Admin(addr).request("topics")``."""

    def __init__(self, endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800",
                 **kwargs: Any) -> None:
        from .sync import _LoopThread

        self._loop = _LoopThread("lockmq-admin")
        self._admin: AsyncAdmin = self._loop.run(_make(endpoint, kwargs))
        self._lock = threading.Lock()

    def request(self, op: str, **args: Any) -> dict[str, Any]:
        """Run an admin op and return its response (see :meth:`AsyncAdmin.request`)."""
        return self._loop.run(self._admin.request(op, **args))

    def scheduled_result(self, schedule_id: int, timeout_s: float = 60.0,
                         poll_s: float = 0.2) -> dict[str, Any]:
        """Wait for a scheduled command's result (see :meth:`AsyncAdmin.scheduled_result`)."""
        return self._loop.run(self._admin.scheduled_result(schedule_id, timeout_s, poll_s))

    def close(self) -> None:
        """Disconnect and stop the background loop."""
        try:
            self._loop.run(self._admin.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(endpoint: Endpoint | str | list[Endpoint], kwargs: dict[str, Any]) -> AsyncAdmin:
    admin = AsyncAdmin(endpoint, **kwargs)
    await admin.connect()
    return admin
