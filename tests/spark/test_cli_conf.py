"""`lockmq spark ... --conf k=v` (parsed before any Spark starts)."""

from __future__ import annotations

import pytest

from lockmq.cli.spark import parse_conf


def test_conf_pairs():
    assert parse_conf(["spark.executor.memory=2g", "spark.sql.shuffle.partitions = 8", "a.b=x=y"]) == {
        "spark.executor.memory": "2g", "spark.sql.shuffle.partitions": " 8", "a.b": "x=y"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_conf(["spark.executor.memory"])


def test_a_bad_conf_is_refused_before_spark_starts(tmp_path, capsys):
    from lockmq.cli import main

    (tmp_path / "landing").mkdir()
    assert main(["spark", "ingest", str(tmp_path / "landing"), "--warehouse", str(tmp_path / "wh"),
                 "--conf", "no-equals-sign"]) == 2
    assert "--conf wants KEY=VALUE" in capsys.readouterr().err
    assert main(["spark", "report", "--warehouse", str(tmp_path / "wh"), "--conf", "=x"]) == 2
