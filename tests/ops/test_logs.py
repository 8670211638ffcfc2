"""One timestamp format in every log format, and no Python repr in a line: a broker
process started in each format, its store recovering (the line that used to embed
``RecoveryReport(...)``)."""

from __future__ import annotations

import json
import re

import pytest

from lockmq.testing.process import BrokerProcess

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
#: what a dataclass or NamedTuple repr looks like: Name(field=...
REPR = re.compile(r"\b[A-Z][A-Za-z]+\([a-z_]+=")


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_every_line_has_an_iso_timestamp_and_no_repr(tmp_path, fmt):
    b = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off", "log_format": fmt}})
    b.kill()     # a crash: the next start recovers by a scan and logs how
    b.start()
    b.stop()
    lines = [ln for ln in b.lines if not ln.startswith("====")]
    assert any("store_log" in ln for ln in lines)
    for line in lines:
        if fmt == "json":
            rec = json.loads(line)
            stamp = rec["ts"]
        else:
            stamp = re.match(r"ts=(\S+) ", line).group(1)
        assert ISO.match(stamp), line
        assert not REPR.search(line), line
    recovered = next(ln for ln in lines if "recovered" in ln)
    assert ("full_scan" in recovered) and ("scanned_records" in recovered), recovered
