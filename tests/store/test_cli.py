"""`lockmq store check` and `lockmq store dump` on good and damaged directories."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from lockmq.cli import store as store_cli
from lockmq.store import Store

from .helpers import config, rec, run


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lockmq")
    store_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def filled(data_dir):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=2048))
        for i in range(0, 90, 3):
            await s.append([rec("locks", f"SN{k % 3}", k) for k in range(i, i + 3)])
        await s.append([rec("$dlq.c1", "SN9", 1, headers={"reason": "max retries"})])
        await s.save_positions("c1", {"locks": 4})
        await s.close()
    run(main())
    return str(data_dir)


def test_check_ok(filled, capsys):
    assert cli(["store", "check", filled]) == 0
    out = capsys.readouterr().out
    assert "91 records" in out and "OK" in out and "topic locks: 90 records" in out


def test_check_finds_a_flipped_byte(filled, capsys):
    seg = os.path.join(filled, "message.log", "00000000000000000000.log")
    with open(seg, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    assert cli(["store", "check", filled]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "checksum mismatch" in out


def test_check_finds_a_torn_tail_and_a_bad_index(filled, capsys):
    segs = sorted(os.listdir(os.path.join(filled, "message.log")))
    last = [s for s in segs if s.endswith(".log")][-1]
    with open(os.path.join(filled, "message.log", last), "ab") as f:
        f.write(b"\x50\x00\x00\x00torn")
    with open(os.path.join(filled, "offset-locks.log"), "r+b") as f:
        f.seek(16 + 16 * 3)
        f.write((12345).to_bytes(8, "little"))
    assert cli(["store", "check", filled]) == 1
    out = capsys.readouterr().out
    assert "tail of the last segment" in out and "index offset-locks.log: entry 3" in out


def test_check_missing_dir(tmp_path, capsys):
    assert cli(["store", "check", str(tmp_path / "nope")]) == 2


def test_dump_filters(filled, capsys):
    assert cli(["store", "dump", filled, "--sn", "SN9"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "id=SN9:1" in out[0] and '"reason": "max retries"' in out[0]
    assert cli(["store", "dump", filled, "--topic", "locks", "--json", "--limit", "5"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in rows] == [0, 1, 2, 3, 4] and rows[0]["topic"] == "locks"
    assert cli(["store", "dump", filled, "--until", "2000-01-01T00:00:00Z"]) == 0
    assert capsys.readouterr().out == ""
    assert cli(["store", "dump", filled, "--since", "2000-01-01", "--sn", "SN1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 30


def test_dump_skips_damage_and_says_so(filled, capsys):
    """(issue 34: dump used to stop at the first damaged record; the intact ones after
    it are printed now)"""
    assert cli(["store", "dump", filled]) == 0
    before = capsys.readouterr().out.splitlines()
    seg = os.path.join(filled, "message.log", "00000000000000000000.log")
    with open(seg, "r+b") as f:
        f.seek(300)
        f.write(b"\xff\xff")
    assert cli(["store", "dump", filled]) == 1
    out = capsys.readouterr()
    assert "DAMAGED: bytes [" in out.err
    after = out.out.splitlines()
    assert after[-1] == before[-1] and 0 < len(before) - len(after) <= 2


def test_bad_time_is_a_usage_error(filled):
    with pytest.raises(SystemExit):
        cli(["store", "dump", filled, "--since", "yesterday"])


def test_registered_in_the_lockmq_command(filled, capsys):
    from lockmq.cli import main
    assert main(["store", "check", filled]) == 0
    assert "OK" in capsys.readouterr().out
