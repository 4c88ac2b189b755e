"""The Spark side: every invariant over the big streams (publishes, deliveries, acks) for many runs at once.

Every key starts with ``run_id`` so one job checks a batch of histories (tests check dozens in one go).
Shape, chosen to keep shuffles few: one groupBy per message on the publisher side; one window over each
(subscriber, packet id) slot; one groupBy per (subscriber, message); the owed candidates joined once to the
deliveries, with a window clustered by subscriber (backlog rank; in a big check over the queued rows only); a
message's stream neighbours only where they can matter (the order rule's: in a big check, only for publishers
whose messages arrived out of order; the loss rules': only for streams with a never-delivered candidate).
The small tables
(subscriptions, offline windows, faults) are broadcast, looked up with higher-order functions, never joined
row by row.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce
from typing import Any
from urllib.parse import quote

from contracts.history_schema import EVENT_SCHEMA, Kind
from contracts.topics import filter_matches
from spark_checkers.guarantees import Guarantees
from spark_checkers.timeline import NEVER, SMALL_KINDS, Timeline, detail_of

# Below this many bytes of history (a run: 10k-100k events are 0.3-3 MB) a check is all fixed cost.
SMALL_BYTES = int(os.environ.get("ORDEAL_CHECKER_SMALL_BYTES", str(64 << 20)))
WITNESS_CAP = 5
BIG_SPLIT_BYTES = 32 << 20  # the most of a big check's history one scan task reads (session_settings)
SMALL_SPLIT_BYTES = 128 << 20  # a small check's: Spark's default, set again because a shared server keeps settings
LATENCY_ACCURACY = 1000  # percentile_approx of the latency series: 1 / rank error
TOTAL_PART = "__total"  # a metric row holding one time bucket's share of a run total (metric_rows sums them)
LOSS_ROWS_CAP = 200  # lost messages collected per run and invariant, to build gap witnesses
LOSS_INVARIANTS = ("durability.lost", "durability.lost_allowed", "expiry.dropped_early", "limits.trimmed_under_limit",
                   "limits.trim_not_oldest", "limits.trim_not_newest")
# Columns no checker reads (wall clocks, payload size, retain): not even decoded for the small rows.
UNREAD_COLUMNS = ("t_wall_us", "send_wall_us", "payload_size", "retain")
PUB_KINDS = (Kind.PUBLISH_INVOKE, Kind.PUBLISH_ACK, Kind.PUBLISH_FAIL, Kind.PUBLISH_INDETERMINATE)
# Column groups of the per-(subscriber, message) tables: the key, what ``publishes`` gives per message, what
# ``deliveries_per_message`` (+ stream neighbour) gives per delivered message, the per-run scalars.
SUBSCRIBER_MESSAGE = ("run_id", "client", "publisher", "pub_seq")
PUBLISH_COLUMNS = ("topic", "n_invoke", "t_invoke", "pub_qos", "expiry_s", "pub_hash", "pub_node", "t_ack", "t_fail",
                   "t_indet")
MESSAGE_COLUMNS = ("n_deliveries", "first", "last", "t_last", "min_hash", "max_hash", "qos", "first_ack_seq", "first_ack_t",
                   "n_resends", "n_after_ack", "redelivery", "twice", "implied_deadline", "any_unacked")
DELIVERY_COLUMNS = (*MESSAGE_COLUMNS, "prev_max")
RUN_SCALARS = ("limit", "ttl_us", "tol_us", "bucket_us", "t_origin", "slack_us")
DELIVERED_COLUMNS = (*SUBSCRIBER_MESSAGE, *PUBLISH_COLUMNS, *DELIVERY_COLUMNS, *RUN_SCALARS)


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    parts: tuple[str, ...]
    guarantees: Guarantees


def sql(text: str):
    """A column from SQL text: how every higher-order function (filter, exists, transform) is written here.

    Why not a Python lambda: PySpark names a lambda's variable afresh on every call (``x_41``, ``x_42``, ... from
    one counter per JVM or Connect client), and the name is written into the generated Java.  So every check
    generated ~20 classes that differed from the last check's only in those names, compiled by Janino and then
    by the JIT anew every time.  A SQL lambda keeps its name as written, so a check's generated code is the same
    every time and, with a code cache that holds a whole check (session.CODEGEN_CACHE_ENTRIES), a warm server
    compiles nothing (a warm 100k-event check: 415 compilations with the default cache, 20 with the big one, 0
    with both; tests/unit/test_checker_codegen.py)."""
    from pyspark.sql import functions as F

    return F.expr(text)


def spark_schema():
    from pyspark.sql import types as T

    mapping = {"int64": T.LongType(), "int32": T.IntegerType(), "int8": T.ByteType(), "string": T.StringType(),
               "bool": T.BooleanType()}
    return T.StructType([T.StructField(f.name, mapping[str(f.type)], True) for f in EVENT_SCHEMA])


def load_events(spark, runs: list[RunSpec]):
    """All runs' parts in one scan (Spark packs small files into few tasks); run_id from each row's file."""
    from pyspark.sql import functions as F

    from spark_checkers.loader import spark_uri

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


PLANS = ("small", "big")  # the two shapes of a check's plan (session_settings, build's ``small``)


def plan_bytes(total_bytes: int, plan: str | None) -> int:
    """The history size a check plans for: its own, or one of the forced shape's (``check_runs(plan=...)``)."""
    if plan == "big":
        return max(total_bytes, SMALL_BYTES)
    if plan == "small":
        return min(total_bytes, SMALL_BYTES - 1)
    return total_bytes


