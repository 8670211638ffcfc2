"""Operator reports over an ingested warehouse (see :mod:`lockmq.spark.ingest`).

Each report is a function ``(spark, warehouse, settings) -> DataFrame`` and is
written to ``<out>/<name>/`` as Parquet by :func:`run_reports`, which also prints
a short summary. Definitions (docs/spark.md has the table schemas):

- ``daily_activity``: per UTC date (broker time) and lock: unlocks (``unlock``
  with result ``ok``), failed attempts (``failed_attempt`` events and unlocks with
  another result), alarms (door left open, tamper, low battery), all events.
- ``failed_bursts``: per lock, failed attempts ordered by the lock's event time;
  attempt *i* triggers when attempts *i-N+1 .. i* lie within the window
  (``t_i - t_{i-N+1} <= window``). Every attempt inside a triggering run of N is
  covered; consecutive covered attempts form one burst.
- ``offline_periods``: from the broker's ``$devices`` events (``offline`` and
  ``evicted`` start a period, the next sign of life ends it) and from silences:
  a lock shows life with its own records, its ``$heartbeats`` and its ``online``
  events; more than ``offline_after`` between two signs of life is a period too.
  See :func:`offline_periods`.
- ``clock_delay``: per lock, broker time minus lock time in ms: count, min, p50,
  p95, p99 (exact, linear interpolation), max; ``clock_off`` when ``|p50|`` exceeds
  the tolerance (the lock's clock is wrong, not the network slow).
- ``seq_gaps`` (one row per hole in a lock's sequence numbers: records lost) and
  ``seq_summary`` (per lock: first/last seq, received, missing, skipped,
  duplicates seen by ingest). A lock reserves its sequence numbers in blocks
  (firmware ``seq_block``) and after a power cut resumes at the end of the block it
  had reserved: a jump of at most ``seq_block`` across a reconnect (a ``$devices``
  ``online`` event between the two records) is that skip, counted as ``skipped``,
  not as missing. A lock is an SN that sent at least one LockEvent: system SNs
  (``$...``) and service producers (``lockmq produce``, billing services ...,
  whose payloads are no LockEvents) are left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .events import ALARM_TYPES


@dataclass
class ReportSettings:
    """Thresholds of the reports."""

    burst_count: int = 5
    burst_window_s: float = 120.0
    offline_after_s: float = 120.0
    clock_tolerance_s: float = 30.0
    #: the locks' sequence block (firmware/lockapp/config.py ``seq_block``; a test
    #: holds the two equal); 0: every jump is a gap
    seq_block: int = 64

    def validate(self) -> None:
        """Raise ``ValueError`` for a setting out of range."""
        if self.burst_count < 2:
            raise ValueError("burst_count must be at least 2")
        if self.seq_block < 0:
            raise ValueError("seq_block must be >= 0")
        for name in ("burst_window_s", "offline_after_s", "clock_tolerance_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def _events(spark, warehouse: str):
    path = os.path.join(warehouse, "events")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"lockmq: no events table in {warehouse} (run `lockmq spark ingest` first)")
    return spark.read.parquet(path)


def daily_activity(spark, warehouse: str, s: ReportSettings):
    """Per-lock daily unlocks, failed attempts and alarms."""
    from pyspark.sql import functions as F

    ev = _events(spark, warehouse).filter(F.col("event_type").isNotNull())
    et, res = F.col("event_type"), F.col("result")
    failed = (et == "failed_attempt") | ((et == "unlock") & (res != "ok"))
    return (ev.groupBy("date", "sn")
            .agg(F.sum(((et == "unlock") & (res == "ok")).cast("long")).alias("unlocks"),
                 F.sum(failed.cast("long")).alias("failed_attempts"),
                 F.sum(et.isin(*ALARM_TYPES).cast("long")).alias("alarms"),
                 F.count(F.lit(1)).alias("events"))
            .orderBy("date", "sn"))


def failed_bursts(spark, warehouse: str, s: ReportSettings):
    """Bursts of >= burst_count failed attempts within burst_window_s, per lock."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ev = _events(spark, warehouse)
    failed = (F.col("event_type") == "failed_attempt") | ((F.col("event_type") == "unlock") & (F.col("result") != "ok"))
    att = (ev.filter(failed)
           .select("sn", "gateway_id", "seq",
                   F.coalesce("event_ts", "lock_ts", "broker_ts").alias("t")))
    n = s.burst_count
    w = Window.partitionBy("sn").orderBy("t", "seq")
    window_us = int(s.burst_window_s * 1_000_000)
    att = att.withColumn("_us", F.unix_micros("t"))
    att = att.withColumn("_trig", (F.col("_us") - F.lag("_us", n - 1).over(w) <= window_us).cast("int"))
    att = att.withColumn("_cov", F.coalesce(F.max("_trig").over(w.rowsBetween(0, n - 1)), F.lit(0)))
    att = att.withColumn("_start", ((F.col("_cov") == 1) &
                                    (F.coalesce(F.lag("_cov", 1).over(w), F.lit(0)) == 0)).cast("int"))
    att = att.withColumn("_burst", F.sum("_start").over(w.rowsBetween(Window.unboundedPreceding, 0)))
    return (att.filter(F.col("_cov") == 1)
            .groupBy("sn", "_burst")
            .agg(F.min("t").alias("burst_start"), F.max("t").alias("burst_end"),
                 F.count(F.lit(1)).alias("attempts"), F.first("gateway_id").alias("gateway_id"))
            .withColumn("seconds", (F.unix_micros("burst_end") - F.unix_micros("burst_start")) / 1e6)
            .withColumn("date", F.to_date("burst_start"))
            .drop("_burst")
            .select("date", "sn", "gateway_id", "burst_start", "burst_end", "attempts", "seconds")
            .orderBy("sn", "burst_start"))


