"""Building a SparkSession for lockmq jobs (local by default, any --master when submitted)."""

from __future__ import annotations

import os
import sys


def local_conf(cores: int = 2, shuffle_partitions: int | None = None) -> dict[str, str]:
    """Spark settings for a local session bound to 127.0.0.1 with the UI off."""
    return {
        "spark.master": f"local[{cores}]",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or cores),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
    }


def get_session(app_name: str = "lockmq", master: str | None = None, conf: dict[str, str] | None = None):
    """Get or create a SparkSession with the ``lockmq`` data source registered.

    With ``master`` None and no master configured (not under spark-submit), a
    ``local[*]`` session bound to 127.0.0.1 is created.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .datasource import register

    builder = SparkSession.builder.appName(app_name)
    submitted = "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or os.environ.get("SPARK_ENV_LOADED")
    settings: dict[str, str] = {}
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cores = master[6:-1] if master.startswith("local[") else "1"
        settings = local_conf(os.cpu_count() or 2 if cores == "*" else int(cores))
        settings["spark.master"] = master
    elif master is not None:
        settings = {"spark.master": master, "spark.sql.session.timeZone": "UTC",
                    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
    elif not submitted:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings = local_conf(os.cpu_count() or 2)
        settings["spark.master"] = "local[*]"
    else:
        settings = {"spark.sql.session.timeZone": "UTC",
                    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register(spark)
    return spark