def shuffle_partitions(total_bytes: int) -> int:
    """Few partitions for small histories (task overhead dominates), more for big ones."""
    if total_bytes < SMALL_BYTES:
        return 1
    return int(max(2, min(64, total_bytes // (24 << 20))))


def session_settings(total_bytes: int) -> dict[str, str]:
    """Per-check SQL settings by input size.  A small check (a run's history: 10k-100k events, a few MB) is
    all fixed cost: one partition per shuffle and no adaptive re-planning between stages (measured at 10k
    events: 11 JVM CPU-seconds instead of 17-20).  A big one keeps adaptive execution and more partitions."""
    small = total_bytes < SMALL_BYTES
    return {"spark.sql.shuffle.partitions": str(shuffle_partitions(total_bytes)),
            "spark.sql.adaptive.enabled": "false" if small else "true",
            # A big check's four materialised tables are cached uncompressed: compressing costs a hash-map
            # lookup per string value and row (dictionary encoding's statistics: 10 % of a 10 M check's CPU
            # samples) for tables read a few times and dropped.  Measured at 10 M, interleaved: 80.1 and
            # 87.7 s against 89.3 and 92.7 s (docs/report.md, session 10).
            "spark.sql.inMemoryColumnarStorage.compressed": "true" if small else "false",
            # A big check's scans in splits of at most BIG_SPLIT_BYTES, so the cores share them evenly: a 10 M
            # history (five 45 MB files) was read by 3 tasks on 2 cores, two files each but one, and one core
            # idled through the last third of each scan stage.  Measured, warm 10 M checks alternating in one
            # JVM: median 53.1 s against 54.2 s, each run faster than its pair (docs/report.md, session 13).  A
            # small check keeps Spark's default, which packs a run's few parts into one task.
            "spark.sql.files.maxPartitionBytes": str(SMALL_SPLIT_BYTES if small else BIG_SPLIT_BYTES)}


def collect_small(events) -> dict[str, list[dict]]:
    from pyspark.sql import functions as F

    out: dict[str, list[dict]] = {}
    for row in events.filter(F.col("kind").isin(*SMALL_KINDS)).collect():
        out.setdefault(row["run_id"], []).append(row.asDict())
    return out


def collect_topics(events) -> tuple[dict[str, list[str]], dict[str, int], set[str]]:
    """(distinct published topics per run, rows read per run, every node name) in one scan."""
    from pyspark.sql import functions as F

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


# --- Codes: the names and body hashes the Spark side carries as numbers ------------------------------------
# Every client, publisher, topic, node and body hash is a 64-bit code (Spark's xxhash64, seed 42) from the
# first step on, and a witness or metric key carries it as CODE_MARK + the code, named again after the collect
# (``Names``).  Why: Spark reads a cached table as columns only if every column is a primitive; one string made
# every read of it build a row per cached row, and every sort and shuffle carried the strings.  Coded, the
# delivery slots and the publishes are all numbers.  The benchmark's 10 M history: 66.0 s first and 46.4 s
# again in the same JVM, against 74.9 s and 55.1 s with strings (docs/report.md, session 15).
CODED = ("client", "publisher", "topic", "node", "body_hash")
# A coded value in a witness: U+0000 cannot begin a name (MQTT forbids it in client ids and topics
# [MQTT-1.5.4-2]; the nodes and hashes are the harness's own).
CODE_MARK = "\x00"
_CODE_SEED = 42  # Spark's xxhash64 seed


def code_of(name: str | None) -> int | None:
    """The code Spark's ``coded`` gives ``name``: xxhash64 of its UTF-8 bytes, seed 42, as a signed long."""
    import xxhash

    if name is None:
        return None
    code = xxhash.xxh64_intdigest(name.encode(), seed=_CODE_SEED)
    return code - (1 << 64) if code >= 1 << 63 else code


def coded(column):
    """A name column as its code (null stays null: Spark's xxhash64 of null is the seed)."""
    from pyspark.sql import functions as F

    return F.when(column.isNotNull(), F.xxhash64(column))


def named(column):
    """A coded column as a witness or metric key carries it: CODE_MARK + the code, named after the collect."""
    from pyspark.sql import functions as F

    return F.concat(F.lit(CODE_MARK), column.cast("string"))


def witness_name(column: str, alias: str | None = None):
    """A coded column of a witness (``named``), under its own name or ``alias`` ("first.node" as "node")."""
    from pyspark.sql import functions as F

    return named(F.col(column)).alias(alias or column)


def encode_events(events):
    """The events with every column of CODED as its code."""
    from pyspark.sql import functions as F

    return events.select(*[coded(F.col(c)).alias(c) if c in CODED else F.col(c) for c in events.columns])


def lookup_names(events, codes: set[int]) -> dict[int, str]:
    """The names of ``codes`` that the caller does not know (a phantom's publisher, a topic never published, a
    body hash): one scan of the coded columns."""
    from pyspark.sql import functions as F

    if not codes:
        return {}
    name = F.explode(F.array(*[F.col(c) for c in CODED])).alias("name")
    found = (events.select(name).filter(F.col("name").isNotNull()).select("name", coded(F.col("name")).alias("code"))
             .filter(F.col("code").isin(*codes)).distinct().collect())
    return {row["code"]: row["name"] for row in found}


@dataclass
class Names:
    """Code -> name for what a check's witnesses and metric keys carry coded (``named``)."""

    known: dict[int, str]

    @classmethod
    def of(cls, names) -> Names:
        """From the names the driver knows (the timelines' clients, the topics and nodes); a ValueError names
        two of them that share a code (the check would merge them)."""
        known: dict[int, str] = {}
        for name in names:
            code = code_of(name)
            if known.setdefault(code, name) != name:
                raise ValueError(f"the names {known[code]!r} and {name!r} have the same 64-bit code {code}: "
                                 "the checkers cannot tell them apart")
        return cls(known)

    def unknown(self, values) -> set[int]:
        """The codes in ``values`` (witnesses, keys) that have no name yet."""
        return {code for value in values for code in _codes(value) if code not in self.known}

    def learn(self, found: dict[int, str]) -> None:
        self.known.update(found)

    def decode(self, value):
        """``value`` (a witness, a key) with every coded string named again."""
        if isinstance(value, str) and value.startswith(CODE_MARK):
            code = int(value[1:])
            return self.known.get(code, f"<code {code}>")
        if isinstance(value, dict):
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        return value


def _codes(value):
    """Every code a witness or key carries (``named``), nested or not."""
    if isinstance(value, str) and value.startswith(CODE_MARK):
        yield int(value[1:])
    elif isinstance(value, dict | list):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _codes(v)


def local_frame(spark, rows: list[tuple], schema):
    """A small DataFrame of the driver's rows (tuples in ``schema``'s order; a struct as a tuple), made from
    Arrow: a local relation in the plan.  ``schema``: a StructType, or its DDL ("run_id string, seq long").

    Why not ``createDataFrame(rows)``: a classic session makes a list of rows a Python RDD, so every job that
    reads it (each broadcast of a side table, pruned to other columns for each join) ran tasks in Python
    worker processes, forked beside the JVM, for a few rows.  From Arrow it is a local relation the JVM reads
    itself (and a Connect session sends as Arrow either way)."""
    import pyarrow as pa
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    if isinstance(schema, str):
        schema = T.StructType.fromDDL(schema)
    table = pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows],
                                 schema=to_arrow_schema(schema))
    return spark.createDataFrame(table, schema)


# --- Broadcast tables built from the timelines -------------------------------------------------------------


def side_tables(spark, runs: list[RunSpec], timelines: dict[str, Timeline], topics: dict[str, list[str]]):
    """(runs_df, clients_df, match_df): small DataFrames, broadcast to every join they meet."""
    from pyspark.sql import types as T

    run_rows, client_rows, match_rows = [], [], []  # every client and topic as its code (encode_events)
    for run in runs:
        timeline, g = timelines[run.run_id], run.guarantees
        run_rows.append((run.run_id, g.persisted_messages_limit, g.ttl_us, g.tolerance_us, timeline.fault_times(),
                         timeline.bucket_us, timeline.t_first, g.slack_us, g.queue_policy,
                         unpromised_fault_times(timeline, g), fault_spans(timeline)))
        clients = set(timeline.connect_seqs) | set(timeline.offline)
        for client in clients:
            client_rows.append((run.run_id, code_of(client), timeline.connect_seqs.get(client, []),
                                timeline.fresh_seqs.get(client, []),
                                [(s, t) for s, t in timeline.disconnects.get(client, [])],
                                list(timeline.offline.get(client, [])),
                                [(row["seq"], row["t_mono_us"]) for row in timeline.connects.get(client, [])
                                 if (row.get("reason_code") or 0) < 0x80],
                                timeline.persistent_fresh_seqs.get(client, []),
                                [(n["seq"], n["t"], n["why"], n["clean_start"])
                                 for n in timeline.new_sessions.get(client, [])],
                                [row["seq"] for row in timeline.snapshots if row.get("client") == client
                                 and detail_of(row).get("when") == "preset"]))
        for topic in topics.get(run.run_id, []):
            subs = [(code_of(s.client), s.t_from, s.t_to, s.granted_qos, s.persistent)
                    for s in timeline.subscriptions if filter_matches(s.topic_filter, topic)]
            if subs:
                match_rows.append((run.run_id, code_of(topic), subs, sorted({s[0] for s in subs})))
    L, S, B, N = T.LongType(), T.StringType(), T.BooleanType(), T.IntegerType()
    runs_df = local_frame(spark, run_rows, T.StructType([
        T.StructField("run_id", S), T.StructField("limit", N), T.StructField("ttl_us", L),
        T.StructField("tol_us", L), T.StructField("fault_times", T.ArrayType(L)), T.StructField("bucket_us", L),
        T.StructField("t_origin", L), T.StructField("slack_us", L), T.StructField("policy", S),
        T.StructField("unpromised_times", T.ArrayType(L)),
        # Every fault and node event as [s, e] (e: the heal, NEVER if none; an event: s = e).
        T.StructField("fault_spans", T.ArrayType(T.StructType([T.StructField("s", L), T.StructField("e", L)])))]))
    clients_df = local_frame(spark, client_rows, T.StructType([
        T.StructField("run_id", S), T.StructField("client", L), T.StructField("connect_seqs", T.ArrayType(L)),
        T.StructField("fresh_seqs", T.ArrayType(L)),
        T.StructField("disconnects", T.ArrayType(T.StructType([T.StructField("seq", L), T.StructField("t", L)]))),
        T.StructField("offline", T.ArrayType(T.StructType([T.StructField("idx", N), T.StructField("d", L),
                                                           T.StructField("c", L),
                                                           T.StructField("discarded", B)]))),
        # Accepted connects (CONNACK reason < 0x80) as (seq, t): when each connection was established.
        T.StructField("connects", T.ArrayType(T.StructType([T.StructField("seq", L), T.StructField("t", L)]))),
        T.StructField("persistent_fresh_seqs", T.ArrayType(L)),
        # The connects that legally began a new session, discarding the one before (Timeline.new_sessions).
        T.StructField("new_sessions", T.ArrayType(T.StructType([
            T.StructField("seq", L), T.StructField("t", L), T.StructField("why", S),
            T.StructField("clean_start", B)]))),
        # The harness's packet-id presets (session_snapshot rows with when = "preset"): each one sets the
        # session's stored counter, so the ids after it start a new run of the sequence.
        T.StructField("preset_seqs", T.ArrayType(L))]))
    match_df = local_frame(spark, match_rows, T.StructType([
        T.StructField("run_id", S), T.StructField("topic", L),
        T.StructField("subs", T.ArrayType(T.StructType([
            T.StructField("client", L), T.StructField("t_from", L), T.StructField("t_to", L),
            T.StructField("granted", N), T.StructField("persistent", B)]))),
        # The distinct clients of subs: every claim on the topic is one of them.
        T.StructField("clients", T.ArrayType(L))]))
    return runs_df, clients_df, match_df


def fault_spans(timeline: Timeline) -> list[tuple[int, int]]:
    """Every fault as (start, heal or NEVER) and every node event as (t, t): the times a fault may explain a
    duplicate or a stored packet id no delivery shows (a save repeated after a failure, a rolled-back removal)."""
    spans = [(f.t_start, f.t_heal if f.t_heal is not None else NEVER) for f in timeline.faults]
    spans += [(e["t_mono_us"], e["t_mono_us"]) for e in timeline.node_events]
    return sorted(spans)


def unpromised_fault_times(timeline: Timeline, g) -> list[int]:
    """Start times of the faults whose losses the target's declared persistence does not cover (a kill of a
    broker that promises only a graceful stop): a message lost to one is *allowed*, not a violation."""
    kinds = g.unpromised_faults
    return sorted(f.t_start for f in timeline.faults
                  if f.kind in kinds and (not g.target_name or f.node in (None, g.target_name)))


# --- The big tables ---------------------------------------------------------------------------------------


def aggregate(df, keys: tuple[str, ...], *aggs, constant: dict[str, str] | None = None):
    """``df.groupBy(*keys).agg(*aggs)``, with the keys that hold one value in every row (``constant``: run_id in
    a one-run check) left out of the grouping and put back as literals in front.

    Why: Spark keeps a literal grouping key (it propagates the literal into the grouping after the rule that
    drops literal keys has run), so every row was grouped by "run0" too.  A hash aggregate hashed the string
    per row; a sort aggregate wanted its input sorted by (literal, keys...), an order no sort by the real keys
    gives: the per-message aggregate sorted its 2.5 M rows (10 M events) three times over, before, between and
    after its two phases, although the window beneath it had left them in the keys' order."""
    from pyspark.sql import functions as F

    constant = {name: value for name, value in (constant or {}).items() if name in keys}
    grouped = df.groupBy(*[k for k in keys if k not in constant]).agg(*aggs)
    if not constant:
        return grouped
    return grouped.select(*[F.lit(value).alias(name) for name, value in constant.items()], "*")


def publishes(events, constant: dict[str, str] | None = None):
    """One row per message: what was published and how the publish ended (``constant``: see ``aggregate``)."""
    from pyspark.sql import functions as F

    p = events.filter(F.col("kind").isin(*PUB_KINDS)).withColumn(
        "publisher", F.coalesce("publisher", "client")).filter(F.col("pub_seq").isNotNull())
    inv = F.col("kind") == Kind.PUBLISH_INVOKE

    def on_invoke(name: str):
        return F.max(F.when(inv, F.col(name)))

    return aggregate(
        p, ("run_id", "publisher", "pub_seq"),
        F.sum(inv.cast("int")).alias("n_invoke"),
        F.min(F.when(inv, F.col("t_mono_us"))).alias("t_invoke"),
        on_invoke("topic").alias("topic"), on_invoke("qos").alias("pub_qos"),
        on_invoke("expiry_s").alias("expiry_s"), on_invoke("body_hash").alias("pub_hash"),
        on_invoke("node").alias("pub_node"),
        F.min(F.when(F.col("kind") == Kind.PUBLISH_ACK, F.col("t_mono_us"))).alias("t_ack"),
        F.min(F.when(F.col("kind") == Kind.PUBLISH_FAIL, F.col("t_mono_us"))).alias("t_fail"),
        F.min(F.when(F.col("kind") == Kind.PUBLISH_INDETERMINATE, F.col("t_mono_us"))).alias("t_indet"),
        constant=constant)


def subscriber_partitioning(runs: list[RunSpec]) -> tuple[str, ...]:
    """The key the delivery side is moved by, once.  With one run, run_id is a constant the optimiser folds out
    of every later key, and (constant, client) would match none of them: the client alone.  With many runs,
    the client alone would put every run's "sub-0" in one partition: (run_id, client), both real columns."""
    return ("client",) if len(runs) == 1 else ("run_id", "client")


def delivery_slots(events, clients_df, by: tuple[str, ...]):
    """Deliveries with what their packet-id slot says: the previous use of the slot, resend, reuse, acked."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # The kind as a flag (the rows are deliveries and the acks the subscriber sent): a string compared on every
    # row and neighbour, and carried through the shuffle and the sort, is a byte here.
    rows = events.filter(F.col("kind").isin(Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)).select(
        "run_id", "client", "seq", F.col("t_mono_us").alias("t"), (F.col("kind") == Kind.DELIVERY_ACK_SENT).alias("ack"),
        "packet_id", "publisher", "pub_seq", "body_hash", "topic", "qos", "dup", "remaining_expiry_s", "node",
        "protocol")
    # Why one repartition by subscriber: every later step on the delivery side (packet-id slots, per message,
    # stream order, the owed candidates and their queue ranks) is keyed by (run, subscriber, ...).  The rows
    # move once; every later window, aggregate and join only sorts within its partition.
    rows = rows.repartition(*by).join(F.broadcast(clients_df.select("run_id", "client", "connect_seqs", "fresh_seqs",
                                                                    "persistent_fresh_seqs")),
                                      ["run_id", "client"], "left")
    rows = rows.withColumn("conn", sql("size(filter(coalesce(connect_seqs, array()), x -> x < seq))"))
    rows = rows.withColumn("epoch", sql("size(filter(coalesce(fresh_seqs, array()), x -> x < seq))"))
    # White box: a QoS > 0 delivery in a persistent session carries an id the reference broker stored (save.lua
    # hands them out per session, 1..65535 then 1); a clean session's ids are per connection and never stored.
    epoch_persistent = (F.col("epoch") > 0) & F.array_contains(
        F.coalesce("persistent_fresh_seqs", F.array()), F.element_at(F.col("fresh_seqs"), F.greatest(F.col("epoch"), F.lit(1))))
    rows = rows.withColumn("stored", epoch_persistent & (F.coalesce("qos", F.lit(0)) > 0) & F.col("packet_id").isNotNull())
    rows = rows.withColumn("last_epoch", F.col("epoch") == F.size(F.coalesce("fresh_seqs", F.array())))
    slot = Window.partitionBy("run_id", "client", "packet_id").orderBy("seq")
    same_identity = (F.col("prev_publisher").eqNullSafe(F.col("publisher"))
                     & F.col("prev_pub_seq").eqNullSafe(F.col("pub_seq")))
    # One select, so one window operator: built column by column, the frame of prev_holder (its input computed
    # in a projection between them) made a second one, and each copies every row of the stage once more.
    rows = rows.select(
        "*",
        F.lag("ack").over(slot).alias("prev_ack"),
        F.lag("publisher").over(slot).alias("prev_publisher"),
        F.lag("pub_seq").over(slot).alias("prev_pub_seq"),
        F.lag("epoch").over(slot).alias("prev_epoch"),
        F.lag("t").over(slot).alias("prev_t"),
        F.lead("ack").over(slot).alias("next_ack"),
        F.lead("seq").over(slot).alias("next_seq"),
        F.lead("t").over(slot).alias("next_t"),
        F.lag("conn").over(slot).alias("prev_conn"),
        # The last delivery in this slot, acks in between or not: the same stored entry sent again (after a
        # rolled-back removal, say) keeps its id; only another message takes a new one.
        F.last(F.when(~F.col("ack"), F.struct(
            F.col("publisher").alias("publisher"), F.col("pub_seq").alias("pub_seq"), F.col("epoch").alias("epoch"))),
            ignorenulls=True).over(slot.rowsBetween(Window.unboundedPreceding, -1)).alias("prev_holder"))
    slot_in_use = (~F.col("prev_ack") & (F.col("prev_epoch") == F.col("epoch"))
                   & (F.coalesce("qos", F.lit(0)) > 0) & F.col("packet_id").isNotNull())
    return (rows.filter(~F.col("ack"))
            .withColumn("resend", slot_in_use & same_identity)
            .withColumn("reused", slot_in_use & ~same_identity)
            .withColumn("acked", F.col("next_ack"))
            # Takes a new stored packet id: not the message the slot held last in this session.
            .withColumn("new_id", F.col("stored") & ~F.coalesce(
                (F.col("prev_holder.epoch") == F.col("epoch")) & F.col("prev_holder.publisher").eqNullSafe(F.col("publisher"))
                & F.col("prev_holder.pub_seq").eqNullSafe(F.col("pub_seq")), F.lit(False)))
            # Materialised next: only what later steps read (each string column costs to cache).
            .drop("connect_seqs", "fresh_seqs", "persistent_fresh_seqs", "ack", "prev_ack", "next_ack", "prev_epoch",
                  "prev_holder"))


FIRST_FIELDS = ("seq", "t", "packet_id", "dup", "conn", "node", "topic", "qos", "epoch", "stored")  # ``first``
LAST_FIELDS = ("seq", "t", "packet_id", "dup", "node")  # ``last``: a message's first and last delivery
AFTER_ACK_COLUMNS = ("n_after_ack", "redelivery", "twice")  # what only a message's deliveries in order give
# A big check's messages delivered more than once, up to this many, get AFTER_ACK_COLUMNS from their own rows
# (broadcast); with more, every message's are computed the small way (deliveries_per_message).
MULTI_DELIVERY_BROADCAST_ROWS = 100_000


def _message_aggregates() -> list:
    """What one pass over a message's deliveries gives in any order (each aggregate's buffer a primitive)."""
    from pyspark.sql import functions as F

    return [F.count(F.lit(1)).alias("n_deliveries"), F.max("t").alias("t_last"),
            F.min("body_hash").alias("min_hash"), F.max("body_hash").alias("max_hash"), F.max("qos").alias("qos"),
            # A delivery is acked when the next row of its packet-id slot is the subscriber's ack (delivery_slots).
            F.min(F.when(F.col("acked"), F.col("next_seq"))).alias("first_ack_seq"),
            F.min(F.when(F.col("acked"), F.col("next_t"))).alias("first_ack_t"),
            F.sum(F.col("resend").cast("int")).alias("n_resends"),
            F.max(F.col("t") + F.col("remaining_expiry_s") * 1_000_000).alias("implied_deadline"),
            F.max(F.when(~F.col("acked") & (F.coalesce("qos", F.lit(0)) > 0), F.lit(1)).otherwise(F.lit(0))).alias(
                "any_unacked")]


def _in_message_order(rows):
    """``rows`` with what AFTER_ACK_COLUMNS read of the message's other deliveries: its first ack and the
    delivery before (one ordering serves both; one select, one window operator: see delivery_slots)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(*SUBSCRIBER_MESSAGE).orderBy("seq")
    w = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return rows.select("*", F.min(F.when(F.col("acked"), F.col("next_seq"))).over(w).alias("w_first_ack_seq"),
                       F.lag(F.struct("seq", "t", "packet_id", "conn")).over(ordered).alias("msg_prev"))


