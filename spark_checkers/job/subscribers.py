"""The per-subscriber side: each published message joined to every client whose filters match its topic
(``subscriber_claims``), what each subscriber got of it and the offline window it was queued in
(``subscriber_rows``), and every delivered message matched to the publish it claims to be
(``delivered_messages``)."""

from __future__ import annotations

from pyspark.sql import functions as F

from spark_checkers.job.clock import skew_early
from spark_checkers.job.columns import DELIVERED_COLUMNS, PUBLISH_COLUMNS, SUBSCRIBER_MESSAGE, sql
from spark_checkers.timeline import NEVER

# A message's first chance to be delivered (``opportunity`` in subscriber_rows), as SQL for the clock bounds.
OPPORTUNITY_SQL = "CASE WHEN in_backlog THEN greatest(k.c, t_arr + slack_us) ELSE t_arr END"
SUBSCRIPTION_ID_BYTES = 5  # a Subscription Identifier property: its id byte and a Variable Byte Integer (1-4 bytes)


def expiry_deadline():
    """When a message expires: its MQTT 5 expiry interval after the publish, else the broker's default TTL."""
    return F.col("t_invoke") + F.coalesce(F.col("expiry_s") * 1_000_000, F.col("ttl_us"))


def subscriber_claims(pub, slots, match_b, by: tuple[str, ...]):
    """One row per (message, client whose filters match its topic), partitioned by client: the publish and
    whether the client was owed it (``is_cand``: a persistent subscription held at publish time, and a publish
    that was acked, or indeterminate and then seen by someone)."""
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
    got = dsm.select(*SUBSCRIBER_MESSAGE, "n_deliveries", F.col("first.t").alias("t_first"), "t_last", "first_ack_t",
                     "n_resends", "n_after_ack")  # the last two for the delivery metrics only
    t = claims.join(got, list(SUBSCRIBER_MESSAGE), "left")
    t = t.join(runs_b.drop("fault_times", "fault_spans"), "run_id").join(
        clients_b.select("run_id", "client", "offline", "conn_limits"), ["run_id", "client"], "left")
    # Too large for the subscriber: a PUBLISH above the Maximum Packet Size its CONNECT sent is discarded by the
    # broker without sending it, as if it had been sent ([MQTT-3.1.2-25]): not owed.  The copy it would get is
    # the publisher's packet plus what the broker adds (a subscription identifier: up to SUBSCRIPTION_ID_BYTES),
    # so a publish that large enough for the copy to exceed the limit is not owed (flow.packet_too_large judges
    # any copy that was sent anyway).
    limit = sql("array_min(transform(filter(coalesce(conn_limits, array()), c -> c.maximum_packet_size IS NOT NULL),"
                " c -> c.maximum_packet_size))")
    too_large = F.coalesce(F.col("pub_packet_size") + SUBSCRIPTION_ID_BYTES > limit, F.lit(False))
    t = t.withColumn("is_cand", F.col("is_cand") & ~too_large).drop("conn_limits")
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
    # A broker or Redis clock that moved between the publish and that chance may expire the message up to
    # skew_early_us sooner (docs/clock-model.md, "Message expiry"): 0 in a run without clock rows.
    t = t.select("*", skew_early("t_invoke", OPPORTUNITY_SQL).alias("skew_early_us")).drop("clock_rows")
    on_time = expiry_deadline() < opportunity + F.col("tol_us")
    legally = expiry_deadline() - F.col("skew_early_us") < opportunity + F.col("tol_us")
    t = t.select("*", legally.alias("expired_legally"), (legally & ~on_time).alias("expired_by_clock"),
                 (F.col("in_backlog") & ((F.col("k.c") >= NEVER) | F.col("k.discarded"))).alias("undeliverable"),
                 F.when(F.col("in_backlog"), F.col("k.idx")).otherwise(F.lit(-1)).alias("backlog"))
    # Black-box limit rules count only the settled backlog: acked before reconnect - slack.  A message acked
    # later may still be on its way (Kafka -> Redis) when the backlog is read and arrive live; and a window
    # shorter than the slack (the drain's own disconnect + reconnect) is no offline period with a backlog.
    immediate = (F.col("k.c") - F.col("k.d")) < F.col("slack_us")
    settled = F.col("in_backlog") & ~immediate & (F.col("t_arr") < F.col("k.c") - F.col("slack_us"))
    return (t.select("*", settled.alias("settled"), (F.col("in_backlog") & immediate).alias("immediate")).drop("offline")
            .sortWithinPartitions(*SUBSCRIBER_MESSAGE))  # the join's own order: a no-op the optimiser removes


def claimed_deliveries(table):
    """The delivered rows of the per-subscriber table: the deliveries that found their claim, with its publish."""
    return table.filter(F.col("n_deliveries").isNotNull()).select(*SUBSCRIBER_MESSAGE, *PUBLISH_COLUMNS)


def delivered_messages(table, dsm, pub, runs_b, all_claimed: bool = False):
    """(every delivered (subscriber, message) with the publish it claims to be, the unmatched part of it or
    None).  Nearly all find it in the per-subscriber table (a merge join, no rows move); a delivery no claim
    matches (never published, unreadable identity, or a topic none of the subscriber's filters match) is looked
    up in the publishes.  ``all_claimed``: the counts said every delivered message found its claim (claims are
    a subset of them), so there is nothing to look up; without it, the anti join below finds the same (nothing,
    or the unmatched ones) in the same job."""
    claimed = claimed_deliveries(table)
    matched = dsm.join(claimed, list(SUBSCRIBER_MESSAGE)).join(runs_b.drop("fault_times", "fault_spans"), "run_id")
    if all_claimed:
        return matched.select(*DELIVERED_COLUMNS), None
    unmatched = (dsm.join(claimed.select(*SUBSCRIBER_MESSAGE), list(SUBSCRIBER_MESSAGE), "left_anti")
                 .join(pub, ["run_id", "publisher", "pub_seq"], "left")
                 .join(runs_b.drop("fault_times", "fault_spans"), "run_id")
                 .select(*DELIVERED_COLUMNS, F.col("first.t").alias("t_first")))
    return matched.select(*DELIVERED_COLUMNS).unionByName(unmatched.drop("t_first")), unmatched
