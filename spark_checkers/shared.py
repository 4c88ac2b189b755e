"""Shared subscriptions (MQTT 5 §4.8.2): a group ``$share/NAME/FILTER`` is owed each message once, whichever member
gets it.  The small side gives the groups (``shared_groups``: each group's members and the times some member held
the subscription); ``shared_table`` gives the SHARED rows the rules of rules/shared.py read, one per (group,
message on a topic its filter matches): whether the group was owed it, and what each member got of it.

Reached the group: a member acknowledged it, or got it on a connection still open when the history ends.  A copy
a member got and left unacknowledged when its connection ended is still owed (MQTT 4.4: it is resent, to that
member's resumed session or, MQTT 5 §4.8.2, to another member).

A member's own subscription owes it nothing (job/side_tables.py: never persistent, so no member is a candidate of
the per-subscriber rules), and no member's share is judged for order (rules/order.py); every other rule over a
delivery (phantoms, QoS, DUP, packet ids, expiry, a delivery outside the member's filter) judges the members like
any subscriber.

Owed to the group: a QoS 1 publish (QoS 2 too where no member's subscription ended: one whose member's session
ended mid-flight goes to no other member, [MQTT-4.8.2-5]) acknowledged by the broker while some member held the
subscription (granted QoS > 0), with the group held without a break from then to the end of the history (a group whose last member's
session ended may drop what it held: the subscription ends with the last session attached to it), that cannot have
expired by the end, and with no fault the target never promised to survive after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F
from pyspark.sql import types as T

from contracts.topics import filter_matches, shared_filter
from spark_checkers.job.codes import code_of
from spark_checkers.job.columns import sql
from spark_checkers.job.events import local_frame
from spark_checkers.timeline import Timeline

SHARED_INVARIANTS = ("shared.lost", "shared.redelivered_after_ack", "shared.duplicates")
NO_SHARED = "no client of this run held a shared subscription ($share/NAME/FILTER): nothing to judge"


@dataclass(frozen=True)
class SharedGroup:
    """One shared subscription of a run: its text ($share/NAME/FILTER), its members and ``cover``, the merged
    intervals (t_from, t_to or None: held to the end) in which some member held it with a QoS > 0 grant."""

    name: str
    topic_filter: str
    members: tuple[str, ...]
    cover: tuple[tuple[int, int | None], ...]
    # No member's subscription ended (a new session, an UNSUBSCRIBE): a QoS 2 message is then owed too (one whose
    # member's session ended mid-flight must go to no other member, [MQTT-4.8.2-5]).
    stable: bool = True


def shared_groups(timeline: Timeline) -> list[SharedGroup]:
    """The run's shared groups, from its subscriptions (granted ones: a refused SUBSCRIBE holds nothing)."""
    held: dict[str, list] = {}
    for s in timeline.subscriptions:
        if shared_filter(s.topic_filter) is not None and (s.granted_qos or 0) > 0:
            held.setdefault(s.topic_filter, []).append(s)
    groups = []
    for name, subs in sorted(held.items()):
        cover: list[list] = []
        # Why merged: the group lives while any member holds it; the members' intervals overlap and chain.
        for s in sorted(subs, key=lambda x: x.t_from):
            if cover and (cover[-1][1] is None or s.t_from <= cover[-1][1]):
                if cover[-1][1] is not None:
                    cover[-1][1] = None if s.t_to is None else max(cover[-1][1], s.t_to)
            else:
                cover.append([s.t_from, s.t_to])
        groups.append(SharedGroup(name, shared_filter(name) or "", tuple(sorted({s.client for s in subs})),
                                  tuple((a, b) for a, b in cover), all(s.t_to is None for s in subs)))
    return groups


def has_shared(timelines: dict[str, Timeline]) -> bool:
    return any(shared_groups(t) for t in timelines.values())


def shared_table(spark, pub, per_message, timelines: dict[str, Timeline], topics: dict[str, list[str]], runs_b,
                 clients_b):
    """The SHARED rows: one per (run, group, message published to a topic the group's filter matches)."""
    group_rows, member_rows = [], []
    for run_id, timeline in timelines.items():
        for group in shared_groups(timeline):
            matched = [code_of(t) for t in topics.get(run_id, []) if filter_matches(group.topic_filter, t)]
            cover = [(a, b) for a, b in group.cover]
            group_rows += [(run_id, group.name, topic, cover, timeline.t_last, group.stable) for topic in matched]
            member_rows += [(run_id, code_of(member), group.name) for member in group.members]
    groups_b = F.broadcast(local_frame(spark, group_rows, T.StructType([
        T.StructField("run_id", T.StringType()), T.StructField("group", T.StringType()),
        T.StructField("topic", T.LongType()),
        T.StructField("cover", T.ArrayType(T.StructType([T.StructField("a", T.LongType()),
                                                         T.StructField("b", T.LongType())]))),
        T.StructField("t_end", T.LongType()), T.StructField("stable", T.BooleanType())])))
    members_b = F.broadcast(local_frame(spark, member_rows, "run_id string, client long, group string"))
    # What each member got of each message: its first delivery, its first ack, when its connection ended after
    # that ack (an ack the socket may never have carried) and after the first delivery (null: still open at the
    # end of the history).
    def first_disconnect_after(t: str):
        return sql(f"aggregate(filter(coalesce(disconnects, array()), d -> d.t >= {t}), CAST(NULL AS BIGINT),"
                   " (m, d) -> coalesce(least(m, d.t), d.t))")

    got = (per_message.join(members_b, ["run_id", "client"])
           .join(clients_b.select("run_id", "client", "disconnects"), ["run_id", "client"], "left")
           .select("run_id", "group", "publisher", "pub_seq", "n_deliveries", F.struct(
               F.col("first.t").alias("t"), "client", F.col("first_ack_t").alias("ack_t"),
               first_disconnect_after("first_ack_t").alias("ack_end"),
               first_disconnect_after("first.t").alias("conn_end")).alias("got")))
    got = got.groupBy("run_id", "group", "publisher", "pub_seq").agg(
        # in the order the members first got it (a struct sorts by its first field): the same witness every time
        F.array_sort(F.collect_list("got")).alias("got"), F.count(F.lit(1)).alias("n_members"),
        F.sum("n_deliveries").alias("n_deliveries"), F.min("got.t").alias("t_first"))
    rows = (pub.filter(F.col("n_invoke") > 0).join(groups_b, ["run_id", "topic"])
            .join(got, ["run_id", "group", "publisher", "pub_seq"], "left")
            .join(runs_b.select("run_id", "ttl_us", "tol_us", "slack_us", "t_origin", "fault_spans",
                                "unpromised_times"), "run_id"))
    deadline = F.col("t_invoke") + F.coalesce(F.col("expiry_s") * 1_000_000, F.col("ttl_us"))
    qos = F.coalesce("pub_qos", F.lit(0))
    owed = (((qos == 1) | ((qos == 2) & F.col("stable"))) & F.col("t_ack").isNotNull()
            & sql("exists(cover, c -> c.a < t_invoke AND c.b IS NULL)")
            & (deadline.isNull() | (deadline > F.col("t_end")))
            & ~sql("exists(coalesce(unpromised_times, array()), x -> x >= t_invoke - slack_us)"))
    return rows.select("*", owed.alias("owed"))