def _after_ack_aggregates() -> list:
    """AFTER_ACK_COLUMNS over rows of ``_in_message_order``."""
    from pyspark.sql import functions as F

    after_ack = F.col("seq") > F.col("w_first_ack_seq")
    # The same message again on the connection that already delivered it, and not the resend of that very packet
    # (same id, no ack between): two distinct deliveries within one connection (connections only grow with seq,
    # so the previous delivery is on this connection iff any earlier one is).
    twice = (F.col("msg_prev.conn") == F.col("conn")) & ~F.col("resend")
    return [F.sum(after_ack.cast("int")).alias("n_after_ack"),
            F.min(F.when(after_ack, F.struct("seq", "t", "packet_id", "dup"))).alias("redelivery"),
            F.min(F.when(twice, F.struct("seq", "t", "packet_id", "dup", F.col("msg_prev.t").alias("prev_t"),
                                         F.col("msg_prev.packet_id").alias("prev_packet_id")))).alias("twice")]


def deliveries_per_message(slots, constant: dict[str, str] | None = None):
    """One row per (subscriber, message): first and last delivery, acks, resends, redeliveries after ack
    (``constant``: see ``aggregate``).  Every message's deliveries in order: a small check's way (and a big
    one's with many messages delivered more than once).  The same aggregate as ``message_deliveries``, over rows
    in message order, with AFTER_ACK_COLUMNS: one definition of every column (its buffers hold structs, so
    Spark runs it as a sort aggregate).  Against the first and last delivery taken as whole structs, warm,
    8 alternating pairs: median ratio 0.98 at 10k events, 0.97 at 100k (docs/report.md, session 23)."""
    return message_deliveries(slots, constant, after_ack=True).select(*SUBSCRIBER_MESSAGE, *MESSAGE_COLUMNS)


def message_deliveries(slots, constant: dict[str, str] | None = None, after_ack: bool = False):
    """One row per (subscriber, message) of ``slots``: every column of MESSAGE_COLUMNS but AFTER_ACK_COLUMNS, in
    one pass over the deliveries in any order; with ``after_ack``, those too, each message's deliveries first
    put in order (``_in_message_order``: ``deliveries_per_message``).

    Why: the window that puts each message's deliveries in order and the aggregate over its output (a sort
    aggregate: its buffers hold structs, so it runs row by row, outside the generated code) cost a big check
    twice what this aggregate does (every buffer a primitive: a hash aggregate in generated code; the first and
    last delivery field by field).  At 10 M events nearly every message has one delivery, and for one delivery
    AFTER_ACK_COLUMNS are known without its neighbours (``single_delivery``); ``with_after_ack`` gives the few
    others theirs."""
    from pyspark.sql import functions as F

    firsts = [F.min_by(f, F.col("seq")).alias(f"first__{f}") for f in FIRST_FIELDS]
    lasts = [F.max_by(f, F.col("seq")).alias(f"last__{f}") for f in LAST_FIELDS]
    rows = aggregate(_in_message_order(slots) if after_ack else slots, SUBSCRIBER_MESSAGE, *_message_aggregates(),
                     *firsts, *lasts, *(_after_ack_aggregates() if after_ack else ()), constant=constant)
    return rows.select(
        *[c for c in rows.columns if not c.startswith(("first__", "last__"))],
        F.struct(*[F.col(f"first__{f}").alias(f) for f in FIRST_FIELDS]).alias("first"),
        F.struct(*[F.col(f"last__{f}").alias(f) for f in LAST_FIELDS]).alias("last"))


def single_delivery(column: str, schema):
    """AFTER_ACK_COLUMNS' ``column`` for a message delivered once: no redelivery, nothing twice, and nothing
    delivered after its ack if it was acked (as the sum over its one row gives: null if it never was).
    ``schema``: the types (``after_ack_deliveries(...).schema``)."""
    from pyspark.sql import functions as F

    if column == "n_after_ack":
        return F.when(F.col("first_ack_seq").isNotNull(), F.lit(0)).cast(schema[column].dataType)
    return F.lit(None).cast(schema[column].dataType)


def after_ack_deliveries(rows, constant: dict[str, str] | None = None):
    """AFTER_ACK_COLUMNS per message of ``rows`` (every delivery of each message in it), sorted by the key."""
    return aggregate(_in_message_order(rows), SUBSCRIBER_MESSAGE, *_after_ack_aggregates(), constant=constant)


WITNESS_FIELDS = ("invariant", "sort_key", "witness")


def witness_columns(invariant: str, sort_key, *columns) -> tuple:
    """One rule's (invariant, sort_key, witness JSON) columns, in the order of WITNESS_FIELDS."""
    from pyspark.sql import functions as F

    return F.lit(invariant), sort_key.cast("long"), F.to_json(F.struct(*columns))


def witness(df, invariant: str, sort_key, *columns):
    return df.select("run_id", *[column.alias(name) for name, column
                                 in zip(WITNESS_FIELDS, witness_columns(invariant, sort_key, *columns), strict=True)])


class Rules:
    """Violation rules over one table, evaluated in a single scan: each row emits one (invariant, sort_key,
    witness) per rule it breaks.  ``separate()`` gives one DataFrame per rule, to pin a checker error."""

    def __init__(self, df):
        self.df = df
        self.rules: list[tuple[str, object, object, tuple]] = []

    def add(self, invariant: str, condition, sort_key, *columns) -> None:
        self.rules.append((invariant, condition, sort_key, columns))

    def combined(self):
        """One row per rule a row breaks.  First only which rules (an int per broken rule, exploded: no row for a
        row that breaks none), then the witness of each, over those few rows.

        Why in two steps: the conditions run for every row, the witnesses (a JSON object each) only for the
        rows that break a rule.  Built together, the code of all of them landed in one generated method above
        the JVM's 8000-byte limit for compiling, so the whole per-row loop of the stage ran interpreted (a
        fifth of a 10 M check's CPU samples).  Apart, the witnesses' code is a method of its own, run rarely."""
        from pyspark.sql import functions as F

        broken = F.array_compact(F.array(*[F.when(cond, F.lit(i)) for i, (_, cond, _, _) in enumerate(self.rules)]))
        # explode_outer, not explode: for explode the optimiser infers a filter "size(array) > 0" and pushes it
        # below the projection, which generates every condition's code a second time.
        hits = (self.df.select("*", broken.alias("_broken")).select("*", F.explode_outer("_broken").alias("_rule"))
                .filter(F.col("_rule").isNotNull()))
        per_rule = [witness_columns(inv, key, *cols) for inv, _, key, cols in self.rules]

        def by_rule(field: int):  # CASE _rule WHEN 0 THEN ... : each rule's column, evaluated for its rows only
            chosen = F.when(F.col("_rule") == 0, per_rule[0][field])
            for i, columns in enumerate(per_rule[1:], 1):
                chosen = chosen.when(F.col("_rule") == i, columns[field])
            return chosen

        return hits.select("run_id", *[by_rule(i).alias(name) for i, name in enumerate(WITNESS_FIELDS)])

    def separate(self) -> list[tuple[tuple[str, ...], Any]]:
        """(the rule's invariant, its violations) per rule."""
        return [((inv,), witness(self.df.filter(cond), inv, key, *cols)) for inv, cond, key, cols in self.rules]


@dataclass
class Checks:
    """What ``build`` hands the caller to collect (``collect_all(violations, metrics)``).

    A small check: every violation and metric in those two, one job.  A big check: there, only what reads the
    open messages (the loss rules, the owed metrics); the rest (``delivered_checks``) is collected in the aside
    thread as soon as the per-subscriber table is materialised, ``early`` its future (counts, witnesses,
    metric rows), which the caller merges.  Why: the open messages and the online trims are a chain of small
    jobs with driver work between them, and the final query waited for them with the cores half idle; begun
    beside them, its planning and its stages fill those moments.

    ``parts()`` and ``all_metrics()`` are the fallback when a collect breaks: (the invariants it decides, its
    violations) per rule, to name the rule that broke without running it again, and the metrics; both wait for
    ``early`` first, whose rule groups they include."""
    violations: Any = None
    metrics: Any = None
    lost: Any = None  # the loss rules' violations (in ``violations``)
    early: Future | None = None
    groups: list = field(default_factory=list)  # the rule groups of delivered_checks
    delivery_metrics: Any = None  # a big check's metrics of delivered_checks (collected by ``early``)

    def settle(self) -> None:
        if self.early is not None:
            wait([self.early])

    def parts(self) -> list[tuple[tuple[str, ...], Any]]:
        self.settle()
        return [p for g in self.groups for p in g.separate()] + [(LOSS_INVARIANTS, self.lost)]

    def all_metrics(self):
        self.settle()
        return self.metrics if self.delivery_metrics is None else self.delivery_metrics.unionByName(self.metrics)


def freeze_mode(small: bool) -> str:
    """How ``_freeze`` materialises: "checkpoint" for a small check (a run's history), "persist" for a big one;
    $ORDEAL_CHECKER_FREEZE overrides (the benchmark compares the two side by side)."""
    mode = os.environ.get("ORDEAL_CHECKER_FREEZE") or ("checkpoint" if small else "persist")
    if mode not in ("checkpoint", "persist"):
        raise ValueError(f"$ORDEAL_CHECKER_FREEZE={mode!r}: expected checkpoint or persist")
    return mode


