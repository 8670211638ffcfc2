"""One local[2] SparkSession for the whole test run, plus generated logs.

Spark is slow to start (~7 s) and its first Python data source query starts the
Python workers (~10 s), so every Spark test shares this session.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local[2] session on 127.0.0.1: UI off, 2 shuffle partitions, UTC, lockmq registered."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Python workers connect back to the JVM within this many seconds; a busy
    # shared machine can exceed the default 15 s.
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", "120")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from lockmq.spark.session import get_session

    session = get_session("lockmq-tests", master="local[2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def fleet_records():
    """The generated fleet traffic shared by the tests (deterministic)."""
    from lockmq.spark import generate

    return generate.fleet(n_locks=12, hours=6)


@pytest.fixture(scope="session")
def store_log(tmp_path_factory, fleet_records):
    """A data directory written by the real storage engine (small segments)."""
    from lockmq.spark import generate

    d = str(tmp_path_factory.mktemp("store") / "data")
    generate.write_store(d, fleet_records, segment_bytes=64 * 1024)
    return d
