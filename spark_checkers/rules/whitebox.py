"""The white-box rules (the reference broker's stored state): the stored packet ids of a persistent session
taken in order, 1..65535 then 1 (``packet_id_gaps``, the table the rule reads).  The explanations of the other
white-box findings are here too: the stored last packet id behind a delivered one (api.py), and payload keys
without a reference or references without a payload after the drain (timeline.py)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import client, publisher
from spark_checkers.rules.registry import STORED_IDS, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


def packet_id_gaps(slots, table, clients_b, runs_b):
    """White box (the reference broker): within one persistent session the stored ids go 1, 2, ... 65535, 1, ...
    (lua/save.lua), and the session's messages are sent in that order.  Per session, one row per delivery that
    took a new id after a gap, with the gap and whether the history explains it.

    What legitimately makes a gap: a stored message that never reached the subscriber in this session (trimmed
    to the limit, expired, too large for the client, or lost, which its own rule reports) took its id.  Why the
    count is cumulative: each such message explains one skipped id, once.  A gap while a fault was around may
    also be a save repeated after a failure whose first copy was trimmed: not judged.  The first session of a
    client is not judged at its start (a scenario may preset the counter); a later one starts at 1 (a new
    session discards the old one's counter).  An APPLICATION client (the broker's application_clients rules) is
    not judged at all: its packet ids follow the offsets of its own Kafka topic, not save.lua's counter."""
    # A preset of the counter (the harness's, recorded as a session_snapshot with when = "preset") starts a new
    # run of ids within the session: judged like a session's start, whose first id is not judged.
    session = ["run_id", "client", "epoch", "segment"]
    by_seq = Window.partitionBy(*session).orderBy("seq")
    valid = (F.col("packet_id") >= 1) & (F.col("packet_id") <= 65535) & ~F.coalesce("reused", F.lit(False))
    presets = F.broadcast(clients_b.select("run_id", "client", "preset_seqs", "fresh_seqs", "application"))
    since = "coalesce(element_at(fresh_seqs, greatest(epoch, 1)), 0)"
    # Why not an APPLICATION client: its ids are its Kafka topic's offsets (offset mod 65535 + 1), and a produce
    # that failed after taking offsets leaves them unused -- a skip with nothing lost, no save.lua counter behind it.
    ids = (slots.filter(F.col("new_id")).join(presets, ["run_id", "client"], "left")
           .filter(~F.coalesce("application", F.lit(False)))
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


@rule("whitebox.packet_id_sequence", STORED_IDS)
def packet_id_sequence():
    return (F.col("unexplained"), F.col("t") - F.col("t_origin"),
            client(), "t", "seq", "packet_id", "prev_packet_id", "prev_t", publisher(), "pub_seq", "epoch", "gap",
            "skipped_total", "undelivered", "t_session", "t_origin")


@explains("whitebox.packet_id_sequence")
def _packet_id_sequence(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    prev = w.get("prev_packet_id")
    after = (f"after packet id {prev} at {seconds(w.get('prev_t'), o)}" if prev is not None
             else f"as the first stored id of the session begun at {seconds(w.get('t_session'), o)} (a new session "
                  "starts at 1)")
    return (f"session {w['client']} (session {w.get('epoch')}): {message(w)} took packet id {w.get('packet_id')} at "
            f"{seconds(w.get('t'), o)} {after}, skipping {w.get('gap')} id(s); {w.get('skipped_total')} skipped in "
            f"this session so far, but only {w.get('undelivered')} of its messages never arrived (trimmed, expired "
            "or lost, each taking one id): the reference broker hands ids out 1..65535 in order, then 1.")


@explains("whitebox.orphan_payloads")
def _orphan_payloads(w: dict[str, Any], timeline: Timeline) -> str:
    return f"session {w.get('client')}: {w.get('count')} payload key(s) with no ZSET reference after the drain."


@explains("whitebox.dangling_refs")
def _dangling_refs(w: dict[str, Any], timeline: Timeline) -> str:
    return f"session {w.get('client')}: {w.get('count')} ZSET reference(s) whose payload key is gone after the drain."


@explains("whitebox.last_packet_id_behind")
def _last_packet_id_behind(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"session {w.get('client')}: stored last packet id {w.get('stored')} is behind packet id "
            f"{w.get('delivered')} already delivered.")