def _freeze(df, cached: list, label: str, mode: str = "persist", constant: dict | None = None, flatten: bool = False,
            counts: dict[str, int] | None = None):
    """Materialise once (memory, spilling to disk), so every later rule and metric reads the result instead of
    recomputing it.  Eagerly (one job): measured, caching lazily inside the one final query made a 10k-event
    check 2-3x slower.

    "checkpoint" (a small check): the result becomes a leaf of every later plan (an eager local checkpoint,
    memory and disk).  A small check's cost is the driver's: every later query re-analyses and re-optimises
    the lineage of what it reads, and matches it against the cache; with leaves that work is gone (measured at
    10k events: the driver thread's CPU 2.7-3.8 s per check instead of 4.6-6.2 s; JVM CPU 6.5-12.8 s
    instead of 14.2-18.0 s).  "persist" (a big check): a plain persist, whose lost block is recomputed from its
    lineage instead of failing the check (a local checkpoint's block lost under load once failed a 10 M check,
    session 2).

    ``constant``: columns with one value in every row (``run_id`` in a one-run check; the run's whole row of the
    runs table for the per-subscriber table), left out of what is stored and put back as literals of their
    type.  Stored, such a column was written, kept and read back per row, and was a real key of every later
    sort and join instead of a literal the optimiser drops from them.

    ``flatten``: each struct column stored as one column per field plus a null flag, rebuilt on read.  Why:
    Spark's cache serializer reads a table as columns only if every column of it is a primitive; one struct,
    string or array makes every read of it build a row per cached row.  The per-subscriber table held the
    offline window (``k``), the run's queue policy and its unpromised fault times, and is read about ten times:
    flattened, with the run's columns as constants, a warm 10 M check took a median 41.8 s against 43.4 s, task
    CPU 60.8 against 64.7 CPU-s (one JVM, alternating; docs/report.md, session 17).

    ``counts``: the names of columns whose non-null values are counted ("rows": every row), filled in with the
    numbers; a persist counts them in its materialising job, which reads every row anyway (a count asked of the
    table later is a job more), a checkpoint in one job after."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    types = {f.name: f.dataType for f in df.schema.fields}
    columns = df.columns
    constant = {name: value for name, value in (constant or {}).items() if name in types}
    structs = [c for c in columns if flatten and c not in constant and isinstance(types[c], T.StructType)]
    if constant or structs:
        df = df.select(*[c for c in columns if c not in constant and c not in structs],
                       *[F.col(c)[f].alias(f"{c}__{f}") for c in structs for f in types[c].fieldNames()],
                       *[F.col(c).isNull().alias(f"{c}__null") for c in structs])
    with timed(f"materialise {label}"):
        if mode == "checkpoint":
            frozen = df.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
            cached.append(frozen)
            if counts is not None:
                counts.update(_counted(frozen, counts))
        else:
            frozen = df.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(frozen)
            if counts is None:
                frozen.count()
            else:
                counts.update(_counted(frozen, counts))
            frozen = _cache_leaf(frozen, cached)
    if not (constant or structs):
        return frozen

    def read_back(c: str):
        if c in constant:
            return F.lit(constant[c]).cast(types[c]).alias(c)
        if c in structs:
            fields = [F.col(f"{c}__{f}").alias(f) for f in types[c].fieldNames()]
            return F.when(~F.col(f"{c}__null"), F.struct(*fields)).alias(c)
        return F.col(c)

    return frozen.select(*[read_back(c) for c in columns])


def _counted(df, columns) -> dict[str, int]:
    """The number of non-null values of each of ``columns`` in ``df`` ("rows": of rows), in one job."""
    from pyspark.sql import functions as F

    return df.agg(*[(F.count(F.lit(1)) if c == "rows" else F.count(c)).alias(c) for c in columns]).first().asDict()


class TempView:
    """A temporary view a Connect check made (``_cache_leaf``): in ``cached`` beside its table, dropped with it."""

    def __init__(self, session, name: str):
        self.session, self.name = session, name

    def unpersist(self) -> None:
        self.session.catalog.dropTempView(self.name)


def _cache_leaf(frozen, cached: list):
    """A persisted table as a leaf: in a classic session the cache's own relation, which every later plan scans
    as it would have scanned the cache (columnar, with the table's partitioning and order), without the
    lineage beneath it; on Spark Connect a temporary view of it (dropped with the table, ``TempView``).

    Why: a classic session analyses each DataFrame step when it is made, over the whole plan beneath it,
    and the plan beneath every rule held the lineage of five persisted tables.  Building the rules and
    metrics took 6-7 s of the driver's time at 10 M events, with every task slot idle (the stage timeline
    shows the gap).  The cache's relation keeps the lineage for itself: a lost block is still recomputed.
    A Connect client has no handle on the server's relation, and every query it sends carries the whole plan
    beneath it, which the server resolves again.  A view is resolved once, when it is made; a query names it.
    Measured on a warm server (docs/report.md, session 24): one-run checks with the big plan of catalog
    histories (a few hundred events), 23 alternating pairs, view/lineage median 0.81 (0.66-1.05); at 10 M
    events, 3 pairs, 0.81-1.03: within the noise.  The gain is a small big check's fixed cost."""
    if os.environ.get("ORDEAL_CHECKER_LEAVES") == "0":
        return frozen
    jdf = getattr(frozen, "_jdf", None)
    session = frozen.sparkSession
    if jdf is None:
        view = TempView(session, f"ordeal_frozen_{uuid.uuid4().hex}")
        frozen.createOrReplaceTempView(view.name)
        cached.append(view)
        return session.table(view.name)
    from pyspark.sql import DataFrame

    found = session._jsparkSession.sharedState().cacheManager().lookupCachedData(jdf)
    if found.isEmpty():  # not cached after all (a persist the cache manager refused): the lineage it is
        return frozen
    relation = found.get().cachedRepresentation()
    return DataFrame(session._jvm.org.apache.spark.sql.classic.Dataset.ofRows(session._jsparkSession, relation),
                     session)


def build(spark, runs: list[RunSpec], events, prepare: Callable[[], tuple[dict[str, Timeline], dict[str, list[str]]]],
          cached: list, small: bool = False, aside: ThreadPoolExecutor | None = None) -> Checks:
    """Every Spark-side violation as (run_id, invariant, sort_key, witness JSON), plus metric rows (``Checks``).
    Every DataFrame it materialises is appended to ``cached``; the caller unpersists them once ``aside`` is done:
    the caller's one-thread executor for the work ``build`` begins beside its own (a big check's ``Checks.early``
    runs on there after ``build`` returns; without one, ``build`` uses its own and waits).  ``prepare()`` gives the
    runs' timelines and published topics (the caller's scans of the small rows); it runs while the publishes,
    which need neither, are materialised.

    Five tables are materialised: the publishes (one row per message), the deliveries with their packet-id
    slots (moved once, by subscriber), one row per delivered (subscriber, message), one narrow row per
    (subscriber, message) that matched one of the subscriber's filters, and the never-delivered candidates
    among those (open_messages: few).  The fourth serves the owed candidates and the publish lookup of the
    per-message rules alike; none of them moves the deliveries again.  A big check materialises up to three
    more, as small as what is out of the ordinary: the stream neighbours of the reordered publishers' messages,
    the queue values of the queued messages, each merged back into its table by the sorted join key, and what
    the messages delivered more than once tell in order (with_after_ack), looked up by broadcast."""
    if aside is not None:
        return _build(spark, runs, events, prepare, cached, small, aside)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ordeal-check") as own:
        return _build(spark, runs, events, prepare, cached, small, own)


def _build(spark, runs, events, prepare, cached, small, aside):
    """``build``, with ``aside``: one thread that materialises a table while this one goes on to the next.

    Why two jobs at once: each job leaves cores idle while it is planned and submitted, between its stages,
    and at its last tasks; and the driver builds the side tables with both cores idle.  With a second job
    submitted, Spark's scheduler gives those moments to its tasks (the first job's tasks still go first).
    Only tables that do not read each other run side by side: the publishes beside the caller's scans of the
    small rows, the side tables and the packet-id slots; the stream neighbours beside the per-subscriber table;
    in a big check, the collect of every rule that reads no open message (``Checks.early``) beside the open
    messages, the online trims and the loss rules' collect.  A failure in the
    aside thread is raised by ``result()``, here or in the caller (``Checks.early``)."""
    from pyspark.sql import functions as F

    mode = freeze_mode(small)
    checks = Checks()
    constant = {"run_id": runs[0].run_id} if len(runs) == 1 else {}

    def freeze(df, label: str, run: dict | None = None, counts: dict[str, int] | None = None):
        """``run``: the one run's row of the runs table, stored as constants, the structs flattened; ``counts``:
        filled in by the materialising job (_freeze)."""
        return _freeze(df, cached, label, mode, {**constant, **(run or {})}, flatten=bool(run), counts=counts)

    events = encode_events(events)
    publishing = aside.submit(freeze, publishes(events, constant), "publishes")
    timelines, topics = prepare()
    with timed("side tables"):
        runs_df, clients_df, match_df = side_tables(spark, runs, timelines, topics)
    runs_b, clients_b, match_b = F.broadcast(runs_df), F.broadcast(clients_df), F.broadcast(match_df)
    by = subscriber_partitioning(runs)
    slots = freeze(delivery_slots(events, clients_df, by).join(runs_b.select("run_id", "t_origin", "tol_us"), "run_id"),
                   "slots")
    pub = publishing.result()
    deliveries = slots.drop("t_origin", "tol_us")
    claims = subscriber_claims(pub, slots, match_b, by)
    # Two ways to the same two tables.  A big check sorts and windows only the rows that need it (the reordered
    # publishers' messages, the queued ones) and merges the few results back, unmaterialised; a small check
    # (a run's history) windows every row and materialises one table each: its cost is the driver's, per job
    # and per join, not the rows'.
    if small:
        per_message = deliveries_per_message(deliveries, constant)
        # Sorted by the join key within each subscriber's partition, so every later join with it only merges.
        dsm = freeze(with_stream_neighbour(per_message).sortWithinPartitions(*SUBSCRIBER_MESSAGE), "per_message")
        per_message = dsm
        table = freeze(per_subscriber_message(subscriber_rows(claims, dsm, runs_b, clients_b)), "per_subscriber_message")
    else:
        # Counted as they are materialised: a claimed delivered message for each delivered one means that no
        # delivery needs a lookup in the publishes (delivered_messages), and two count jobs less.
        delivered = {"rows": 0}
        per_message = with_after_ack(
            freeze(message_deliveries(deliveries, constant).sortWithinPartitions(*SUBSCRIBER_MESSAGE), "per_message",
                   counts=delivered), deliveries, constant, freeze)
        if per_message is None:  # many messages delivered more than once: every message's deliveries in order
            # (the first table stays cached, unread, until the check releases it: memory, not time)
            per_message = freeze(deliveries_per_message(deliveries, constant).sortWithinPartitions(*SUBSCRIBER_MESSAGE),
                                 "per_message", counts=delivered)
        neighbouring = aside.submit(freeze, stream_neighbours(per_message), "stream neighbours")
        claimed = {"n_deliveries": 0}
        rows = freeze(subscriber_rows(claims, per_message, runs_b, clients_b), "per_subscriber_message",
                      runs_df.drop("fault_times", "fault_spans").first().asDict() if constant else None, claimed)
        table = per_subscriber_message(rows, freeze(backlog_queues(rows), "backlog queues"))
        dsm = per_message.join(neighbouring.result(), list(SUBSCRIBER_MESSAGE), "left")
        # Every rule and metric that reads no open message is collected in the aside thread, begun now: its
        # planning and its stages fill the moments the open messages and the online trims (small jobs, driver
        # work between them) leave the cores idle, instead of waiting for them (Checks).
        checks.early = aside.submit(_early_checks, checks, table, dsm, pub, slots, runs_b, clients_b, match_b,
                                    claimed["n_deliveries"] == delivered["rows"])
    gaps = freeze(open_messages(table, clients_b), "open messages")
    with timed("online trims"):
        trimmed = online_trims(gaps, table).collect()
    if trimmed:  # few rows (never-delivered messages), and none in a run that lost nothing
        keys = local_frame(spark, [(r["run_id"], r["client"], r["publisher"], r["pub_seq"], int(r["peak"]))
                                   for r in trimmed], "run_id string, client long, publisher long, "
                                                      "pub_seq long, trim_peak long")
        gaps = gaps.join(F.broadcast(keys), ["run_id", "client", "publisher", "pub_seq"], "left")
        online = F.col("trim_peak").isNotNull()
        gaps = freeze(gaps.withColumn("legally_trimmed", F.col("legally_trimmed") | online)
                      .withColumn("owed", F.col("owed") & ~online).drop("trim_peak"), "online trims")
    checks.lost, checks.metrics = owed_checks(table, gaps)
    checks.violations = checks.lost
    if small:
        violations, metrics, checks.groups = delivered_checks(table, dsm, pub, slots, runs_b, clients_b, match_b,
                                                              all_claimed=False)
        checks.violations, checks.metrics = violations.unionByName(checks.lost), metrics.unionByName(checks.metrics)
    return checks


def with_after_ack(per_message, deliveries, constant: dict[str, str], freeze):
    """A big check's materialised ``message_deliveries`` with AFTER_ACK_COLUMNS, in its order and partitioning, or
    None if more than MULTI_DELIVERY_BROADCAST_ROWS messages were delivered more than once.  A message delivered
    once gets ``single_delivery``'s values; the others get theirs from their own deliveries in order
    (``after_ack_deliveries``: materialised, few), looked up by broadcast.  ``deliveries``: the delivery slots;
    ``freeze``: the build's."""
    from pyspark.sql import functions as F

    types = after_ack_deliveries(deliveries, constant).schema  # analysed only: the columns' types
    once = {c: single_delivery(c, types) for c in AFTER_ACK_COLUMNS}
    multi = per_message.filter(F.col("n_deliveries") > 1).select(*SUBSCRIBER_MESSAGE)
    with timed("messages delivered more than once"):
        n_multi = multi.count()
    if n_multi > MULTI_DELIVERY_BROADCAST_ROWS:
        return None
    if n_multi == 0:
        return per_message.select(*SUBSCRIBER_MESSAGE, *[once[c].alias(c) if c in once else c for c in MESSAGE_COLUMNS])
    rows = deliveries.join(F.broadcast(multi), list(SUBSCRIBER_MESSAGE), "left_semi")
    after_ack = freeze(after_ack_deliveries(rows, constant), "messages delivered more than once")
    return per_message.join(F.broadcast(after_ack), list(SUBSCRIBER_MESSAGE), "left").select(
        *SUBSCRIBER_MESSAGE, *[F.coalesce(c, once[c]).alias(c) if c in once else c for c in MESSAGE_COLUMNS])