def timeline(spark, warehouse: str):
    """Per lock, every sign of life and every going-down, from all records.

    Columns ``sn, t, kind, reason, gateway_id, offset``: ``kind`` is ``alive`` for
    the lock's own records, its ``$heartbeats`` and its ``$devices`` ``online``
    events, ``down`` for ``$devices`` ``offline``/``evicted`` events (``reason``
    from the event; ``replaced`` is not a going-down: the lock reconnected).
    """
    from pyspark.sql import functions as F

    ev = _events(spark, warehouse)
    text = F.col("payload").cast("string")
    own = (ev.filter(~F.col("sn").startswith("$"))
           .select("sn", F.col("broker_ts").alias("t"), F.lit("alive").alias("kind"),
                   F.lit(None).cast("string").alias("reason"), "gateway_id", "offset"))
    hb = (ev.filter(F.col("topic") == "$heartbeats")
          .select(F.get_json_object(text, "$.sn").alias("sn"), F.col("broker_ts").alias("t"),
                  F.lit("alive").alias("kind"), F.lit(None).cast("string").alias("reason"),
                  "gateway_id", "offset"))
    event = F.get_json_object(text, "$.event")
    reason = F.get_json_object(text, "$.reason")
    dev = (ev.filter(F.col("topic") == "$devices")
           .select(F.get_json_object(text, "$.sn").alias("sn"), F.col("broker_ts").alias("t"),
                   F.when(event == "online", "alive")
                   .when(event.isin("offline", "evicted") & (F.coalesce(reason, F.lit("")) != "replaced"), "down")
                   .alias("kind"),
                   F.coalesce(reason, event).alias("reason"), "gateway_id", "offset")
           .filter(F.col("kind").isNotNull()))
    return own.unionByName(hb).unionByName(dev).filter(F.col("sn").isNotNull() & F.col("t").isNotNull())


