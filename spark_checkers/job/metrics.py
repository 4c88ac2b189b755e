"""The metric rows (run_id, metric, key, value) of a check: counts and per-bucket series of the publishes and
deliveries (``delivery_metrics``) and of the owed messages (``owed_metrics``), and their sum on the driver after
the collect (``metric_rows``)."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import functions as F

from spark_checkers.job.codes import named

LATENCY_ACCURACY = 1000  # percentile_approx of the latency series: 1 / rank error


TOTAL_PART = "__total"  # a metric row holding one time bucket's share of a run total (metric_rows sums them)


def _bucket(col):
    """A time's bucket of the run's series (``t_origin``, ``bucket_us``: the runs table's)."""
    return ((col - F.col("t_origin")) / F.col("bucket_us")).cast("long")


def _metric(df, metric: str, key, value):
    return df.select("run_id", F.lit(metric).alias("metric"), key.cast("string").alias("key"),
                     value.cast("double").alias("value"))


def delivery_metrics(pub, slots, delivered, runs_b):
    """Small metric rows (run_id, metric, key, value) of the publishes and deliveries: counts and per-bucket
    series.  Each big table is aggregated once, per time bucket, and every row drawn from it (its series and its
    share of the run totals) comes out of one explode of those few bucket rows (``_bucket_rows``).  ``delivered``:
    one row per delivered (subscriber, message) with its first delivery (``t_first``), its publish and its
    counts."""
    parts = []
    # Publishes: per bucket of the ack time (null: never acked), every count in the same pass.
    by_ack = pub.join(runs_b, "run_id").groupBy("run_id", _bucket(F.col("t_ack")).alias("b")).agg(
        F.count(F.lit(1)).alias("published"), F.count("t_ack").alias("acked"),
        F.sum((F.col("t_fail").isNotNull() & F.col("t_ack").isNull()).cast("long")).alias("failed"),
        F.sum((F.col("t_indet").isNotNull() & F.col("t_ack").isNull()).cast("long")).alias("indeterminate"))
    parts.append(_bucket_rows(by_ack, ("published", "acked", "failed", "indeterminate"), {"acked_per_bucket": "acked"}))
    # Deliveries: per bucket of the first delivery.
    latency_ms = (F.col("t_first") - F.col("t_invoke")) / 1000
    # Both percentiles from one digest per bucket (two digests cost twice the inserts and the shuffle), to a
    # rank error of 0.1 % (LATENCY_ACCURACY): the values of a plot.  A bucket of up to 10,000 deliveries is
    # kept whole before the digest compresses, so its percentiles are the same at any accuracy.
    by_first = delivered.groupBy("run_id", _bucket(F.col("t_first")).alias("b")).agg(
        F.count(F.lit(1)).alias("delivered_messages"), F.sum("n_deliveries").alias("deliveries"),
        F.sum("n_resends").alias("inflight_resends"), F.sum("n_after_ack").alias("redeliveries_after_ack"),
        F.percentile_approx(latency_ms, [0.5, 0.99], LATENCY_ACCURACY).alias("pq"))
    by_first = by_first.select("*", F.col("pq")[0].alias("p50"), F.col("pq")[1].alias("p99")).drop("pq")
    # A bucket whose deliveries all lack a publish time has no latency: no row.
    parts.append(_bucket_rows(by_first, ("delivered_messages", "deliveries", "inflight_resends",
                                         "redeliveries_after_ack"),
                              {"delivered_per_bucket": "delivered_messages", "latency_p50_ms": "p50",
                               "latency_p99_ms": "p99"}))
    # Only ids the broker stored: the client's latest session, if persistent (a clean session's are never stored).
    last_pid = slots.filter(F.col("stored") & F.col("last_epoch")).groupBy("run_id", "client").agg(
        F.max_by("packet_id", "seq").alias("pid"))
    parts.append(_metric(last_pid, "last_packet_id", named(F.col("client")), F.col("pid")))
    return reduce(lambda a, b: a.unionByName(b), parts)


WINDOW_OWED, WINDOW_LOST = "window_owed", "window_lost"


def window_key(client_code: int, window_c: int, cause: str | None = None) -> str:
    """The key of a WINDOW_OWED / WINDOW_LOST metric row: the subscriber's code (codes.code_of), the reconnect that
    ends the offline window (t_mono_us) and, for a loss, its invariant."""
    return f"{client_code}|{window_c}" + (f"|{cause}" if cause is not None else "")


def owed_metrics(cand, lost, window_lost=None):
    """Small metric rows of the owed candidates (``cand``: each with what it owes) and the lost ones: the counts
    of what was owed, trimmed, expired, undeliverable, the owed-but-unseen series, the losses by position.
    Every metric here is whole in these rows: ``metric_rows`` merges them with ``delivery_metrics``' as they
    are (no key of one is a key of the other)."""
    owed = cand.filter(F.col("owed"))
    # One scan of the candidates for the four counts; a zero count gives no row (as an empty group would).
    flags = ("owed", "legally_trimmed", "expired_legally", "undeliverable")
    flag_counts = cand.groupBy("run_id").agg(*[F.sum(F.col(f).cast("long")).alias(f) for f in flags])
    parts = [flag_counts.select("run_id", F.explode(F.map_from_arrays(
        F.array(*[F.lit(f) for f in flags]), F.array(*flags))).alias("key", "value"))
        .filter(F.col("value") > 0)
        .select("run_id", F.lit("count").alias("metric"), "key", F.col("value").cast("double").alias("value"))]
    # Owed-but-unseen changes: +1 at the publish, -1 at the first delivery (one pass over the owed rows).
    change = F.explode(F.array(F.struct(F.col("t_invoke").alias("t"), F.lit(1).alias("delta")),
                               F.when(F.col("delivered"), F.struct(F.col("t_first").alias("t"), F.lit(-1).alias("delta")))))
    changes = owed.select("run_id", "t_origin", "bucket_us", change.alias("c")).filter(F.col("c").isNotNull())
    parts.append(_metric(changes.groupBy("run_id", _bucket(F.col("c.t")).alias("b")).agg(F.sum("c.delta").alias("v")),
                         "unseen_delta_per_bucket", F.col("b"), F.col("v")))
    parts.append(_metric(lost.groupBy("run_id", "cause", "position").count(), "loss_position",
                         F.concat_ws("|", "cause", "position"), F.col("count")))
    # Per offline window (subscriber, reconnect): the owed messages judged at that reconnect and those lost
    # there, by cause.  A session the broker reported lost at that reconnect (or that came back there) owes
    # exactly these: the report says how many acknowledged messages went with it (api.py: session windows).
    if "window_c" in cand.columns:
        in_window = owed.filter(F.col("window_c").isNotNull())
        parts.append(_metric(in_window.groupBy("run_id", "client", "window_c").count(), WINDOW_OWED,
                             F.concat_ws("|", F.col("client").cast("string"), F.col("window_c").cast("string")),
                             F.col("count")))
    if window_lost is not None:
        in_window = window_lost.filter(F.col("window_c").isNotNull())
        parts.append(_metric(in_window.groupBy("run_id", "client", "window_c", "cause").count(), WINDOW_LOST,
                             F.concat_ws("|", F.col("client").cast("string"), F.col("window_c").cast("string"),
                                         "cause"), F.col("count")))
    return reduce(lambda a, b: a.unionByName(b), parts)


def _bucket_rows(per_bucket, totals: tuple[str, ...], series: dict[str, str]):
    """The metric rows of one per-bucket aggregate: a series row per bucket and metric (a null value, or the null
    bucket of rows without the time, e.g. never acked, gives none) and, per bucket, its share of each run total
    of ``totals`` (metric TOTAL_PART; every bucket counts, the null one too), summed into metric "count" by
    ``metric_rows`` after the collect.

    Why the totals are summed in Python: summed here, the totals were a second reader of the aggregate, and the
    two readers did not share it: each computed the aggregate, and so its big table (at 10 M events the
    per-message join), once more.  A few rows per bucket cost nothing to sum on the driver."""
    items = [F.struct(F.lit(TOTAL_PART).alias("metric"), F.lit(n).alias("key"), F.col(n).cast("double").alias("value"))
             for n in totals]
    for metric, column in series.items():
        row = F.struct(F.lit(metric).alias("metric"), F.col("b").cast("string").alias("key"),
                       F.col(column).cast("double").alias("value"))
        items.append(F.when(F.col(column).isNotNull() & F.col("b").isNotNull(), row))
    return per_bucket.select("run_id", F.explode(F.array_compact(F.array(*items))).alias("r")).select(
        "run_id", "r.metric", "r.key", "r.value")


def metric_rows(rows) -> list[dict]:
    """The collected metric rows as (run_id, metric, key, value) dicts, each run total's per-bucket parts
    (TOTAL_PART) summed into one metric "count" row."""
    out: list[dict] = []
    totals: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["metric"] == TOTAL_PART:
            key = (row["run_id"], row["key"])
            totals[key] = totals.get(key, 0.0) + (row["value"] or 0.0)
        else:
            out.append({name: row[name] for name in ("run_id", "metric", "key", "value")})
    out += [{"run_id": run_id, "metric": "count", "key": key, "value": value} for (run_id, key), value in totals.items()]
    return out
