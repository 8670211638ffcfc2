"""lockmq.spark: the broker's commit log in Spark -- data source, ingest job, reports.

Modules (import what you need; only :mod:`datasource`, :mod:`ingest`, :mod:`reports`
and :mod:`session` need PySpark, the decoder needs only numpy and pyarrow):

- :mod:`lockmq.spark.layout`: finding logs, segments and gateway identity on disk
  (file names and the record header come from :mod:`lockmq.store`).
- :mod:`lockmq.spark.decoder`: vectorised, CRC-checked decoding into Arrow batches.
- :mod:`lockmq.spark.plan`: offsets, read limits, packing segments into partitions.
- :mod:`lockmq.spark.datasource`: the ``lockmq`` PySpark data source (batch + streaming).
- :mod:`lockmq.spark.ingest`: the ingest job (dedup, Parquet by date, checkpoint).
- :mod:`lockmq.spark.reports`: the operator reports.
"""
