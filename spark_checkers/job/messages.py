"""The big tables of the message side: one row per message as published (``publishes``), one per delivery with
its packet-id slot (``delivery_slots``), one per delivered (subscriber, message) (``message_deliveries`` and
``deliveries_per_message``, with what only a message's deliveries in order tell: ``with_after_ack``), and a
delivered message's stream neighbour (the order rule's ``prev_max``).  Every key starts with ``run_id``, so one
job checks a batch of histories; the delivery side moves once, by subscriber."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Window
from pyspark.sql import functions as F

from contracts.history_schema import Kind
from spark_checkers.job.columns import (
    AFTER_ACK_COLUMNS,
    FIRST_FIELDS,
    LAST_FIELDS,
    MESSAGE_COLUMNS,
    PUB_KINDS,
    SUBSCRIBER_MESSAGE,
    V5_AGGREGATES,
    sql,
)
from spark_checkers.job.events import RunSpec
from spark_checkers.job.timing import timed


def aggregate(df, keys: tuple[str, ...], *aggs, constant: dict[str, str] | None = None):
    """``df.groupBy(*keys).agg(*aggs)``, with the keys that hold one value in every row (``constant``: run_id in
    a one-run check) left out of the grouping and put back as literals in front.

    Why: Spark keeps a literal grouping key (it propagates the literal into the grouping after the rule that
    drops literal keys has run), so every row was grouped by "run0" too.  A hash aggregate hashed the string
    per row; a sort aggregate wanted its input sorted by (literal, keys...), an order no sort by the real keys
    gives: the per-message aggregate sorted its 2.5 M rows (10 M events) three times over, before, between and
    after its two phases, although the window beneath it had left them in the keys' order."""
    constant = {name: value for name, value in (constant or {}).items() if name in keys}
    grouped = df.groupBy(*[k for k in keys if k not in constant]).agg(*aggs)
    if not constant:
        return grouped
    return grouped.select(*[F.lit(value).alias(name) for name, value in constant.items()], "*")


def publishes(events, constant: dict[str, str] | None = None):
    """One row per message: what was published and how the publish ended (``constant``: see ``aggregate``)."""
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
        on_invoke("node").alias("pub_node"), on_invoke("protocol").alias("pub_protocol"),
        on_invoke("props").alias("pub_props"), on_invoke("retain").alias("pub_retain"),
        on_invoke("packet_size").alias("pub_packet_size"),
        F.min(F.when(F.col("kind") == Kind.PUBLISH_ACK, F.col("t_mono_us"))).alias("t_ack"),
        F.min(F.when(F.col("kind") == Kind.PUBLISH_FAIL, F.col("t_mono_us"))).alias("t_fail"),
        F.min(F.when(F.col("kind") == Kind.PUBLISH_INDETERMINATE, F.col("t_mono_us"))).alias("t_indet"),
        constant=constant)


def subscriber_partitioning(runs: list[RunSpec]) -> tuple[str, ...]:
    """The key the delivery side is moved by, once.  With one run, run_id is a constant the optimiser folds out
    of every later key, and (constant, client) would match none of them: the client alone.  With many runs,
    the client alone would put every run's "sub-0" in one partition: (run_id, client), both real columns."""
    return ("client",) if len(runs) == 1 else ("run_id", "client")


