"""Hostile bytes through the codec the way a connection reads them."""

from __future__ import annotations

from typing import Any, Iterator

from lockmq.protocol import Frame, FrameDecoder, ProtocolError, decode_body


def decode_stream(dec: FrameDecoder, stream: bytes, chunk: int) -> Iterator[tuple[Frame, Any]]:
    """Feed ``stream`` to ``dec`` ``chunk`` bytes at a time, as reads arrive; yield each
    frame with its decoded body (``None`` where the body is refused).

    A frame the decoder refuses without losing sync is skipped; a fatal error ends
    the stream, as it closes a connection. Only :class:`ProtocolError` is expected:
    anything else escapes to the fuzzer (the property and the atheris harness).
    """
    try:
        for i in range(0, len(stream), chunk):
            dec.feed(stream[i:i + chunk])
            while True:
                try:
                    f = dec.next_frame()
                except ProtocolError as exc:
                    if exc.fatal:
                        raise
                    continue
                if f is None:
                    break
                try:
                    body = decode_body(f.opcode, f.body)
                except ProtocolError:
                    body = None
                yield f, body
    except ProtocolError:
        return
