"""Building a SparkSession for lockmq jobs (local by default, any --master when submitted)."""

from __future__ import annotations

import os
import sys


def local_conf(cores: int = 2, shuffle_partitions: int | None = None, memory: str = "2g") -> dict[str, str]:
    """Spark settings for a local session bound to 127.0.0.1 with the UI off.

    ``memory`` is the driver's heap, which in local mode is also the executors'
    (Spark's 1 GiB default is too small to sort a few million decoded records).
    """
    return {
        "spark.driver.memory": memory,
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


#: Driver JVM options for a process that runs one short job (``lockmq spark ingest``):
#: the client compiler only. The ingest's JVM schedules tasks and moves no rows, so
#: the optimising compiler never pays back the CPU it spends compiling Spark's start-up
#: (measured on a fresh 1M-record ingest: JVM CPU 20 -> 11 s for the session start,
#: 10 -> 5 s for the job, before the job stopped using SQL).
SHORT_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def get_session(app_name: str = "lockmq", master: str | None = None, conf: dict[str, str] | None = None,
                datasource: bool = True, short_job: bool = False):
    """Get or create a SparkSession with the ``lockmq`` data source registered.

    ``datasource=False`` leaves it unregistered: the ingest job does not read through
    it, and registering builds the session's SQL state and starts a Python worker
    (~5 s of CPU on a fresh session). ``short_job`` starts a new driver JVM with
    :data:`SHORT_JOB_JAVA_OPTIONS` unless ``conf`` sets ``spark.driver.extraJavaOptions``
    (it has no effect under spark-submit, whose driver JVM already runs).

    ``master`` None means: the master spark-submit chose when running under it
    (or the active session's), else ``local[*]`` bound to 127.0.0.1 with the UI off.
    Every session gets the UTC time zone and microsecond Parquet timestamps.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .datasource import register

    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ or SparkSession.getActiveSession() is not None
    settings = session_settings(master, conf, short_job, under_submit)
    if settings.get("spark.master", "").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if datasource:
        register(spark)
    return spark


def stop_if_created(spark, existed: bool) -> None:
    """Stop ``spark`` unless it was already running before the caller asked for it."""
    if not existed:
        spark.stop()


def session_settings(master: str | None, conf: dict[str, str] | None, short_job: bool,
                     under_submit: bool) -> dict[str, str]:
    """The settings :func:`get_session` gives its builder (``conf`` wins over every default)."""
    settings: dict[str, str] = {"spark.sql.session.timeZone": "UTC",
                                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
    if master is None and not under_submit:
        master = "local[*]"
    if master is not None and master.startswith("local"):
        inner = master[6:-1] if master.startswith("local[") else "1"
        cores = os.cpu_count() or 2 if inner == "*" else int(inner.split(",")[0])
        settings.update(local_conf(cores))
        settings["spark.master"] = master
    elif master is not None:
        settings["spark.master"] = master
    if short_job and not under_submit:
        settings["spark.driver.extraJavaOptions"] = SHORT_JOB_JAVA_OPTIONS
    settings.update(conf or {})
    return settings


def session_exists() -> bool:
    """True if this process already has an active SparkSession."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is not None