def delivery_slots(events, clients_df, by: tuple[str, ...], v5: bool = True):
    """Deliveries with what their packet-id slot says: the previous use of the slot, resend, reuse, acked.  With
    ``v5`` (the batch has an MQTT 5 connection), what a delivery carries of MQTT 5 too (``_v5_delivery``) and the
    Maximum Packet Size of the connection it came on."""
    # The kind as a flag (the rows are deliveries and the acks the subscriber sent): a string compared on every
    # row and neighbour, and carried through the shuffle and the sort, is a byte here.
    rows = events.filter(F.col("kind").isin(Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)).select(
        "run_id", "client", "seq", F.col("t_mono_us").alias("t"), (F.col("kind") == Kind.DELIVERY_ACK_SENT).alias("ack"),
        "packet_id", "publisher", "pub_seq", "body_hash", "topic", "qos", "dup", "remaining_expiry_s", "node",
        "protocol", "retain", *(_v5_delivery() if v5 else ()))
    # Why one repartition by subscriber: every later step on the delivery side (packet-id slots, per message,
    # stream order, the owed candidates and their queue ranks) is keyed by (run, subscriber, ...).  The rows
    # move once; every later window, aggregate and join only sorts within its partition.
    rows = rows.repartition(*by).join(F.broadcast(clients_df.select("run_id", "client", "connect_seqs", "fresh_seqs",
                                                                    "persistent_fresh_seqs", "shared_only",
                                                                    *(("conn_limits",) if v5 else ()))),
                                      ["run_id", "client"], "left")
    rows = rows.withColumn("conn", sql("size(filter(coalesce(connect_seqs, array()), x -> x < seq))"))
    if v5:  # the Maximum Packet Size the CONNECT of this delivery's connection sent (conn_limits: one per connect row)
        rows = rows.withColumn("max_packet_size", sql(
            "CASE WHEN conn > 0 THEN try_element_at(conn_limits, conn).maximum_packet_size END")).drop("conn_limits")
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
    # A member of shared groups only: what it left unacknowledged when its connection went, its group may hand to
    # another member (MQTT 5 §4.8.2) and so out of this session, whose id is then free on the next connection.
    handed_over = F.coalesce("shared_only", F.lit(False)) & (F.col("prev_conn") < F.col("conn"))
    return (rows.filter(~F.col("ack"))
            .withColumn("resend", slot_in_use & same_identity)
            .withColumn("reused", slot_in_use & ~same_identity & ~handed_over)
            .withColumn("acked", F.col("next_ack"))
            # Takes a new stored packet id: not the message the slot held last in this session.
            .withColumn("new_id", F.col("stored") & ~F.coalesce(
                (F.col("prev_holder.epoch") == F.col("epoch")) & F.col("prev_holder.publisher").eqNullSafe(F.col("publisher"))
                & F.col("prev_holder.pub_seq").eqNullSafe(F.col("pub_seq")), F.lit(False)))
            # Materialised next: only what later steps read (each string column costs to cache).
            .drop("connect_seqs", "fresh_seqs", "persistent_fresh_seqs", "shared_only", "ack", "prev_ack", "next_ack",
                  "prev_epoch", "prev_holder"))


# A big check's messages delivered more than once, up to this many, get AFTER_ACK_COLUMNS from their own rows
# (broadcast); with more, every message's are computed the small way (deliveries_per_message).
MULTI_DELIVERY_BROADCAST_ROWS = 100_000


def _v5_delivery() -> list:
    """What a delivery row carries of MQTT 5: its forwarded properties (coded by encode_events), its subscription
    identifiers as primitives (``sids``: a code of the sorted distinct ids, 0 = none; ``n_sids``, ``sid_lo``,
    ``sid_hi``: their number, lowest and highest; the string itself would make every read of the cached delivery
    table build rows), the PUBLISH packet's size."""
    ids = sql("array_sort(array_distinct(filter(transform(split(sub_ids, ','), x -> try_cast(trim(x) AS BIGINT)),"
              " x -> x IS NOT NULL)))")
    return ["props", F.when(F.size(ids) > 0, F.xxhash64(F.array_join(ids.cast("array<string>"), ","))).otherwise(
                F.lit(0).cast("long")).alias("sids"),
            F.when(F.col("sub_ids").isNull(), F.lit(0)).otherwise(F.size(ids)).alias("n_sids"),
            F.array_min(ids).alias("sid_lo"), F.array_max(ids).alias("sid_hi"), "packet_size"]


def _v5_aggregates(columns) -> list:
    """V5_AGGREGATES over a message's deliveries (every buffer a primitive), each null where the delivery table has
    not the columns it reads (a batch without MQTT 5: ``delivery_slots``)."""
    have = set(columns)
    v5 = F.col("protocol") == 5
    no_remaining = v5 & F.col("remaining_expiry_s").isNull()
    found = {  # name -> (the columns it reads, the aggregate)
        "min_qos": (("qos",), F.min("qos")),
        "max_remaining": (("remaining_expiry_s",), F.max("remaining_expiry_s")),
        "no_remaining_t": (("protocol",), F.min(F.when(no_remaining, F.col("t")))),
        "no_remaining_packet_id": (("protocol",), F.min_by("packet_id", F.when(no_remaining, F.col("seq")))),
        "min_props": (("props",), F.min(F.when(v5, F.coalesce("props", F.lit(0).cast("long"))))),
        "max_props": (("props",), F.max(F.when(v5, F.coalesce("props", F.lit(0).cast("long"))))),
        "min_sids": (("sids",), F.min(F.when(v5, F.col("sids")))),
        "max_sids": (("sids",), F.max(F.when(v5, F.col("sids")))),
        "min_n_sids": (("sids",), F.min(F.when(v5, F.col("n_sids")))),
        "max_n_sids": (("sids",), F.max(F.when(v5, F.col("n_sids")))),
        "min_sid": (("sids",), F.min(F.when(v5, F.col("sid_lo")))),
        "max_sid": (("sids",), F.max(F.when(v5, F.col("sid_hi")))),
        "min_retain": (("retain",), F.min(F.coalesce("retain", F.lit(False)).cast("int"))),
        "max_retain": (("retain",), F.max(F.coalesce("retain", F.lit(False)).cast("int"))),
    }
    return [(agg if set(needs) <= have else F.lit(None)).cast(kind).alias(name)
            for name, kind in V5_AGGREGATES for needs, agg in [found[name]]]