def offline_periods(spark, warehouse: str, s: ReportSettings):
    """Offline periods per lock: from a ``$devices`` going-down, or from a silence.

    In time order (ties: gateway, offset) a period starts at a ``down`` that
    follows a sign of life, and at a sign of life followed by more than
    ``offline_after`` of silence and then another sign of life; it ends at the next
    sign of life (``back_online`` null: still offline at the end of the data).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("sn").orderBy("t", "gateway_id", "offset")
    # "next sign of life" as a running min over the reversed order: a frame that
    # ends at unboundedFollowing would be recomputed for every row (quadratic)
    back_w = (Window.partitionBy("sn")
              .orderBy(F.col("t").desc(), F.col("gateway_id").desc(), F.col("offset").desc())
              .rowsBetween(Window.unboundedPreceding, -1))
    tl = timeline(spark, warehouse)
    tl = (tl.withColumn("_prev", F.lag("kind").over(w))
          .withColumn("_next_kind", F.lead("kind").over(w))
          .withColumn("_next_t", F.lead("t").over(w))
          .withColumn("_next_alive", F.min(F.when(F.col("kind") == "alive", F.col("t"))).over(back_w)))
    gap = F.unix_micros("_next_t") - F.unix_micros("t")
    down = (F.col("kind") == "down") & F.coalesce(F.col("_prev") == "alive", F.lit(True))
    silent = ((F.col("kind") == "alive") & (F.col("_next_kind") == "alive")
              & (gap > int(s.offline_after_s * 1_000_000)))
    back = F.when(down, F.col("_next_alive")).otherwise(F.col("_next_t"))
    return (tl.filter(down | silent)
            .select(F.to_date("t").alias("date"), "sn", F.col("t").alias("offline_from"),
                    back.alias("back_online"),
                    ((F.unix_micros(back) - F.unix_micros("t")) / 1e6).alias("seconds"),
                    F.when(down, F.col("reason")).otherwise(F.lit("silent")).alias("cause"),
                    "gateway_id")
            .orderBy("sn", "offline_from"))


def clock_delay(spark, warehouse: str, s: ReportSettings):
    """Lock-to-broker delay percentiles per lock, flagging locks whose clock is off."""
    from pyspark.sql import functions as F

    ev = _events(spark, warehouse).filter(~F.col("sn").startswith("$") & F.col("lock_ts").isNotNull())
    d = ev.select("sn", ((F.unix_micros("broker_ts") - F.unix_micros("lock_ts")) / 1000.0).alias("delay_ms"))
    out = (d.groupBy("sn")
           .agg(F.count(F.lit(1)).alias("records"), F.min("delay_ms").alias("min_ms"),
                F.percentile("delay_ms", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("_p"),
                F.max("delay_ms").alias("max_ms")))
    return (out.select("sn", "records", "min_ms", F.col("_p")[0].alias("p50_ms"),
                       F.col("_p")[1].alias("p95_ms"), F.col("_p")[2].alias("p99_ms"), "max_ms")
            .withColumn("clock_off", F.abs("p50_ms") > s.clock_tolerance_s * 1000)
            .orderBy("sn"))


def _lock_records(spark, warehouse: str):
    """The records of locks: SNs that sent at least one LockEvent. A service
    producer's sequence numbers say nothing about a lock's lost records."""
    from pyspark.sql import functions as F

    ev = _events(spark, warehouse).filter(~F.col("sn").startswith("$"))
    locks = ev.filter(F.col("event_type").isNotNull()).select("sn").distinct()
    return ev.join(locks, "sn", "left_semi")


def _seq_jumps(spark, warehouse: str, s: ReportSettings):
    """Every jump of a lock's sequence numbers, ``skipped`` when it is the block a
    power cut left unused: at most ``seq_block`` numbers, across a reconnect."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ev = _lock_records(spark, warehouse).groupBy("sn", "seq").agg(F.min("broker_ts").alias("t"))
    w = Window.partitionBy("sn").orderBy("seq")
    jumps = (ev.withColumn("after_seq", F.lag("seq").over(w)).withColumn("_after_t", F.lag("t").over(w))
             .filter(F.col("seq") - F.col("after_seq") > 1)
             .select("sn", "after_seq", F.col("seq").alias("next_seq"),
                     (F.col("seq") - F.col("after_seq") - 1).alias("missing"), "_after_t", F.col("t").alias("_next_t")))
    text = F.col("payload").cast("string")
    online = (_events(spark, warehouse).filter(F.col("topic") == "$devices")
              .filter(F.get_json_object(text, "$.event") == "online")
              .select(F.get_json_object(text, "$.sn").alias("_sn"), F.col("broker_ts").alias("_on")))
    across = (jumps.join(online, (jumps.sn == online._sn) & (online._on > jumps._after_t)
                         & (online._on <= jumps._next_t), "left_semi")
              .select("sn", "after_seq", F.lit(True).alias("_reconnect")))
    return (jumps.join(across, ["sn", "after_seq"], "left")
            .withColumn("skipped", F.coalesce("_reconnect", F.lit(False)) & (F.col("missing") <= s.seq_block))
            .drop("_after_t", "_next_t", "_reconnect"))


def seq_gaps(spark, warehouse: str, s: ReportSettings):
    """One row per hole in a lock's sequence numbers (not the skips of its block reservation)."""
    from pyspark.sql import functions as F

    return (_seq_jumps(spark, warehouse, s).filter(~F.col("skipped"))
            .select("sn", "after_seq", "next_seq", "missing").orderBy("sn", "after_seq"))