def _early_checks(checks, table, dsm, pub, slots, runs_b, clients_b, match_b, all_claimed: bool):
    """A big check's aside work: ``delivered_checks``, its rule groups and metrics kept in ``checks`` (for the
    caller's fallback), collected (``collect_all``)."""
    violations, metrics, checks.groups = delivered_checks(table, dsm, pub, slots, runs_b, clients_b, match_b,
                                                          all_claimed)
    checks.delivery_metrics = metrics
    with timed("violations + metrics of the deliveries"):
        return collect_all(violations, metrics)


def delivered_checks(table, dsm, pub, slots, runs_b, clients_b, match_b, all_claimed: bool):
    """Every rule and metric that reads no open message (open_messages): the packet-id slot rules, the
    per-message rules, the black-box limit, the stored-id sequence, and the publish and delivery metrics.
    (violations, metrics, the rule groups.)"""
    from pyspark.sql import functions as F

    with timed("publish lookup of deliveries"):
        dp, unmatched = delivered_messages(table, dsm, pub, runs_b, all_claimed)
    qos_pos = F.coalesce("qos", F.lit(0)) > 0
    tol = F.col("tol_us")

    # Per delivery: the packet-id slot rules.
    slot_rules = Rules(slots)
    rel = F.col("t") - F.col("t_origin")
    client, publisher = witness_name("client"), witness_name("publisher")
    ident = [client, publisher, "pub_seq", "packet_id", "dup", "qos", "t", "seq", witness_name("node"), "t_origin"]
    invalid = qos_pos & (F.col("packet_id").isNull() | (F.col("packet_id") <= 0) | (F.col("packet_id") > 65535))
    slot_rules.add("order.packet_id_invalid", invalid, rel, *ident)
    slot_rules.add("order.packet_id_reused", F.col("reused"), rel, *ident, witness_name("prev_publisher"),
                   "prev_pub_seq", "prev_t")
    slot_rules.add("order.dup_flag", F.col("resend") & ~F.coalesce("dup", F.lit(False)), rel, *ident,
                   F.lit("resend without DUP").alias("problem"))
    # MQTT 5 §4.4 [MQTT-4.4.0-1]: unacknowledged PUBLISH packets are resent only on a reconnect (Clean Start 0,
    # session present), never within the connection they were sent on.  MQTT 3.1.1 §4.4 only says when a
    # resend is required, it forbids none: its connections are not judged.
    slot_rules.add("order.resend_within_connection",
                   F.col("resend") & (F.col("prev_conn") == F.col("conn")) & (F.col("protocol") == 5), rel, *ident,
                   "prev_t", "protocol")

    # Per (subscriber, message), with the publish it claims to be and its place in the stream.  The per-run and
    # per-client arrays are looked up here, by broadcast, rather than stored with every materialised row.
    dr = (dp.join(runs_b.select("run_id", "fault_times", "fault_spans"), "run_id")
          .join(match_b, ["run_id", "topic"], "left")
          .join(clients_b.select("run_id", "client", "disconnects", "connects", "new_sessions"), ["run_id", "client"],
                "left")
          .join(clients_b.select("run_id", F.col("client").alias("publisher"),
                                 F.col("disconnects").alias("pub_disconnects")), ["run_id", "publisher"], "left"))
    phantom_reason = (F.when(F.col("publisher").isNull() | F.col("pub_seq").isNull(), F.lit("payload identity unreadable"))
                      .when(F.col("n_invoke").isNull() | (F.col("n_invoke") == 0), F.lit("never published"))
                      .when((F.col("min_hash") != F.col("pub_hash")) | (F.col("max_hash") != F.col("pub_hash")),
                            F.lit("body hash differs from the published one")))
    dr = dr.select("*", phantom_reason.alias("phantom_reason"), expiry_deadline().alias("deadline"))
    t_first = F.col("first.t")
    rel_first = t_first - F.col("t_origin")
    base = [client, publisher, "pub_seq", F.col("first.t").alias("t"), F.col("first.packet_id").alias("packet_id"),
            witness_name("first.node", "node"), "t_invoke", "t_ack", "t_origin", witness_name("topic")]
    real = F.col("phantom_reason").isNull()
    msg_rules = Rules(dr)
    # DUP = 1 on the first *observed* receipt is legal when the receiving connection was established after the
    # publish: the broker may have sent it on an older connection the client had already lost (a disconnect the
    # broker never saw, e.g. during a partition) and resends it on the new one (MQTT 3.1.1 §4.4 / MQTT 5 §4.4).
    # Invoked after the current connection was established, it cannot have been sent before: DUP is illegal.
    connected_since_publish = sql("exists(coalesce(connects, array()), c -> c.t > t_invoke AND c.seq < first.seq)")
    msg_rules.add("order.dup_flag", F.coalesce(F.col("first.dup"), F.lit(False)) & qos_pos & ~connected_since_publish,
                  rel_first, *base,
                  F.lit("DUP on a first delivery on a connection established before the publish").alias("problem"))
    msg_rules.add("durability.phantom", ~real, rel_first, *base, "phantom_reason",
                  *[witness_name(h) for h in ("min_hash", "max_hash", "pub_hash")])
    msg_rules.add("durability.delivered_after_failed_publish", real & F.col("t_fail").isNotNull() & F.col("t_ack").isNull(),
                  rel_first, *base, "t_fail")
    subscribed = sql("exists(coalesce(subs, array()), x -> x.client = client AND x.t_from <= first.t + tol_us"
                     " AND (x.t_to IS NULL OR x.t_to >= t_invoke - tol_us))")
    msg_rules.add("durability.unsubscribed_delivery", real & ~subscribed, rel_first, *base)
    msg_rules.add("expiry.delivered_expired", real & (F.col("t_last") > F.col("deadline") + tol),
                  F.col("t_last") - F.col("t_origin"), *base, "t_last", "expiry_s", "deadline", "tol_us")
    # Remaining expiry is whole seconds (rounding may add up to 1 s): t + remaining must not pass the deadline.
    not_reduced = F.col("expiry_s").isNotNull() & (F.col("implied_deadline") > F.col("deadline") + tol + 1_000_000)
    msg_rules.add("expiry.remaining_not_reduced", real & not_reduced, rel_first, *base, "expiry_s", "implied_deadline",
                  "deadline")
    # Redelivered after the subscriber acked; legal only if the connection died within the tolerance after
    # the ack (the PUBACK may never have left the socket).
    ack_maybe_lost = sql("exists(coalesce(disconnects, array()), d -> d.seq > first_ack_seq AND d.seq < redelivery.seq"
                         " AND d.t - first_ack_t < tol_us)")
    redelivered = real & (F.col("n_after_ack") > 0) & ~ack_maybe_lost
    dup_cols = [*base, "first_ack_t", F.col("redelivery.t").alias("t_redelivery"),
                F.col("redelivery.packet_id").alias("redelivery_packet_id"), "n_after_ack"]
    t_re = F.col("redelivery.t") - F.col("t_origin")
    msg_rules.add("duplicates.redelivered_after_ack", redelivered & (F.coalesce("qos", F.lit(0)) < 2), t_re, *dup_cols)
    msg_rules.add("duplicates.qos2", redelivered & (F.col("qos") == 2), t_re, *dup_cols)
    # The same message twice within one connection (not the resend of one packet): a backlog sent twice.  Only a
    # fault around the message's life (a save repeated after a failure, a rolled-back removal) or a publisher
    # that may have sent it twice (published more than once, or disconnected before its ack) excuses it.
    t_twice = F.col("twice.t")
    fault_near = sql("exists(coalesce(fault_spans, array()), x -> x.s <= twice.t"
                     " AND x.e + slack_us >= t_invoke - slack_us)")
    pub_resent = (F.coalesce("n_invoke", F.lit(0)) > 1) | sql(
        f"exists(coalesce(pub_disconnects, array()), d -> d.t >= t_invoke AND d.t <= coalesce(t_ack, t_fail, {NEVER}L))")
    msg_rules.add("duplicates.backlog_twice_in_connection", real & F.col("twice").isNotNull() & ~fault_near & ~pub_resent,
                  t_twice - F.col("t_origin"), *base, F.col("twice.t").alias("t_again"),
                  F.col("twice.packet_id").alias("again_packet_id"), F.col("twice.dup").alias("again_dup"),
                  F.col("twice.prev_t").alias("prev_t"), F.col("twice.prev_packet_id").alias("prev_packet_id"),
                  "n_deliveries")
    # A discarded session's message reaching a later session ([MQTT-3.1.2-4]).  The broker routes a message to
    # the subscriptions that exist when its pipeline gets to it, so one published shortly before a new session
    # subscribed may legally reach it; but one acknowledged more than the pipeline slack (+ the clock tolerance)
    # before the connect that began the receiving session was routed before that session existed: to the
    # session it discarded (or an older one), never to this one.  Judged on the last delivery (the latest
    # session that got it).  Not judged where the pipeline may have been held up longer (a fault or node event
    # between the publish and the delivery) or where the publisher may have sent it again later (published more
    # than once, or disconnected before its ack).
    t_last_d = F.col("last.t")
    session = sql("element_at(filter(coalesce(new_sessions, array()), x -> x.seq < last.seq), -1)")
    held = sql("element_at(filter(coalesce(new_sessions, array()), x -> x.t <= t_ack), -1)")
    discarded_by = sql("element_at(filter(coalesce(new_sessions, array()), x -> x.t > t_ack), 1)")
    fault_in_life = sql("exists(coalesce(fault_spans, array()), x -> x.s <= last.t AND x.e + slack_us >= t_invoke)")
    from_discarded = (real & F.col("t_ack").isNotNull() & session.isNotNull()
                      & (F.col("t_ack") + F.col("slack_us") + tol < session["t"]) & ~fault_in_life & ~pub_resent)
    msg_rules.add("durability.discarded_session_delivery", from_discarded, t_last_d - F.col("t_origin"),
                  client, publisher, "pub_seq", t_last_d.alias("t"), F.col("last.packet_id").alias("packet_id"),
                  F.col("last.dup").alias("dup"), witness_name("last.node", "node"), "t_invoke", "t_ack", "t_origin",
                  witness_name("topic"), session["t"].alias("t_session"), session["why"].alias("session_why"),
                  session["clean_start"].alias("session_clean_start"), held["t"].alias("t_held_since"),
                  discarded_by["t"].alias("t_discarded"), discarded_by["why"].alias("discarded_why"),
                  discarded_by["clean_start"].alias("discarded_clean_start"), "n_deliveries", "slack_us", "tol_us")
    msg_rules.add("liveness.stuck_inflight", real & (F.col("any_unacked") == 1) & F.col("first_ack_seq").isNull(),
                  rel_first, *base)
    # Order: first deliveries of each (subscriber, publisher, topic) stream by pub_seq.
    msg_rules.add("order.out_of_order", F.col("pub_seq") < F.col("prev_max.pub_seq"), rel_first, *base,
                  F.col("prev_max.pub_seq").alias("after_pub_seq"), F.col("prev_max.t").alias("after_t"),
                  F.col("prev_max.packet_id").alias("after_packet_id"),
                  # A wrap only where one session's stored counter went 65535 -> 1 between the two; ids that restart
                  # with a new session, or a clean session's per-connection ids, did not wrap.
                  (F.col("first.stored") & F.col("prev_max.stored") & (F.col("first.epoch") == F.col("prev_max.epoch"))
                   & (F.col("first.packet_id") < F.col("prev_max.packet_id"))).alias("across_wrap"),
                  (F.col("first.conn") != F.col("prev_max.conn")).alias("across_reconnect"),
                  (F.col("first.epoch") != F.col("prev_max.epoch")).alias("across_new_session"),
                  sql("exists(fault_times, x -> x >= prev_max.t AND x <= first.t)").alias("across_failover"))

    cand = table.filter(F.col("is_cand"))
    # Black box: more of one settled backlog (acked before reconnect - slack) delivered than the limit allows.
    over = cand.filter(F.col("in_backlog") & (F.col("rank") == 1))
    over_rules = Rules(over)
    over_rules.add("limits.over_limit", F.col("n_settled_delivered") > F.col("limit"), F.col("k.c") - F.col("t_origin"),
                   client, F.col("k.c").alias("t"), F.col("k.d").alias("t_offline"),
                   F.col("n_settled_delivered").alias("kept"), "limit", "n_backlog", "n_settled",
                   F.col("n_pipeline_w").alias("n_in_pipeline"), "slack_us", "t_origin",
                   F.lit("black box: delivered after reconnect").alias("source"))

    seq_rules = Rules(packet_id_gaps(slots, table, clients_b, runs_b))
    seq_rules.add("whitebox.packet_id_sequence", F.col("unexplained"), F.col("t") - F.col("t_origin"),
                  client, "t", "seq", "packet_id", "prev_packet_id", "prev_t", publisher, "pub_seq", "epoch", "gap",
                  "skipped_total", "undelivered", "t_session", "t_origin")

    groups = [slot_rules, msg_rules, over_rules, seq_rules]
    # The delivery metrics read what the per-subscriber table already holds of each claimed delivered message
    # (a scan of its cache), not the per-message join the rules read: that join would run a second time.
    metric_cols = ("run_id", "t_first", "t_invoke", "n_deliveries", "n_resends", "n_after_ack", "t_origin", "bucket_us")
    delivered = table.filter(F.col("n_deliveries").isNotNull()).select(*metric_cols)
    if unmatched is not None:
        delivered = delivered.unionByName(unmatched.select(*metric_cols))
    return (reduce(lambda a, b: a.unionByName(b), [g.combined() for g in groups]),
            _delivery_metrics(pub, slots, delivered, runs_b), groups)


