"""The QoS rules: every delivered message at the QoS its publish and the subscriber's grants allow (over each
delivered message), and a QoS 2 message the subscriber answered with PUBREC released after its session resumed
(over the QoS 2 flows: ``qos2_flows``).

Which grants a delivery is judged against: a subscription of the client matching the topic *held* at some time
between the publish and the last delivery (± the clock tolerance) may have routed it, so none may be exceeded
(qos.above_grant); one held *throughout* (subscribed before the publish was invoked, not ended until after the
last delivery + the tolerance) certainly routed it, so the message is owed at least min(published, its grant)
(qos.downgraded).  A re-subscribe that changed the grant in between makes neither subscription held throughout:
the lower bound then comes only from the lowest grant held at all."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from contracts.history_schema import Kind
from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import client, first_delivery, publisher, real, since_origin
from spark_checkers.rules.registry import MESSAGES, QOS2_FLOWS, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline

# A subscription of the receiving client (``x`` over the message's ``subs``) held at some time between the publish
# and the last delivery, and one held throughout that span.
HELD = "x.client = client AND x.t_from <= t_last + tol_us AND (x.t_to IS NULL OR x.t_to >= t_invoke - tol_us)"
THROUGHOUT = "x.client = client AND x.t_from < t_invoke AND (x.t_to IS NULL OR x.t_to > t_last + tol_us)"
NO_GRANT = 3  # above every QoS: the least grant of no subscription


def held(condition: str = HELD) -> str:
    """The client's subscriptions matching the message's topic that ``condition`` holds for, as SQL."""
    return f"filter(coalesce(subs, array()), x -> {condition})"


def _max_grant(condition: str):
    return sql(f"aggregate({held(condition)}, -1, (a, x) -> greatest(a, x.granted))")


def _min_grant():
    return sql(f"aggregate({held()}, {NO_GRANT}, (a, x) -> least(a, x.granted))")


def _qos_witness() -> tuple:
    return (since_origin("first.t"), *first_delivery(), F.col("qos").alias("delivered_qos"), "min_qos", "pub_qos")


@rule("qos.upgraded", MESSAGES)
def upgraded():
    return real() & (F.col("qos") > F.col("pub_qos")), *_qos_witness()


@rule("qos.above_grant", MESSAGES)
def above_grant():
    granted = _max_grant(HELD)
    return (real() & (granted >= 0) & (F.col("qos") > granted), *_qos_witness(), granted.alias("max_granted"))


# Overlapping subscriptions: the server delivers once at the maximum QoS of them, or once per subscription at its
# own ([MQTT-3.3.4-2], 3.1.1 [MQTT-3.3.5-1]).  So the highest copy must reach what the strongest subscription held
# throughout owes, and no copy may fall below the lowest grant held at all.
@rule("qos.downgraded", MESSAGES)
def downgraded():
    strongest, lowest = _max_grant(THROUGHOUT), _min_grant()
    below_strongest = (strongest >= 0) & (F.col("qos") < F.least(F.col("pub_qos"), strongest))
    below_every = (lowest < NO_GRANT) & (F.col("min_qos") < F.least(F.col("pub_qos"), lowest))
    return (real() & F.col("pub_qos").isNotNull() & (below_strongest | below_every), *_qos_witness(),
            strongest.alias("granted_throughout"), lowest.alias("lowest_granted"))


def _delivered(w: dict[str, Any], o: int) -> str:
    return (f"{w['client']} received {message(w)} on {w.get('topic')} at {seconds(w.get('t'), o)} (packet id "
            f"{w.get('packet_id')})")


@explains("qos.upgraded")
def _upgraded(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"{_delivered(w, timeline.t_first)} at QoS {w.get('delivered_qos')}, but it was published at QoS "
            f"{w.get('pub_qos')}: a message goes out at the lower of its published QoS and the grant, never above "
            "its published QoS [MQTT-3.8.4-8] (MQTT 3.1.1 [MQTT-3.8.4-6]).")


@explains("qos.above_grant")
def _above_grant(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"{_delivered(w, timeline.t_first)} at QoS {w.get('delivered_qos')} (published at QoS {w.get('pub_qos')}), "
            f"above QoS {w.get('max_granted')}, the highest any of its subscriptions matching the topic was granted "
            "between the publish and the delivery [MQTT-3.8.4-8] (MQTT 3.1.1 [MQTT-3.8.4-6]).")


@explains("qos.downgraded")
def _downgraded(w: dict[str, Any], timeline: Timeline) -> str:
    strongest, lowest, published = w.get("granted_throughout"), w.get("lowest_granted"), w.get("pub_qos")
    owed = min(published, strongest) if published is not None and strongest is not None and strongest >= 0 else None
    if owed is not None and (w.get("delivered_qos") or 0) < owed:
        why = (f"at most QoS {w.get('delivered_qos')}; published at QoS {published} to a subscription granted QoS "
               f"{strongest} from before the publish until after the delivery, it is owed QoS {owed} (overlapping "
               "subscriptions: at least once at the highest of their grants [MQTT-3.3.4-2])")
    else:
        why = (f"a copy at QoS {w.get('min_qos')}, below QoS {min(published or 0, lowest or 0)}, the lowest that its "
               f"published QoS {published} and every matching subscription's grant (lowest {lowest}) allow")
    return (f"{_delivered(w, timeline.t_first)} {why}: the QoS of a delivery is the minimum of the published QoS and "
            "the granted QoS [MQTT-3.8.4-8] (MQTT 3.1.1 [MQTT-3.8.4-6]).")


# --- QoS 2: the PUBREL owed to a resumed session -------------------------------------------------------------


def qos2_flows(events, clients_b, runs_b, by: tuple[str, ...]):
    """One row per qos2_received (a QoS 2 PUBLISH the subscriber answered with PUBREC), with what came after it:
    whether the message was released later (a delivery row of it: paho hands a QoS 2 message over at its PUBREL),
    the first PUBREL for its packet id after it (one a planned abrupt drop left unanswered, detail.held, released
    nothing) and the next use of that packet id, plus the subscriber's connects and disconnects.  Few rows: QoS 2
    only, and a version 1 history has no qos2_received rows at all."""
    kinds = (F.col("kind").isin(Kind.QOS2_RECEIVED, Kind.PUBREL_RECEIVED)
             | ((F.col("kind") == Kind.DELIVERY) & (F.col("qos") == 2)))
    rows = events.filter(kinds).select(
        "run_id", "client", "seq", F.col("t_mono_us").alias("t"), "packet_id", "publisher", "pub_seq", "node",
        (F.col("kind") == Kind.QOS2_RECEIVED).alias("received"), (F.col("kind") == Kind.PUBREL_RECEIVED).alias("pubrel"),
        F.coalesce(F.get_json_object("detail", "$.held") == "true", F.lit(False)).alias("held")).repartition(*by)
    released_at = ~F.col("received") & ~F.col("pubrel")  # a delivery row
    whole_message = Window.partitionBy("run_id", "client", "publisher", "pub_seq")
    after = Window.partitionBy("run_id", "client", "packet_id").orderBy("seq").rowsBetween(1, Window.unboundedFollowing)
    rows = rows.select(
        "*", F.max(F.when(released_at, F.col("seq"))).over(whole_message).alias("last_release_seq"),
        F.min(F.when(F.col("pubrel") & ~F.col("held"), F.col("seq"))).over(after).alias("next_pubrel_seq"),
        F.first(F.when(~F.col("pubrel"), F.struct("seq", "publisher", "pub_seq")), ignorenulls=True).over(after)
        .alias("next_use"))
    return (rows.filter(F.col("received"))
            .join(clients_b.select("run_id", "client", "connects", "fresh_seqs", "disconnects"), ["run_id", "client"], "left")
            .join(runs_b.select("run_id", "tol_us", "t_origin"), "run_id"))


# [MQTT-4.4.0-1]: on a reconnect with Clean Start 0 and a session present, the server resends every
# unacknowledged PUBLISH and PUBREL with its original packet id; after the PUBREC the server owes the PUBREL
# ([MQTT-4.3.3-4], -5).  Judged from the first accepted connect after the PUBREC: session present 1 resumed the
# session (present 0 began a new one: nothing owed; an illegal loss is durability.session_lost).  Not judged when
# the connection ended within the clock tolerance after the PUBREC (it may never have left the socket).
@rule("qos2.pubrel_not_resent", QOS2_FLOWS)
def pubrel_not_resent():
    resume = sql("element_at(filter(coalesce(connects, array()), c -> c.seq > seq), 1)")
    resumed = resume.isNotNull() & ~F.array_contains(F.coalesce("fresh_seqs", F.array()), resume["seq"])
    ended = F.least(sql("element_at(filter(coalesce(disconnects, array()), d -> d.seq > seq), 1).t"), resume["t"])
    same = F.col("next_use.publisher").eqNullSafe(F.col("publisher")) & F.col("next_use.pub_seq").eqNullSafe(F.col("pub_seq"))
    pubrel = F.col("next_pubrel_seq").isNotNull() & (
        F.col("next_use").isNull() | (F.col("next_pubrel_seq") < F.col("next_use.seq")) | same)
    released = F.coalesce(F.col("last_release_seq") > F.col("seq"), F.lit(False)) | pubrel
    return (resumed & ~released & (ended - F.col("t") >= F.col("tol_us")), since_origin(), client(), publisher(),
            "pub_seq", "packet_id", "t", "seq", witness_name("node"), "t_origin", "tol_us", ended.alias("t_ended"),
            resume["t"].alias("t_resumed"))


@explains("qos2.pubrel_not_resent")
def _pubrel_not_resent(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} answered {message(w)} (QoS 2, packet id {w.get('packet_id')}) with PUBREC at "
            f"{seconds(w.get('t'), o)}; its connection ended at {seconds(w.get('t_ended'), o)} before the PUBREL, "
            f"and the reconnect at {seconds(w.get('t_resumed'), o)} resumed the session (session present 1), but the "
            "broker never sent that PUBREL again nor released the message: a resumed session resends every "
            "unacknowledged PUBREL with its original packet id [MQTT-4.4.0-1], [MQTT-4.3.3-5].")