def seq_summary(spark, warehouse: str, s: ReportSettings):
    """Per lock: first and last seq, records received, missing, skipped (block
    reservation after a power cut), duplicate copies seen."""
    from pyspark.sql import functions as F

    ev = _lock_records(spark, warehouse)
    skipped = (_seq_jumps(spark, warehouse, s).filter("skipped").groupBy("sn")
               .agg(F.sum("missing").alias("skipped")))
    out = (ev.groupBy("sn").agg(F.min("seq").alias("first_seq"), F.max("seq").alias("last_seq"),
                                F.countDistinct("seq").alias("received"))
           .join(skipped, "sn", "left").withColumn("skipped", F.coalesce("skipped", F.lit(0)).cast("long"))
           .withColumn("missing", F.col("last_seq") - F.col("first_seq") + 1 - F.col("received") - F.col("skipped")))
    dpath = os.path.join(warehouse, "duplicates")
    if os.path.isdir(dpath) and any(n.startswith("date=") for n in os.listdir(dpath)):
        dups = (spark.read.parquet(dpath).join(ev.select("sn").distinct(), "sn", "left_semi")
                .groupBy("sn").agg(F.count(F.lit(1)).alias("duplicates")))
        out = out.join(dups, "sn", "left")
    else:
        out = out.withColumn("duplicates", F.lit(None).cast("long"))
    return (out.withColumn("duplicates", F.coalesce("duplicates", F.lit(0)).cast("long"))
            .select("sn", "first_seq", "last_seq", "received", "missing", "skipped", "duplicates").orderBy("sn"))


REPORTS = {
    "daily_activity": daily_activity,
    "failed_bursts": failed_bursts,
    "offline_periods": offline_periods,
    "clock_delay": clock_delay,
    "seq_gaps": seq_gaps,
    "seq_summary": seq_summary,
}


def _summary(name: str, df) -> str:
    from pyspark.sql import functions as F

    if name == "daily_activity":
        r = df.agg(F.countDistinct("date"), F.countDistinct("sn"), F.sum("unlocks"),
                   F.sum("failed_attempts"), F.sum("alarms")).first()
        return (f"{r[0]} day(s), {r[1]} lock(s): {r[2] or 0} unlocks, {r[3] or 0} failed attempts, "
                f"{r[4] or 0} alarms")
    if name == "failed_bursts":
        r = df.agg(F.count(F.lit(1)), F.countDistinct("sn"), F.max("attempts")).first()
        return f"{r[0]} burst(s) at {r[1]} lock(s), largest {r[2] or 0} attempts"
    if name == "offline_periods":
        r = df.agg(F.count(F.lit(1)), F.countDistinct("sn"), F.max("seconds")).first()
        return f"{r[0]} offline period(s) at {r[1]} lock(s), longest {r[2] or 0:.0f} s"
    if name == "clock_delay":
        off = [x.sn for x in df.filter("clock_off").select("sn").collect()]
        r = df.agg(F.expr("percentile(p50_ms, 0.5)")).first()
        return (f"median lock p50 delay {r[0] or 0:.0f} ms; {len(off)} lock(s) with a wrong clock"
                + (f": {', '.join(off[:10])}" + (" ..." if len(off) > 10 else "") if off else ""))
    if name == "seq_gaps":
        r = df.agg(F.count(F.lit(1)), F.countDistinct("sn"), F.sum("missing")).first()
        return f"{r[0]} gap(s) at {r[1]} lock(s), {r[2] or 0} sequence number(s) missing"
    if name == "seq_summary":
        r = df.agg(F.count(F.lit(1)), F.sum("received"), F.sum("missing"), F.sum("duplicates"),
                   F.sum("skipped")).first()
        return (f"{r[0]} lock(s): {r[1] or 0} received, {r[2] or 0} missing, {r[3] or 0} duplicate copies, "
                f"{r[4] or 0} skipped after power cuts (block reservation)")
    return ""


def run_reports(spark, warehouse: str, out: str | None = None, settings: ReportSettings | None = None,
                names: list[str] | None = None, echo=print) -> dict[str, str]:
    """Compute the reports, write each to ``<out>/<name>/`` (default ``<warehouse>/reports``), print summaries.

    Returns ``{name: summary line}``.
    """
    settings = settings or ReportSettings()
    settings.validate()
    out = out or os.path.join(warehouse, "reports")
    names = names or list(REPORTS)
    unknown = [n for n in names if n not in REPORTS]
    if unknown:
        raise ValueError(f"lockmq: unknown report(s) {unknown}; choose from {list(REPORTS)}")
    lines = {}
    for name in names:
        df = REPORTS[name](spark, warehouse, settings)
        path = os.path.join(out, name)
        df.write.mode("overwrite").parquet(path)
        lines[name] = _summary(name, spark.read.parquet(path))
        echo(f"{name:16s} {lines[name]}  -> {path}")
    return lines
