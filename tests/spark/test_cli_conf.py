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


def test_short_job_driver_options_unless_given_or_under_submit():
    from lockmq.spark.session import SHORT_JOB_JAVA_OPTIONS, session_settings

    key = "spark.driver.extraJavaOptions"
    assert session_settings("local[2]", None, True, False)[key] == SHORT_JOB_JAVA_OPTIONS
    assert session_settings("local[2]", {key: "-Xss4m"}, True, False)[key] == "-Xss4m"
    assert key not in session_settings(None, None, True, True)      # spark-submit's JVM already runs
    assert key not in session_settings("local[2]", None, False, False)
