"""While a standby follows, its client port answers every CONNECT with an ERROR
(BUSY, "not the primary") and closes: a lock (the firmware moves to the next broker
of its list on any link failure) and ``lockmq.client`` (a BUSY at connect moves it
to the next endpoint) go elsewhere, and an operator reading the error sees why."""

from __future__ import annotations

import asyncio
from typing import Any

from lockmq.protocol import ErrorCode, ErrorReply, Flag, FrameDecoder, Op, encode_frame

#: the retry hint: short, so a lock walking its broker list does not stall here
RETRY_AFTER_MS = 200
#: bytes a peer may send before it is cut off (a CONNECT is far smaller)
MAX_BUFFER = 4096


class NotPrimary(asyncio.Protocol):
    """One client connection to a standby: refused at its first frame."""

    def __init__(self, primary: str, counts: dict[str, int]) -> None:
        self.primary = primary
        self.counts = counts
        self.decoder = FrameDecoder()
        self.transport: Any = None
        self.seen = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        asyncio.get_running_loop().call_later(5.0, transport.close)   # a silent peer

    def data_received(self, data: bytes) -> None:
        self.seen += len(data)
        try:
            self.decoder.feed(data)
            frame = self.decoder.next_frame()
        except Exception:  # noqa: BLE001 -- not our protocol: just close
            self.transport.close()
            return
        if frame is None:
            if self.seen > MAX_BUFFER:
                self.transport.close()
            return
        self.counts["refused"] = self.counts.get("refused", 0) + 1
        body = ErrorReply(int(ErrorCode.BUSY),
                          f"this broker is a standby of {self.primary}, not the primary: "
                          "try the next broker", RETRY_AFTER_MS).encode()
        self.transport.write(encode_frame(Op.ERROR, "", body, frame.opaque, Flag.RESPONSE))
        self.transport.close()


async def open_refuser(host: str, port: int, primary: str,
                       counts: dict[str, int]) -> asyncio.base_events.Server:
    """Listen on the standby's client port and refuse every peer (close it before
    the promoted broker listens there)."""
    return await asyncio.get_running_loop().create_server(
        lambda: NotPrimary(primary, counts), host, port, reuse_address=True)
