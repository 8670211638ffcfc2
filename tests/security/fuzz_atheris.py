"""Coverage-guided fuzzing of the frame decoder, the body decoders and the Guard.

Not part of the default suite (pytest does not collect this file). Run on demand::

    pip install 'lockmq[fuzz]'            # atheris
    python tests/security/fuzz_atheris.py -atheris_runs=200000
    python tests/security/fuzz_atheris.py -max_total_time=600 corpus_dir/

Any exception other than the expected typed errors (ProtocolError from the codec,
SecurityError from the Guard) is a finding: atheris prints the input and stops.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from lockmq.protocol import BODY_TYPES, FrameDecoder, ProtocolError, encode_frame
    from lockmq.security import Guard, SecurityConfig, SecurityError
    from lockmq.testing.fuzz import decode_stream

_GUARD = Guard(SecurityConfig(data_dir=tempfile.mkdtemp(prefix="lockmq-fuzz-")))
_GUARD.registry.add("FUZZ-1")
_OPCODES = sorted(BODY_TYPES)


def one_input(data: bytes) -> None:
    """Feed ``data`` to a decoder in chunks; decode every body; authenticate with it."""
    fdp = atheris.FuzzedDataProvider(data)
    chunk = fdp.ConsumeIntInRange(1, 64)
    if fdp.ConsumeBool():   # raw bytes: the framing layer
        stream = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096))
    else:                   # frames with a good checksum: the body decoders and the Guard
        stream = b""
        for _ in range(fdp.ConsumeIntInRange(1, 4)):
            op = _OPCODES[fdp.ConsumeIntInRange(0, len(_OPCODES) - 1)]
            sn = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12)).decode("ascii", "ignore")
            try:
                stream += encode_frame(op, sn, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 512)),
                                       fdp.ConsumeIntInRange(0, 2**32 - 1))
            except ProtocolError:
                pass
    dec = FrameDecoder(4096)
    for f, body in decode_stream(dec, stream, chunk):
        if hasattr(body, "proof"):
            try:
                _GUARD.authenticate(f.sn, body, _GUARD.challenge(), "10.0.0.1")
            except SecurityError:
                pass
    if dec.buffered() > 4096 + chunk:
        raise AssertionError(f"decoder buffers {dec.buffered()} bytes")


def main() -> None:
    """Entry point: atheris/libFuzzer arguments pass through."""
    os.environ.setdefault("LOCKMQ_FUZZ", "1")
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