def owed_checks(table, gaps):
    """The loss rules' violations (each owed, never-delivered message of ``gaps``, open_messages, under its
    cause) and the owed metrics: (violations, metrics)."""
    from pyspark.sql import functions as F

    client, publisher = witness_name("client"), witness_name("publisher")
    lost = gaps.filter(F.col("owed"))
    carried_into = F.col("carried_into").isNotNull()
    loss_cols = [client, publisher, "pub_seq", witness_name("topic"), "t_invoke", "t_ack", "t_origin", "expiry_s",
                 "in_backlog",
                 F.coalesce("carried_into.d", "k.d").alias("t_offline"), F.coalesce("carried_into.c", "k.c").alias("t_reconnect"),
                 F.when(carried_into, F.col("k.d")).alias("carried_from_offline"),
                 F.when(carried_into, F.col("k.c")).alias("carried_from_reconnect"),
                 F.when(~carried_into, F.col("rank")).alias("rank"),
                 F.coalesce("carried_into.n_backlog", "n_backlog").alias("n_backlog"), "limit",
                 "prev_delivered", "next_delivered", "position", witness_name("pub_node"), "policy"]
    lost_w = lost.select("run_id", F.col("cause").alias("invariant"),
                         (F.col("t_invoke") - F.col("t_origin")).cast("long").alias("sort_key"),
                         F.to_json(F.struct(*loss_cols)).alias("witness"))
    # Every candidate with what it owes: the delivered ones from the table, the others as open_messages settled.
    owing = ("run_id", "owed", "legally_trimmed", "expired_legally", "undeliverable", "delivered",
             "t_invoke", "t_first", "t_origin", "bucket_us")
    settled = table.filter(F.col("is_cand") & F.col("delivered")).select(*owing).unionByName(gaps.select(*owing))
    return lost_w, _owed_metrics(settled, lost)


def packet_id_gaps(slots, table, clients_b, runs_b):
    """White box (the reference broker): within one persistent session the stored ids go 1, 2, ... 65535, 1, ...
    (lua/save.lua), and the session's messages are sent in that order.  Per session, one row per delivery that
    took a new id after a gap, with the gap and whether the history explains it.

    What legitimately makes a gap: a stored message that never reached the subscriber in this session (trimmed
    to the limit, expired, too large for the client, or lost, which its own rule reports) took its id.  Why the
    count is cumulative: each such message explains one skipped id, once.  A gap while a fault was around may
    also be a save repeated after a failure whose first copy was trimmed: not judged.  The first session of a
    client is not judged at its start (a scenario may preset the counter); a later one starts at 1 (a new
    session discards the old one's counter)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # A preset of the counter (the harness's, recorded as a session_snapshot with when = "preset") starts a new
    # run of ids within the session: judged like a session's start, whose first id is not judged.
    session = ["run_id", "client", "epoch", "segment"]
    by_seq = Window.partitionBy(*session).orderBy("seq")
    valid = (F.col("packet_id") >= 1) & (F.col("packet_id") <= 65535) & ~F.coalesce("reused", F.lit(False))
    presets = F.broadcast(clients_b.select("run_id", "client", "preset_seqs", "fresh_seqs"))
    since = "coalesce(element_at(fresh_seqs, greatest(epoch, 1)), 0)"
    ids = (slots.filter(F.col("new_id")).join(presets, ["run_id", "client"], "left")
           .withColumn("segment", sql(f"size(filter(coalesce(preset_seqs, array()), x -> x < seq AND x > {since}))"))
           .select(*session, "seq", "t", "packet_id", "publisher", "pub_seq", valid.alias("valid"), "t_origin"))
    # Why not the receive order: a QoS 2 message is recorded when the client library hands it over (at PUBREL),
    # after QoS 1 messages sent later with higher ids.  So the ids are put in the order the broker handed them
    # out: each one's place is laps * 65535 + id, a lap counted where, in receive order, the id drops (a wrap) or
    # climbs back (a late one from before the wrap) by more than half the space.
    last_valid = F.last(F.when(F.col("valid"), F.col("packet_id")), ignorenulls=True).over(
        by_seq.rowsBetween(Window.unboundedPreceding, -1))
    ids = ids.select("*", last_valid.alias("last_valid"), F.lag("valid").over(by_seq).alias("after_valid"))
    step = (F.when(F.col("packet_id") < F.col("last_valid") - 32767, F.lit(1))
            .when(F.col("packet_id") > F.col("last_valid") + 32767, F.lit(-1)).otherwise(F.lit(0)))
    ids = ids.select("*", F.sum(F.when(F.col("valid"), step).otherwise(F.lit(0))).over(
        by_seq.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias("lap"))
    # Why an invalid or reused id (and the one received right after it) is not judged: its own rule reports it.
    ids = ids.filter(F.col("valid")).select("*", (F.col("lap") * 65535 + F.col("packet_id")).alias("pos"))
    order = Window.partitionBy(*session).orderBy("pos", "seq")
    prev = F.lag(F.struct("packet_id", "t", "pos")).over(order)
    ids = ids.select("*", prev.alias("prev"))
    gap = (F.when(F.col("after_valid") == F.lit(False), F.lit(None))
           .when(F.col("prev").isNull(), F.when((F.col("epoch") > 1) & (F.col("segment") == 0), F.col("packet_id") - 1))
           .otherwise(F.col("pos") - F.col("prev.pos") - 1))
    gaps = ids.select("*", gap.alias("gap"), F.max("t").over(order.rowsBetween(
        Window.unboundedPreceding, Window.currentRow)).alias("t_reach")).filter(F.col("gap") > 0)
    # When this session started (its fresh connect), from the broadcast client table.
    started = sql("element_at(filter(coalesce(connects, array()), c -> c.seq = element_at(fresh_seqs, epoch)), 1)")["t"]
    gaps = (gaps.join(clients_b.select("run_id", "client", "connects", "fresh_seqs"), ["run_id", "client"], "left")
            .select("*", started.alias("t_session")).drop("connects", "fresh_seqs")
            .join(runs_b.select("run_id", "slack_us", "fault_spans"), "run_id"))
    # The messages that may have taken an id without a delivery: the subscriber's never-delivered QoS > 0
    # claims (any message on a topic its filters match), published since the session began, before the delivery.
    # Why one array per subscriber, looked up from each gap: the gaps are then computed once (joined the other
    # way, broadcast and joined back, their two windows over every delivery ran twice).
    missing = (table.filter(~F.col("delivered") & (F.coalesce("pub_qos", F.lit(0)) > 0))
               .groupBy("run_id", "client").agg(F.collect_list("t_invoke").alias("missing")))
    gaps = gaps.join(F.broadcast(missing), ["run_id", "client"], "left").select(
        "*", sql("size(filter(coalesce(missing, array()), x -> x < t_reach"
                 " AND (t_session IS NULL OR x >= t_session - slack_us)))").alias("undelivered")
    ).drop("missing")
    t_from = "least(coalesce(prev.t, t_session, t), t)"
    faulted = sql(f"exists(coalesce(fault_spans, array()), x -> x.s <= t_reach AND x.e + slack_us >= {t_from} - slack_us)")
    judged = F.when(faulted, F.lit(0)).otherwise(F.col("gap"))
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    gaps = gaps.select("*", judged.alias("judged"), F.sum(judged).over(running).alias("skipped_total"))
    deficit = F.col("skipped_total") - F.col("undelivered")
    # Flagged where the shortfall reaches a new high: each unexplained skip once, not every gap after it.
    before = F.max(deficit).over(order.rowsBetween(Window.unboundedPreceding, -1))
    return gaps.select("*", F.col("prev.packet_id").alias("prev_packet_id"), F.col("prev.t").alias("prev_t"),
                       ((F.col("judged") > 0) & (deficit > F.greatest(F.coalesce(before, F.lit(0)), F.lit(0))))
                       .alias("unexplained"))


def expiry_deadline():
    """When a message expires: its MQTT 5 expiry interval after the publish, else the broker's default TTL."""
    from pyspark.sql import functions as F

    return F.col("t_invoke") + F.coalesce(F.col("expiry_s") * 1_000_000, F.col("ttl_us"))


def stream_neighbours(per_message):
    """(subscriber, message, ``prev_max``) for the delivered messages whose publisher's messages did not reach the
    subscriber in publish order, sorted by the join key; every other delivered message has no ``prev_max``.

    Why only those: the neighbour takes a sort of every delivered message by first delivery, and the order rule
    can flag no message of a publisher whose first deliveries came in ``pub_seq`` order (each message's
    predecessors in its streams are then all older).  Whether they did is read from a narrow projection in the
    order the per-message table already has (by ``pub_seq``): no wide row is sorted or copied."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_pub = Window.partitionBy("run_id", "client", "publisher").orderBy("pub_seq")
    steps = per_message.select("run_id", "client", "publisher", "pub_seq", F.col("first.seq").alias("first_seq"))
    # A step back, or an identity without a sequence (never flagged itself, but judged with its stream as before).
    back = F.coalesce(F.lag("first_seq").over(by_pub) > F.col("first_seq"), F.lit(False)) | F.col("pub_seq").isNull()
    stream = ("run_id", "client", "publisher")
    reordered = steps.select("*", back.alias("back")).filter(F.col("back")).select(*[F.col(c).alias(f"r_{c}") for c in stream]).distinct()
    streams = per_message.join(F.broadcast(reordered), reduce(
        lambda a, b: a & b, [F.col(c).eqNullSafe(F.col(f"r_{c}")) for c in stream]), "left_semi")
    return with_stream_neighbour(streams).select(*SUBSCRIBER_MESSAGE, "prev_max").sortWithinPartitions(
        *SUBSCRIBER_MESSAGE)


def with_stream_neighbour(dsm):
    """Per (subscriber, message): the highest message of the same (publisher, topic, QoS) stream delivered first
    before it (the order rule compares against it).  Over every delivered message, phantoms included.
    Why per QoS: an Ordered Topic's order holds "for the same Topic and QoS" ([MQTT-4.6.0-6], 3.1.1 and 5);
    a QoS 2 message may legally arrive after newer QoS 1 ones of its publisher (its handshake is longer, and
    the client library hands it over only at PUBREL), which session-mix showed on the correct broker."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    stream = Window.partitionBy("run_id", "client", "publisher", "first.topic", "first.qos").orderBy(
        "first.seq").rowsBetween(
        Window.unboundedPreceding, -1)
    prev_max = F.max(F.struct(F.col("pub_seq"), F.col("first.packet_id").alias("packet_id"),
                              F.col("first.conn").alias("conn"), F.col("first.t").alias("t"),
                              F.col("first.epoch").alias("epoch"), F.col("first.stored").alias("stored"))).over(stream)
    return dsm.select("*", prev_max.alias("prev_max"))


def subscriber_claims(pub, slots, match_b, by: tuple[str, ...]):
    """One row per (message, client whose filters match its topic), partitioned by client: the publish and
    whether the client was owed it (``is_cand``: a persistent subscription held at publish time, and a publish
    that was acked, or indeterminate and then seen by someone)."""
    from pyspark.sql import functions as F

    key = ["run_id", "publisher", "pub_seq"]
    published = pub.filter(F.col("n_invoke") > 0)
    qos_published = F.coalesce("pub_qos", F.lit(0)) > 0
    # Indeterminate publishes are few: find which were seen without moving every delivery.
    indeterminate = published.filter(qos_published & F.col("t_ack").isNull() & F.col("t_indet").isNotNull())
    seen = (slots.select(*key).join(F.broadcast(indeterminate.select(*key)), key, "left_semi").distinct()
            .select(*key, F.lit(True).alias("seen_indeterminate")))
    eligible = qos_published & (F.col("t_ack").isNotNull()
                                | (F.col("t_indet").isNotNull() & F.coalesce("seen_indeterminate", F.lit(False))))
    # Held by this client at publish time: one of its subscriptions matching the topic, persistent, granted QoS > 0.
    held = sql("exists(subs, x -> x.client = client AND x.persistent AND x.granted > 0 AND x.t_from < t_invoke"
               " AND (x.t_to IS NULL OR t_invoke < x.t_to))")
    claims = (published.join(match_b, ["run_id", "topic"])
              .select("*", F.explode("clients").alias("client")).drop("clients")
              .join(F.broadcast(seen), key, "left"))
    claims = claims.select("*", (eligible & F.coalesce(held, F.lit(False))).alias("is_cand"))
    return claims.drop("subs", "seen_indeterminate").repartition(*by)  # as the deliveries


