"""MicroPython's raw REPL, spoken over a :class:`~lockmq.hil.dut.Dut`.

The same protocol mpremote and pyboard.py use: Ctrl-C stops the running app,
Ctrl-A enters the raw REPL (``raw REPL; CTRL-B to exit`` then ``>``), the code
followed by Ctrl-D is compiled and run, the board answers ``OK``, the output,
Ctrl-D, the error output, Ctrl-D and a fresh ``>``. Ctrl-B returns to the
friendly REPL. Works on a real board, the unix port on a pty, and QEMU.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from .errors import DutExecError, DutTimeout

if TYPE_CHECKING:  # pragma: no cover
    from .dut import Dut

RAW_PROMPT = re.compile(rb"raw REPL; CTRL-B to exit\r*\n>")
FRIENDLY_OR_RAW = re.compile(rb">>> |raw REPL; CTRL-B to exit\r?\n>")
EXEC_REPLY = re.compile(rb"OK(.*?)\x04(.*?)\x04>", re.S)

#: Bytes per write of code; real UARTs drop input that arrives too fast.
CHUNK = 256
#: Bytes of file content per raw-REPL exec in :func:`put_file`.
FILE_CHUNK = 1024


def enter_raw(dut: "Dut", attempts: int = 5, timeout: float = 3.0) -> None:
    """Interrupt whatever runs and enter the raw REPL (retrying a few times)."""
    last: DutTimeout | None = None
    for _ in range(attempts):
        dut.write(b"\r\x03\x03")
        try:
            dut.expect(FRIENDLY_OR_RAW, timeout=timeout)
        except DutTimeout as exc:
            last = exc
        dut.write(b"\r\x01")
        try:
            dut.expect(RAW_PROMPT, timeout=timeout)
            return
        except DutTimeout as exc:
            last = exc
    assert last is not None
    raise DutTimeout("could not enter the raw REPL", dut.name, dut.log_tail())


def exit_raw(dut: "Dut") -> None:
    """Leave the raw REPL for the friendly one (Ctrl-B)."""
    dut.write(b"\r\x02")


def exec_raw(dut: "Dut", code: str | bytes, timeout: float = 10.0) -> str:
    """Run ``code`` at the raw-REPL prompt; return its output, raise on an exception."""
    data = code.encode() if isinstance(code, str) else code
    delay = dut.board_write_delay
    for i in range(0, len(data), CHUNK):
        dut.write(data[i : i + CHUNK])
        if delay:
            time.sleep(delay)
    dut.write(b"\x04")
    m = dut.expect(EXEC_REPLY, timeout=timeout)
    out = m.group(1).decode("utf-8", "replace").replace("\r\n", "\n")
    err = m.group(2).decode("utf-8", "replace").replace("\r\n", "\n")
    if err:
        raise DutExecError("code raised on the board", err, dut.name, dut.log_tail())
    return out


def put_file(dut: "Dut", data: bytes, remote: str, timeout: float = 10.0) -> None:
    """Write ``data`` to the board's file ``remote`` (parent folders created)."""
    parts = [p for p in remote.split("/")[:-1] if p]
    prefix = "/" if remote.startswith("/") else ""
    exec_raw(
        dut,
        "import os\n"
        f"for _d in {[prefix + '/'.join(parts[: i + 1]) for i in range(len(parts))]!r}:\n"
        " try:\n  os.mkdir(_d)\n except OSError:\n  pass\n"
        f"_f=open({remote!r},'wb')\n_w=_f.write\n",
        timeout,
    )
    for i in range(0, len(data), FILE_CHUNK):
        exec_raw(dut, f"_w({data[i : i + FILE_CHUNK]!r})", timeout)
    exec_raw(dut, "_f.close()\ndel _f,_w", timeout)


def get_file(dut: "Dut", remote: str, timeout: float = 10.0) -> bytes:
    """Read the board's file ``remote``."""
    import binascii

    out = exec_raw(
        dut,
        "import binascii\n"
        f"with open({remote!r},'rb') as _f:\n"
        " while True:\n  _b=_f.read(512)\n  if not _b:\n   break\n"
        "  print(binascii.hexlify(_b).decode())\n",
        timeout,
    )
    return binascii.unhexlify("".join(out.split()))
