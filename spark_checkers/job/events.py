"""The history as Spark reads it: the event schema, every run's parts in one scan (``load_events``, ``RunSpec``),
the driver's collects of the small rows and the topics, and ``local_frame`` (a DataFrame of driver rows)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from contracts.history_schema import EVENT_SCHEMA, RETAINED_TOPIC_PREFIX, WILL_TOPIC_PREFIX, Kind
from spark_checkers.guarantees import Guarantees
from spark_checkers.loader import spark_uri
from spark_checkers.timeline import SMALL_KINDS


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    parts: tuple[str, ...]
    guarantees: Guarantees


def spark_schema():
    mapping = {"int64": T.LongType(), "int32": T.IntegerType(), "int8": T.ByteType(), "string": T.StringType(),
               "bool": T.BooleanType()}
    return T.StructType([T.StructField(f.name, mapping[str(f.type)], True) for f in EVENT_SCHEMA])


def load_events(spark, runs: list[RunSpec]):
    """All runs' parts in one scan (Spark packs small files into few tasks); run_id from each row's file."""
    path_to_run: dict[str, str] = {}
    for run in runs:
        for part in run.parts:
            uri = spark_uri(part)
            # Spark names a file "file:/abs/path" or "file:///abs/path", percent-encoded: key every form.
            encoded = quote(uri, safe="/:")
            for name in (part, uri, encoded, uri.replace("file:///", "file:/", 1),
                         encoded.replace("file:///", "file:/", 1)):
                path_to_run[name] = run.run_id
    paths = [spark_uri(part) for run in runs for part in run.parts]
    events = spark.read.schema(spark_schema()).parquet(*paths)
    if len(runs) == 1:  # one run: a constant, no per-row lookup of the file path
        return events.withColumn("run_id", F.lit(runs[0].run_id))
    lookup = F.create_map(*[F.lit(x) for pair in path_to_run.items() for x in pair])
    return events.withColumn("run_id", lookup[F.col("_metadata.file_path")])


def _on_will_topic():
    """A row of the Will flow on a will topic (contracts/history_schema.py WILL_TOPIC_PREFIX): the watcher's Will
    deliveries and its acks of them."""
    return (F.col("kind").isin(Kind.DELIVERY, Kind.DELIVERY_ACK_SENT, Kind.QOS2_RECEIVED)
            & F.coalesce(F.col("topic").startswith(WILL_TOPIC_PREFIX), F.lit(False)))


def without_wills(events):
    """The events without the Will flow: a Will carries no payload identity, it is no published message (the
    Will rules read it from the small rows, spark_checkers/wills.py)."""
    return events.filter(~_on_will_topic())


def collect_small(events) -> dict[str, list[dict]]:
    """The small rows (SMALL_KINDS), the watcher's Will deliveries and the rows of the retained topics, per run."""
    out: dict[str, list[dict]] = {}
    wills = (F.col("kind") == Kind.DELIVERY) & _on_will_topic()
    # the retained publishes, their acks and the RETAIN 1 copies (spark_checkers/retained.py): a few per run
    retained = (F.col("kind").isin(Kind.PUBLISH_INVOKE, Kind.PUBLISH_ACK, Kind.DELIVERY)
                & F.coalesce(F.col("topic").startswith(RETAINED_TOPIC_PREFIX), F.lit(False)))
    for row in events.filter(F.col("kind").isin(*SMALL_KINDS) | wills | retained).collect():
        out.setdefault(row["run_id"], []).append(row.asDict())
    return out


def collect_topics(events) -> tuple[dict[str, list[str]], dict[str, int], set[str]]:
    """(distinct published topics per run, rows read per run, every node name) in one scan."""
    topics: dict[str, set[str]] = {}
    rows_read: dict[str, int] = {}
    nodes: set[str] = set()
    invoke = F.col("kind") == Kind.PUBLISH_INVOKE
    grouped = events.groupBy("run_id", F.when(invoke, F.col("topic")).alias("topic"), "node").agg(
        F.count(F.lit(1)).alias("n")).collect()
    for row in grouped:
        rows_read[row["run_id"]] = rows_read.get(row["run_id"], 0) + row["n"]
        if row["topic"] is not None:
            topics.setdefault(row["run_id"], set()).add(row["topic"])
        if row["node"] is not None:
            nodes.add(row["node"])
    return {run_id: sorted(names) for run_id, names in topics.items()}, rows_read, nodes


def local_frame(spark, rows: list[tuple], schema):
    """A small DataFrame of the driver's rows (tuples in ``schema``'s order; a struct as a tuple), made from
    Arrow: a local relation in the plan.  ``schema``: a StructType, or its DDL ("run_id string, seq long").

    Why not ``createDataFrame(rows)``: a classic session makes a list of rows a Python RDD, so every job that
    reads it (each broadcast of a side table, pruned to other columns for each join) ran tasks in Python
    worker processes, forked beside the JVM, for a few rows.  From Arrow it is a local relation the JVM reads
    itself (and a Connect session sends as Arrow either way)."""
    if isinstance(schema, str):
        schema = T.StructType.fromDDL(schema)
    table = pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows],
                                 schema=to_arrow_schema(schema))
    return spark.createDataFrame(table, schema)
