"""The benchmark's floors: the least a lockmq broker could possibly do per message.

Two minimal asyncio servers, driven by the same load generator as the real broker:

* ``ack``   — parse the same frames (the real :class:`FrameDecoder`, then the
  broker's pure-Python ``publish_fields``), answer the handshake, and acknowledge
  every PUBLISH (``publish_ack_frame``) without storing it;
* ``fsync`` — the same, but every read's records are appended to one file and
  acknowledged only after one shared ``fdatasync`` that covers them (group
  commit): the durable floor a storing broker is measured against.

Run one with ``python bench/floors.py --mode fsync --port 6900 --dir /tmp/x``.
A consumer-side floor is not modelled here: the delivery benchmark is compared
with the publish floors of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from lockmq.rlimits import raise_nofile_limit
from lockmq.protocol import (
    NO_SEQ,
    Challenge,
    ConnectAck,
    Flag,
    FrameDecoder,
    Op,
    ProtocolError,
    encode_frame,
)
from lockmq.protocol.batch import publish_ack_frame, publish_fields

_RESP = Flag.RESPONSE


class GroupCommit:
    """Appends batches to one file; one fdatasync acknowledges everything before it."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.offset = 0
        self._waiting: list[tuple["FloorConnection", list[bytes]]] = []
        self._data: list[bytes] = []
        self._running = False

    def submit(self, conn: "FloorConnection", records: list[bytes], acks: list[bytes]) -> None:
        """Queue records and the acks to send once they are durable."""
        self._data.extend(records)
        self._waiting.append((conn, acks))
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._data:
                data, self._data = self._data, []
                waiting, self._waiting = self._waiting, []
                blob = b"".join(data)
                await loop.run_in_executor(None, self._write_sync, blob)
                for conn, acks in waiting:
                    conn.send(b"".join(acks))
        finally:
            self._running = False

    def _write_sync(self, blob: bytes) -> None:
        os.write(self.fd, blob)
        os.fdatasync(self.fd)
        self.offset += len(blob)


class FloorConnection(asyncio.Protocol):
    """Handshake, then PUBLISH -> PUBLISH_ACK (after the group commit in fsync mode)."""

    def __init__(self, commit: GroupCommit | None) -> None:
        self.decoder = FrameDecoder(1024 * 1024)
        self.commit = commit
        self.transport: asyncio.Transport | None = None
        self.offset = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        dec = self.decoder
        out: list[bytes] = []
        records: list[bytes] = []
        acks: list[bytes] = []
        try:
            dec.feed(data)
            while True:
                f = dec.next_frame()
                if f is None:
                    break
                op = f.opcode
                if op == Op.PUBLISH:
                    # parse it, as a broker must: the broker's own pure-Python hot path
                    # (fields without a Publish object; the ack in one pack)
                    publish_fields(f.body)
                    self.offset += 1
                    if f.flags & Flag.ONEWAY:
                        if self.commit is not None:
                            records.append(f.body)
                        continue
                    ack = publish_ack_frame(0, self.offset, f.opaque)
                    if self.commit is not None:
                        records.append(f.sn.encode() + f.body)
                        acks.append(ack)
                    else:
                        out.append(ack)
                elif op == Op.CONNECT:
                    out.append(encode_frame(Op.CHALLENGE, "", Challenge(
                        os.urandom(16), int(time.time() * 1000)).encode(), f.opaque, _RESP))
                elif op == Op.AUTH:
                    out.append(encode_frame(Op.CONNECT_ACK, "", ConnectAck(
                        30, 1024 * 1024, int(time.time() * 1000), NO_SEQ, 1).encode(),
                        f.opaque, _RESP))
                elif op == Op.HEARTBEAT:
                    if not f.flags & Flag.ONEWAY:
                        out.append(encode_frame(Op.HEARTBEAT, "", b"", f.opaque, _RESP))
                elif op == Op.DISCONNECT:
                    if self.transport is not None:
                        self.transport.close()
        except ProtocolError:
            if self.transport is not None:
                self.transport.abort()
            return
        if out:
            self.send(b"".join(out))
        if records and self.commit is not None:
            self.commit.submit(self, records, acks)


async def serve(host: str, port: int, mode: str, data_dir: str) -> None:
    """Serve until cancelled."""
    commit = GroupCommit(os.path.join(data_dir, "floor.log")) if mode == "fsync" else None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FloorConnection(commit), host, port,
                                      backlog=8192, reuse_address=True)
    port = server.sockets[0].getsockname()[1]   # (--port 0: the one the kernel picked)
    print(f"floor {mode} listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mode", choices=("ack", "fsync"), default="ack")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=6900)
    ap.add_argument("--dir", default=".")
    args = ap.parse_args()
    raise_nofile_limit()
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port, args.mode, args.dir))
    except ImportError:
        asyncio.run(serve(args.host, args.port, args.mode, args.dir))


if __name__ == "__main__":
    main()
