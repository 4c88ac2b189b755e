"""Collecting a check: the violations (ranked per run and invariant, the earliest few kept as witnesses; lost
messages up to LOSS_ROWS_CAP, to build gaps) and the metric rows in one job, and the history rows around each
shown witness (``collect_context``)."""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from contracts.history_schema import Kind
from spark_checkers.job.events import local_frame
from spark_checkers.job.metrics import metric_rows
from spark_checkers.rules.losses import LOSS_INVARIANTS

WITNESS_CAP = 5


LOSS_ROWS_CAP = 200  # lost messages collected per run and invariant, to build gap witnesses


def collect_all(violations, metrics):
    """Violations (as collect_violations) and metric rows in one job: the two share the cached tables' scans
    and exchanges, and a small check pays one job's fixed cost instead of two."""
    ranked = _ranked(violations).filter(F.col("rn") <= F.col("cap")).select(
        "run_id", "invariant", "sort_key", "witness", "total", F.lit(None).cast("string").alias("metric"),
        F.lit(None).cast("string").alias("key"), F.lit(None).cast("double").alias("value"))
    rows = ranked.unionByName(metrics.select(
        "run_id", F.lit(None).cast("string").alias("invariant"), F.lit(None).cast("long").alias("sort_key"),
        F.lit(None).cast("string").alias("witness"), F.lit(None).cast("long").alias("total"), "metric", "key",
        "value")).collect()
    counts, witnesses = _gather([r for r in rows if r["metric"] is None])
    return counts, witnesses, metric_rows([r for r in rows if r["metric"] is not None])


def _ranked(violations):
    """Each violation's rank within its (run, invariant): by sort key (time), then by the witness's JSON, whose
    names are codes here (``named``): witnesses at one time are chosen in code order, the same in every check."""
    w = Window.partitionBy("run_id", "invariant").orderBy("sort_key", "witness")
    cap = F.when(F.col("invariant").isin(*LOSS_INVARIANTS), F.lit(LOSS_ROWS_CAP)).otherwise(F.lit(WITNESS_CAP))
    return violations.withColumn("rn", F.row_number().over(w)).withColumn(
        "total", F.count(F.lit(1)).over(Window.partitionBy("run_id", "invariant"))).withColumn("cap", cap)


def _gather(rows):
    counts: dict[tuple[str, str], int] = {}
    witnesses: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        key = (row["run_id"], row["invariant"])
        counts[key] = row["total"]
        witnesses.setdefault(key, []).append((row["sort_key"], row["witness"]))
    return counts, {k: [w for _, w in sorted(v)] for k, v in witnesses.items()}


def collect_context(spark, events, windows: list[tuple], rows_each: int, margin_us: int) -> dict[tuple, list[dict]]:
    """The deliveries and acks around each witness: ``windows`` = [(run_id, wid, client, t_lo, t_hi, publisher,
    pub_seq)]; per (run_id, wid) the ``rows_each`` nearest to t_lo or t_hi within the margin, the witness's own
    message first.  One scan of the big streams, joined to the few windows by broadcast."""
    if not windows:
        return {}
    S, L = T.StringType(), T.LongType()
    wdf = local_frame(spark, windows, T.StructType([
        T.StructField("run_id", S), T.StructField("wid", L), T.StructField("client", S), T.StructField("t_lo", L),
        T.StructField("t_hi", L), T.StructField("w_publisher", S), T.StructField("w_pub_seq", L)]))
    rows = events.filter(F.col("kind").isin(Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)).select(
        "run_id", "client", "seq", "t_mono_us", "kind", "packet_id", "dup", "qos", "publisher", "pub_seq", "node")
    near = rows.join(F.broadcast(wdf), ["run_id", "client"]).filter(
        (F.col("t_mono_us") >= F.col("t_lo") - margin_us) & (F.col("t_mono_us") <= F.col("t_hi") + margin_us))
    own = (F.col("publisher") == F.col("w_publisher")) & (F.col("pub_seq") == F.col("w_pub_seq"))
    distance = F.least(F.abs(F.col("t_mono_us") - F.col("t_lo")), F.abs(F.col("t_mono_us") - F.col("t_hi")))
    rank = F.row_number().over(Window.partitionBy("run_id", "wid").orderBy(
        F.coalesce(own, F.lit(False)).desc(), distance, "seq"))
    out: dict[tuple, list[dict]] = {}
    for row in near.select("*", rank.alias("rank")).filter(F.col("rank") <= rows_each).collect():
        out.setdefault((row["run_id"], row["wid"]), []).append(row.asDict())
    return out


def collect_violations(violations):
    """(counts per (run, invariant), witnesses: the earliest few per (run, invariant))."""
    return _gather(_ranked(violations).filter(F.col("rn") <= F.col("cap")).collect())