def _message_aggregates(columns=()) -> list:
    """What one pass over a message's deliveries gives in any order (each aggregate's buffer a primitive);
    ``columns``: those of the delivery table (the MQTT 5 ones it has, ``_v5_aggregates``)."""
    return [*_v5_aggregates(columns), F.count(F.lit(1)).alias("n_deliveries"), F.max("t").alias("t_last"),
            F.min("body_hash").alias("min_hash"), F.max("body_hash").alias("max_hash"), F.max("qos").alias("qos"),
            # A delivery is acked when the next row of its packet-id slot is the subscriber's ack (delivery_slots).
            F.min(F.when(F.col("acked"), F.col("next_seq"))).alias("first_ack_seq"),
            F.min(F.when(F.col("acked"), F.col("next_t"))).alias("first_ack_t"),
            F.sum(F.col("resend").cast("int")).alias("n_resends"),
            F.max(F.col("t") + F.col("remaining_expiry_s") * 1_000_000).alias("implied_deadline"),
            # acked is null on the last use of a packet-id slot (no row after it): never acknowledged.
            F.max(F.when(~F.coalesce(F.col("acked"), F.lit(False)) & (F.coalesce("qos", F.lit(0)) > 0), F.lit(1))
                  .otherwise(F.lit(0))).alias(
                "any_unacked")]


def _in_message_order(rows):
    """``rows`` with what AFTER_ACK_COLUMNS read of the message's other deliveries: its first ack and the
    delivery before (one ordering serves both; one select, one window operator: see delivery_slots)."""
    ordered = Window.partitionBy(*SUBSCRIBER_MESSAGE).orderBy("seq")
    w = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return rows.select("*", F.min(F.when(F.col("acked"), F.col("next_seq"))).over(w).alias("w_first_ack_seq"),
                       F.lag(F.struct("seq", "t", "packet_id", "conn", "retain")).over(ordered).alias("msg_prev"),
                       F.lag("conn", 2).over(ordered).alias("msg_prev2_conn"))


def _after_ack_aggregates() -> list:
    """AFTER_ACK_COLUMNS over rows of ``_in_message_order``."""
    after_ack = F.col("seq") > F.col("w_first_ack_seq")
    # The same message again on the connection that already delivered it, and not the resend of that very packet
    # (same id, no ack between): two distinct deliveries within one connection (connections only grow with seq,
    # so the previous delivery is on this connection iff any earlier one is).  Not twice: the connection's first
    # two copies when one is the retained copy a SUBSCRIBE sent (RETAIN 1) and the other the normal forward
    # (RETAIN 0) of a message published just before that subscription: MQTT allows both ([MQTT-3.3.1-9], [MQTT-3.3.1-12]).
    retained_pair = ((F.coalesce("msg_prev.retain", F.lit(False)) != F.coalesce("retain", F.lit(False)))
                     & ~F.coalesce(F.col("msg_prev2_conn") == F.col("conn"), F.lit(False)))
    twice = (F.col("msg_prev.conn") == F.col("conn")) & ~F.col("resend") & ~retained_pair
    return [F.sum(after_ack.cast("int")).alias("n_after_ack"),
            F.min(F.when(after_ack, F.struct("seq", "t", "packet_id", "dup"))).alias("redelivery"),
            F.min(F.when(twice, F.struct("seq", "t", "packet_id", "dup", F.col("msg_prev.t").alias("prev_t"),
                                         F.col("msg_prev.packet_id").alias("prev_packet_id")))).alias("twice")]