def subscriber_rows(claims, dsm, runs_b, clients_b):
    """Claims joined to what each subscriber got (co-partitioned by subscriber: no rows move): per (subscriber,
    message), whether it was delivered, the offline window it was queued in (``k``, ``in_backlog``) and what
    every row can tell alone (expired, undeliverable, settled).  Sorted by the join key, as the join leaves it."""
    from pyspark.sql import functions as F

    got = dsm.select(*SUBSCRIBER_MESSAGE, "n_deliveries", F.col("first.t").alias("t_first"), "t_last", "first_ack_t",
                     "n_resends", "n_after_ack")  # the last two for the delivery metrics only
    t = claims.join(got, list(SUBSCRIBER_MESSAGE), "left")
    t = t.join(runs_b.drop("fault_times", "fault_spans"), "run_id").join(clients_b.select("run_id", "client", "offline"),
                                                          ["run_id", "client"], "left")
    t = t.select("*", F.coalesce("t_ack", "t_invoke").alias("t_arr"))
    k = sql("element_at(filter(coalesce(offline, array()), i -> i.c > t_arr), 1)")
    t = t.select("*", k.alias("k"), F.col("t_first").isNotNull().alias("delivered"))
    # In the backlog of offline window k: published while offline, or earlier but not acked before it began.
    in_backlog = F.col("k").isNotNull() & ((F.col("t_arr") >= F.col("k.d")) | F.col("first_ack_t").isNull()
                                           | (F.col("first_ack_t") > F.col("k.d")))
    # Kept (limit rules): delivered at or after the reconnect, i.e. still in the queue when the backlog was read.
    # A message delivered before the disconnect, never acked and not resent after it was legally trimmed (TBMQ
    # trims by ZSET score, oldest first: old in-flight messages go first); "delivered" still clears it of loss.
    kept = in_backlog & (F.col("t_last") >= F.col("k.c"))
    t = t.select("*", in_backlog.alias("in_backlog"), F.coalesce(kept, F.lit(False)).alias("kept_after"))
    # A queued message's first chance is the reconnect; one acknowledged within the pipeline slack before it may
    # still be on its way into the queue (Kafka -> Redis) when the backlog is read, and arrive up to the slack
    # later: it expired legally if its deadline falls before that (p2p-expiry seed 1 under load, docs/findings.md).
    opportunity = F.when(F.col("in_backlog"), F.greatest(F.col("k.c"), F.col("t_arr") + F.col("slack_us"))).otherwise(
        F.col("t_arr"))
    t = t.select("*", (expiry_deadline() < opportunity + F.col("tol_us")).alias("expired_legally"),
                 (F.col("in_backlog") & ((F.col("k.c") >= NEVER) | F.col("k.discarded"))).alias("undeliverable"),
                 F.when(F.col("in_backlog"), F.col("k.idx")).otherwise(F.lit(-1)).alias("backlog"))
    # Black-box limit rules count only the settled backlog: acked before reconnect - slack.  A message acked
    # later may still be on its way (Kafka -> Redis) when the backlog is read and arrive live; and a window
    # shorter than the slack (the drain's own disconnect + reconnect) is no offline period with a backlog.
    immediate = (F.col("k.c") - F.col("k.d")) < F.col("slack_us")
    settled = F.col("in_backlog") & ~immediate & (F.col("t_arr") < F.col("k.c") - F.col("slack_us"))
    return (t.select("*", settled.alias("settled"), (F.col("in_backlog") & immediate).alias("immediate")).drop("offline")
            .sortWithinPartitions(*SUBSCRIBER_MESSAGE))  # the join's own order: a no-op the optimiser removes


QUEUE_COLUMNS = ("rank", "legally_trimmed", "misplaced", "n_pipeline_w", "n_backlog", "n_settled_delivered", "n_settled",
                 "max_rank_delivered_kept", "trimmed_delivered", "wrongly_kept_rank")


def backlog_queues(rows):
    """Per queued (subscriber, message) of ``subscriber_rows`` (``in_backlog``), its place in its offline window's
    backlog and what the backlog as a whole says (QUEUE_COLUMNS), sorted by the join key.

    Why only the queued rows: these windows sort the rows by arrival and pass over them three times; over every
    row of a 10 M event history (nearly all delivered online) they took half the per-subscriber table's time, for
    values only a queued row reads."""
    from pyspark.sql import functions as F

    queued = rows.filter(F.col("in_backlog")).select(*SUBSCRIBER_MESSAGE, "is_cand", "backlog", "policy", "limit",
                                                     "t_arr", "delivered", "kept_after", "settled")
    return queue_windows(queued).select(*SUBSCRIBER_MESSAGE, *QUEUE_COLUMNS).sortWithinPartitions(*SUBSCRIBER_MESSAGE)


def queue_windows(t):
    """QUEUE_COLUMNS over rows of ``subscriber_rows``, each backlog (an offline window of a subscriber) alone.  A
    row not queued (``backlog`` -1) gets values that mean nothing; ``per_subscriber_message`` replaces them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Every window below is partitioned by is_cand too: rows that were never owed (another session's filter,
    # a failed publish) share the subscriber's partition but must not take part in its queue or stream.
    # Why rank newest-first: while offline the broker keeps only the newest `limit` of the backlog.  Messages
    # that arrived in the same microsecond are ranked by publisher code (jobs.CODED), then sequence: an order
    # the history cannot give, fixed so that every check ranks them alike.
    queue = Window.partitionBy("run_id", "client", "is_cand", "backlog").orderBy(
        F.col("t_arr").desc(), F.col("publisher").desc(), F.col("pub_seq").desc())
    whole = Window.partitionBy("run_id", "client", "is_cand", "backlog")
    # --- queue-policy rules (declared by the target: drop_oldest, drop_newest, reject, none) ---------------
    # "rank" counts from the end of the backlog the declared policy keeps: newest-first for drop_oldest (TBMQ),
    # oldest-first for drop_newest (n - newest-first rank + 1: one sort serves both).  Only a drop policy
    # trims legally; under reject or none every trimmed message is simply lost.
    newest_first = F.row_number().over(queue)
    t = t.select("*", F.when(F.col("policy") == "drop_newest", F.count(F.lit(1)).over(whole) - newest_first + 1)
                 .otherwise(newest_first).alias("rank"))
    t = t.select("*", (drops() & (F.col("rank") > F.col("limit"))).alias("legally_trimmed"))
    t = t.select(
        "*", F.sum((~F.col("settled")).cast("int")).over(whole).alias("n_pipeline_w"),
        F.count(F.lit(1)).over(whole).alias("n_backlog"),
        F.sum((F.col("kept_after") & F.col("settled")).cast("int")).over(whole).alias("n_settled_delivered"),
        F.sum(F.col("settled").cast("int")).over(whole).alias("n_settled"),
        F.max(F.when(F.col("kept_after") & ~F.col("legally_trimmed"), F.col("rank"))).over(whole).alias(
            "max_rank_delivered_kept"))
    t = t.select(
        "*",
        # Kept although older than the limit even if every in-pipeline message missed the queue.
        F.max((F.col("kept_after") & F.col("legally_trimmed") & F.col("settled")
               & (F.col("rank") > F.col("limit") + F.col("n_pipeline_w"))).cast("int")).over(whole).alias(
            "trimmed_delivered"),
        # The oldest message kept although the limit (plus the pipeline) was newer than it: the trim kept the
        # wrong end of this backlog (read below: a newer one trimmed beside it was not trimmed legally).
        F.max(F.when(F.col("kept_after") & F.col("legally_trimmed") & F.col("settled")
                     & (F.col("rank") > F.col("limit") + F.col("n_pipeline_w")), F.col("rank"))).over(whole).alias(
            "wrongly_kept_rank"))
    # Never delivered, past the limit by rank, but kept-side of a message the broker wrongly kept (newer than it
    # under drop_oldest, older under drop_newest): the queue held the wrong end, so the rank does not excuse it
    # (trim_newest with the newest still in the pipeline at the reconnect: the kept oldest 20, then the pipeline's
    # 20, and 26 between them never sent; p2p-limit-trim-3).  Its cause below is the policy rule.
    misplaced = F.coalesce(F.col("legally_trimmed") & ~F.col("delivered") & (F.col("rank") < F.col("wrongly_kept_rank")),
                           F.lit(False))
    t = t.select("*", misplaced.alias("misplaced")).withColumn("legally_trimmed",
                                                               F.col("legally_trimmed") & ~F.col("misplaced"))
    return t


def per_subscriber_message(rows, queues=None):
    """``subscriber_rows`` with their ``backlog_queues`` values (a row not queued: no rank, no backlog, nothing
    trimmed) and, for the owed candidates (``is_cand``), whether they are owed.  Both sides are sorted by the
    join key within the subscriber's partition: a merge, no rows move and none is sorted again.

    Without ``queues`` (a small check): the queue windows over every row, a row not queued masked to the same
    values.  For a run's history the sort costs nothing, and a join and a job less cost the driver less."""
    from pyspark.sql import functions as F

    if queues is None:
        t = queue_windows(rows)
        t = t.select(*[c for c in t.columns if c not in QUEUE_COLUMNS],
                     *[F.when(F.col("in_backlog"), F.col(c)).alias(c) for c in QUEUE_COLUMNS])
    else:
        t = rows.join(queues, list(SUBSCRIBER_MESSAGE), "left")
    zero = ("n_pipeline_w", "n_settled_delivered", "n_settled", "trimmed_delivered")
    t = t.select(*[c for c in t.columns if c not in ("legally_trimmed", "misplaced", *zero)],
                 *[F.coalesce(c, F.lit(False)).alias(c) for c in ("legally_trimmed", "misplaced")],
                 *[F.coalesce(c, F.lit(0)).alias(c) for c in zero])
    # What a delivered row owes is settled here; a never-delivered one's (trimmed later, carried, why lost) is
    # settled by open_messages, which reads its stream's neighbours.
    t = t.select("*", owed_flag().alias("owed"))
    return t if queues is not None else t.sortWithinPartitions(*SUBSCRIBER_MESSAGE)


def owed_flag():
    """Whether the subscriber was owed a candidate: not undeliverable, not expired, not legally trimmed."""
    from pyspark.sql import functions as F

    return ~F.col("undeliverable") & ~F.col("expired_legally") & ~F.col("legally_trimmed")


def drops():
    """Whether the run's declared queue policy trims (drop_oldest, drop_newest); under reject or none it never does."""
    from pyspark.sql import functions as F

    return F.col("policy").isin("drop_oldest", "drop_newest")


