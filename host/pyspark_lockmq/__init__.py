"""Spark's automatic registration of the ``lockmq`` data source.

PySpark (>= 4.0) looks, on a session's first data source lookup, for top-level
modules named ``pyspark_*`` on the Python path that define ``DefaultSource``, and
registers each under its ``name()``. With lockmq installed where the session's
Python runs, ``spark.read.format("lockmq")`` therefore works in any session --
a notebook, ``pyspark``, ``spark-submit`` -- without calling
:func:`lockmq.spark.datasource.register`.
"""

from lockmq.spark.datasource import LockmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