def deliveries_per_message(slots, constant: dict[str, str] | None = None):
    """One row per (subscriber, message): first and last delivery, acks, resends, redeliveries after ack
    (``constant``: see ``aggregate``).  Every message's deliveries in order: a small check's way (and a big
    one's with many messages delivered more than once).  The same aggregate as ``message_deliveries``, over rows
    in message order, with AFTER_ACK_COLUMNS: one definition of every column (its buffers hold structs, so
    Spark runs it as a sort aggregate); slightly faster than taking the first and last delivery as whole
    structs (docs/measurements.md)."""
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
    firsts = [F.min_by(f, F.col("seq")).alias(f"first__{f}") for f in FIRST_FIELDS]
    lasts = [F.max_by(f, F.col("seq")).alias(f"last__{f}") for f in LAST_FIELDS]
    rows = aggregate(_in_message_order(slots) if after_ack else slots, SUBSCRIBER_MESSAGE, *_message_aggregates(slots.columns),
                     *firsts, *lasts, *(_after_ack_aggregates() if after_ack else ()), constant=constant)
    return rows.select(
        *[c for c in rows.columns if not c.startswith(("first__", "last__"))],
        F.struct(*[F.col(f"first__{f}").alias(f) for f in FIRST_FIELDS]).alias("first"),
        F.struct(*[F.col(f"last__{f}").alias(f) for f in LAST_FIELDS]).alias("last"))


def single_delivery(column: str, schema):
    """AFTER_ACK_COLUMNS' ``column`` for a message delivered once: no redelivery, nothing twice, and nothing
    delivered after its ack if it was acked (as the sum over its one row gives: null if it never was).
    ``schema``: the types (``after_ack_deliveries(...).schema``)."""
    if column == "n_after_ack":
        return F.when(F.col("first_ack_seq").isNotNull(), F.lit(0)).cast(schema[column].dataType)
    return F.lit(None).cast(schema[column].dataType)


def after_ack_deliveries(rows, constant: dict[str, str] | None = None):
    """AFTER_ACK_COLUMNS per message of ``rows`` (every delivery of each message in it), sorted by the key."""
    return aggregate(_in_message_order(rows), SUBSCRIBER_MESSAGE, *_after_ack_aggregates(), constant=constant)


def with_after_ack(per_message, deliveries, constant: dict[str, str], freeze):
    """A big check's materialised ``message_deliveries`` with AFTER_ACK_COLUMNS, in its order and partitioning, or
    None if more than MULTI_DELIVERY_BROADCAST_ROWS messages were delivered more than once.  A message delivered
    once gets ``single_delivery``'s values; the others get theirs from their own deliveries in order
    (``after_ack_deliveries``: materialised, few), looked up by broadcast.  ``deliveries``: the delivery slots;
    ``freeze``: the build's."""
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


def stream_neighbours(per_message):
    """(subscriber, message, ``prev_max``) for the delivered messages whose publisher's messages did not reach the
    subscriber in publish order, sorted by the join key; every other delivered message has no ``prev_max``.

    Why only those: the neighbour takes a sort of every delivered message by first delivery, and the order rule
    can flag no message of a publisher whose first deliveries came in ``pub_seq`` order (each message's
    predecessors in its streams are then all older).  Whether they did is read from a narrow projection in the
    order the per-message table already has (by ``pub_seq``): no wide row is sorted or copied."""
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
    the client library hands it over only at PUBREL), which session-mix showed on the correct broker.
    Apart by the RETAIN flag of the first delivery: a retained copy (RETAIN 1, sent for a new subscription,
    [MQTT-3.3.1-6]) is the topic's stored message, not a forward in the stream's order, so the messages of the
    stream forwarded after it are not compared with it (retained.not_last judges the copy).  will-retained-2
    showed it: a late subscriber got the retained #37, then #35, published before the subscribe and still in
    the reference broker's pipeline."""
    stream = Window.partitionBy("run_id", "client", "publisher", "first.topic", "first.qos",
                                F.coalesce(F.col("first.retain"), F.lit(False))).orderBy(
        "first.seq").rowsBetween(
        Window.unboundedPreceding, -1)
    prev_max = F.max(F.struct(F.col("pub_seq"), F.col("first.packet_id").alias("packet_id"),
                              F.col("first.conn").alias("conn"), F.col("first.t").alias("t"),
                              F.col("first.epoch").alias("epoch"), F.col("first.stored").alias("stored"))).over(stream)
    return dsm.select("*", prev_max.alias("prev_max"))