def open_messages(table, clients_b):
    """The never-delivered candidates of ``table`` (``is_cand``, not delivered), each with its stream's nearest
    deliveries, when it can have been trimmed, whether it was carried into the next backlog, whether it is owed
    and, if owed, why it was lost (``cause``) and where in its stream (``position``).  None of this is read for
    a delivered row.

    Why only the streams with such a row: a stream's neighbours take two sorts of every row of the stream, one
    each way.  Over every row they cost a 10 M event history a sort and two window passes of 2.5 M wide rows;
    over the streams with a gap they cost what the gaps are."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    stream_key = ["run_id", "client", "publisher"]
    cands = table.filter(F.col("is_cand"))
    with_gap = cands.filter(~F.col("delivered")).select(*stream_key).distinct()
    t = cands.join(F.broadcast(with_gap), stream_key, "left_semi")
    stream = Window.partitionBy(*stream_key)
    before = stream.orderBy("pub_seq").rowsBetween(Window.unboundedPreceding, -1)
    # Why descending with a growing frame: an "unbounded following" frame is re-aggregated for every row
    # (quadratic per stream); reversed, the nearest later delivery is a running last().
    after = stream.orderBy(F.col("pub_seq").desc()).rowsBetween(Window.unboundedPreceding, -1)
    delivered_seq = F.when(F.col("delivered"), F.col("pub_seq"))
    t = t.select("*", F.last(delivered_seq, ignorenulls=True).over(after).alias("next_delivered"),
                 F.min(F.when(F.col("delivered"), F.col("t_first"))).over(after).alias("later_first_t"))
    t = t.select("*", F.last(delivered_seq, ignorenulls=True).over(before).alias("prev_delivered"),
                 F.max(F.when(F.col("delivered"), F.col("t_last"))).over(before).alias("older_last_t"))
    t = t.filter(~F.col("delivered"))
    # When a never-delivered message can have been trimmed (online_trims): after it arrived and after the last
    # delivery of an older message of its stream (the trim keeps the newest: an older one sent later was still
    # queued), and no later than the first delivery of a newer one (the queue is read in order: had it still
    # been there, it would have gone first).
    t = t.select("*", F.greatest(F.col("t_arr"), F.col("older_last_t")).alias("trim_from"),
                 F.coalesce(F.col("later_first_t"), F.lit(NEVER)).alias("trim_until")).drop("older_last_t")
    # Carried into the next backlog: a message kept in backlog k but not yet delivered when the subscriber went
    # offline again is still in its queue and may be legally trimmed there (as the oldest).  Only when nothing
    # later of the same stream was delivered in between: had the broker sent anything newer, the queue order
    # says this one went first (or was gone).  One window on; a chain beyond is not followed.  Carried into a
    # window that never closes it is NOT excused: the broker had the whole online period (at the end, the
    # drain's quiet period) to deliver it.
    sizes = (cands.filter(F.col("in_backlog")).groupBy("run_id", "client", F.col("backlog").alias("next_idx"))
             .agg(F.max("n_backlog").alias("next_n")))
    t = (t.join(clients_b.select("run_id", "client", "offline"), ["run_id", "client"], "left")
         .withColumn("next_idx", F.col("k.idx") + 1)
         .join(F.broadcast(sizes), ["run_id", "client", "next_idx"], "left"))
    k_next = sql("element_at(filter(coalesce(offline, array()), i -> i.idx = k.idx + 1), 1)")
    waiting = F.col("in_backlog") & ~F.col("legally_trimmed") & ~F.col("misplaced")
    t = t.select("*", F.when(waiting, F.struct(k_next.alias("k"), F.coalesce("next_n", F.lit(0)).alias("n_backlog")))
                 .alias("next_backlog")).drop("offline", "next_idx", "next_n")
    carried = (F.col("next_backlog.k").isNotNull()
               & (F.col("later_first_t").isNull() | (F.col("later_first_t") >= F.col("next_backlog.k.d"))))
    # Carried over, it is the oldest of the next backlog: drop_oldest may trim it there, drop_newest keeps it.
    trimmed_later = F.coalesce(carried & (F.col("policy") == "drop_oldest")
                               & (F.col("next_backlog.n_backlog") >= F.col("limit")), F.lit(False))
    # The window a lost message is blamed on: the one it was carried into, if any (it was dropped there).
    t = t.withColumn("legally_trimmed", F.col("legally_trimmed") | trimmed_later).withColumn(
        "carried_into", F.when(F.coalesce(carried & (F.col("next_backlog.k.c") < NEVER), F.lit(False)), F.struct(
            F.col("next_backlog.k.d").alias("d"), F.col("next_backlog.k.c").alias("c"),
            F.col("next_backlog.n_backlog").alias("n_backlog")))).drop("next_backlog", "later_first_t")
    t = t.withColumn("owed", owed_flag())
    in_b = F.col("in_backlog")
    # Lost to a fault the declared persistence does not cover (a kill of a broker promising only a graceful
    # stop): the fault started before the message's chance to be delivered (the reconnect ending its offline
    # window; online: within the pipeline slack) and after it was acknowledged, or, for a queued message,
    # while its subscriber was away (the kill took the session and its queue: what was queued after it went
    # into a session the broker no longer had).
    chance = "CASE WHEN in_backlog THEN k.c ELSE t_arr + slack_us END"
    since = "CASE WHEN in_backlog THEN least(t_arr, k.d - slack_us) ELSE t_arr END"
    unpromised = sql(f"exists(unpromised_times, x -> x >= {since} AND x <= {chance})")
    not_policy = F.when(F.col("policy") == "drop_newest", F.lit("limits.trim_not_newest")).otherwise(
        F.lit("limits.trim_not_oldest"))
    cause = (F.when(unpromised, F.lit("durability.lost_allowed"))
             .when(in_b & drops() & (F.col("n_backlog") > F.col("limit")) & (F.col("trimmed_delivered") == 1),
                   not_policy)
             .when(in_b & drops() & ~F.col("immediate") & (F.col("n_settled") >= F.col("limit"))
                   & (F.col("trimmed_delivered") == 0)
                   & (F.col("max_rank_delivered_kept").isNull() | (F.col("rank") > F.col("max_rank_delivered_kept"))),
                   F.lit("limits.trimmed_under_limit"))
             .when(in_b & F.col("expiry_s").isNotNull(), F.lit("expiry.dropped_early"))
             .otherwise(F.lit("durability.lost")))
    position = (F.when(F.col("prev_delivered").isNull() & F.col("next_delivered").isNull(), F.lit("whole"))
                .when(F.col("prev_delivered").isNull(), F.lit("prefix"))
                .when(F.col("next_delivered").isNull(), F.lit("suffix")).otherwise(F.lit("middle")))
    return t.select("*", cause.alias("cause"), position.alias("position"))


def online_trims(gaps, table):
    """The never-delivered messages a drop-oldest queue trimmed legally at any moment, the subscriber online or
    not: (run_id, client, publisher, pub_seq, peak).  TBMQ trims ``{client}_messages`` to the newest ``limit``
    on every save, whether the client is connected or not (lua/save.lua); a subscriber online behind a slow
    pipeline can have more than the limit queued (p2p-limit-trim seeds 4 and 5, docs/findings.md).

    A message was trimmed legally when, at some moment T in [trim_from, trim_until] (open_messages),
    at least ``limit`` newer messages of the subscriber's queue were there at once.  A newer message counts
    as queued from its publish ack (the earliest it can have been saved) until the subscriber acknowledged it
    (else its last delivery); one never delivered does not count (when it left the queue is unknown, and
    counting it would let one trim excuse the next)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    gone = (gaps.filter(F.col("owed") & (F.col("policy") == "drop_oldest")
                         & ~F.col("misplaced")  # its backlog's trim kept the wrong end: no later trim excuses it
                         & (F.col("trim_from") <= F.col("trim_until")))
            .select("run_id", "client", F.col("publisher").alias("m_publisher"), F.col("pub_seq").alias("m_pub_seq"),
                    F.col("t_arr").alias("m_t_arr"), "trim_from", "trim_until", "limit"))
    queued = table.filter(F.col("is_cand") & F.col("delivered")).select(
        "run_id", "client", "publisher", "pub_seq", "t_arr", F.coalesce("first_ack_t", "t_last").alias("t_gone"))
    # "Newer" is the queue order the backlog rank uses: arrival, then publisher and sequence.
    newer = ((F.col("t_arr") > F.col("m_t_arr"))
             | ((F.col("t_arr") == F.col("m_t_arr")) & ((F.col("publisher") > F.col("m_publisher"))
                                                        | ((F.col("publisher") == F.col("m_publisher"))
                                                           & (F.col("pub_seq") > F.col("m_pub_seq"))))))
    pairs = (F.broadcast(gone).join(queued, ["run_id", "client"])
             .filter(newer & (F.col("t_gone") > F.col("trim_from")) & (F.col("t_arr") <= F.col("trim_until"))))
    m = ["run_id", "client", "m_publisher", "m_pub_seq"]
    # Why a sweep: +1 where a newer message enters the window [trim_from, trim_until], -1 where it leaves (a leave
    # sorts before an enter at the same instant: queued over [t_arr, t_gone)); the running sum's peak is the
    # most newer messages queued at once.
    event = F.explode(F.array(F.struct(F.greatest("t_arr", "trim_from").alias("t"), F.lit(1).alias("d")),
                              F.struct(F.col("t_gone").alias("t"), F.lit(-1).alias("d"))))
    events = pairs.select(*m, "limit", "trim_until", event.alias("e")).filter(F.col("e.t") <= F.col("trim_until"))
    sweep = Window.partitionBy(*m).orderBy("e.t", "e.d").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    peaks = events.select(*m, "limit", F.sum("e.d").over(sweep).alias("n")).groupBy(*m, "limit").agg(
        F.max("n").alias("peak"))
    return peaks.filter(F.col("peak") >= F.col("limit")).select(
        "run_id", "client", F.col("m_publisher").alias("publisher"), F.col("m_pub_seq").alias("pub_seq"), "peak")


def claimed_deliveries(table):
    """The delivered rows of the per-subscriber table: the deliveries that found their claim, with its publish."""
    from pyspark.sql import functions as F

    return table.filter(F.col("n_deliveries").isNotNull()).select(*SUBSCRIBER_MESSAGE, *PUBLISH_COLUMNS)


def delivered_messages(table, dsm, pub, runs_b, all_claimed: bool = False):
    """(every delivered (subscriber, message) with the publish it claims to be, the unmatched part of it or
    None).  Nearly all find it in the per-subscriber table (a merge join, no rows move); a delivery no claim
    matches (never published, unreadable identity, or a topic none of the subscriber's filters match) is looked
    up in the publishes.  ``all_claimed``: the counts said every delivered message found its claim (claims are
    a subset of them), so there is nothing to look up; without it, the anti join below finds the same (nothing,
    or the unmatched ones) in the same job."""
    from pyspark.sql import functions as F

    claimed = claimed_deliveries(table)
    matched = dsm.join(claimed, list(SUBSCRIBER_MESSAGE)).join(runs_b.drop("fault_times", "fault_spans"), "run_id")
    if all_claimed:
        return matched.select(*DELIVERED_COLUMNS), None
    unmatched = (dsm.join(claimed.select(*SUBSCRIBER_MESSAGE), list(SUBSCRIBER_MESSAGE), "left_anti")
                 .join(pub, ["run_id", "publisher", "pub_seq"], "left")
                 .join(runs_b.drop("fault_times", "fault_spans"), "run_id")
                 .select(*DELIVERED_COLUMNS, F.col("first.t").alias("t_first")))
    return matched.select(*DELIVERED_COLUMNS).unionByName(unmatched.drop("t_first")), unmatched


def _bucket(col):
    """A time's bucket of the run's series (``t_origin``, ``bucket_us``: the runs table's)."""
    from pyspark.sql import functions as F

    return ((col - F.col("t_origin")) / F.col("bucket_us")).cast("long")


def _metric(df, metric: str, key, value):
    from pyspark.sql import functions as F

    return df.select("run_id", F.lit(metric).alias("metric"), key.cast("string").alias("key"),
                     value.cast("double").alias("value"))


def _delivery_metrics(pub, slots, delivered, runs_b):
    """Small metric rows (run_id, metric, key, value) of the publishes and deliveries: counts and per-bucket
    series.  Each big table is aggregated once, per time bucket, and every row drawn from it (its series and its
    share of the run totals) comes out of one explode of those few bucket rows (``_bucket_rows``).  ``delivered``:
    one row per delivered (subscriber, message) with its first delivery (``t_first``), its publish and its
    counts."""
    from pyspark.sql import functions as F

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


def _owed_metrics(cand, lost):
    """Small metric rows of the owed candidates (``cand``: each with what it owes) and the lost ones: the counts
    of what was owed, trimmed, expired, undeliverable, the owed-but-unseen series, the losses by position.
    Every metric here is whole in these rows: ``metric_rows`` merges them with ``_delivery_metrics``' as they
    are (no key of one is a key of the other)."""
    from pyspark.sql import functions as F

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
    return reduce(lambda a, b: a.unionByName(b), parts)


def _bucket_rows(per_bucket, totals: tuple[str, ...], series: dict[str, str]):
    """The metric rows of one per-bucket aggregate: a series row per bucket and metric (a null value, or the null
    bucket of rows without the time, e.g. never acked, gives none) and, per bucket, its share of each run total
    of ``totals`` (metric TOTAL_PART; every bucket counts, the null one too), summed into metric "count" by
    ``metric_rows`` after the collect.

    Why the totals are summed in Python: summed here, the totals were a second reader of the aggregate, and the
    two readers did not share it: each computed the aggregate, and so its big table (at 10 M events the
    per-message join), once more.  A few rows per bucket cost nothing to sum on the driver."""
    from pyspark.sql import functions as F

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


@contextmanager
def timed(label: str):
    """With $ORDEAL_CHECKER_TIMING set, print how long a step took (the benchmark's profile)."""
    started = time.monotonic()
    try:
        yield
    finally:
        if os.environ.get("ORDEAL_CHECKER_TIMING"):
            print(f"  {label}: {time.monotonic() - started:.2f} s", flush=True)


def collect_all(violations, metrics):
    """Violations (as collect_violations) and metric rows in one job: the two share the cached tables' scans
    and exchanges, and a small check pays one job's fixed cost instead of two."""
    from pyspark.sql import functions as F

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
    from pyspark.sql import Window
    from pyspark.sql import functions as F

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
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

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
    from pyspark.sql import functions as F

    return _gather(_ranked(violations).filter(F.col("rn") <= F.col("cap")).collect())
