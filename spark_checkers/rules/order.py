"""The order rules: packet ids in range and not reused while held, the DUP flag, resends within a connection
(over each delivery's packet-id slot), and each stream's messages first delivered in publish order."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import (
    delivery_identity,
    first_delivery,
    only_shared,
    qos_positive,
    since_origin,
)
from spark_checkers.rules.registry import MESSAGES, SLOTS, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


@rule("order.packet_id_invalid", SLOTS)
def packet_id_invalid():
    invalid = qos_positive() & (F.col("packet_id").isNull() | (F.col("packet_id") <= 0) | (F.col("packet_id") > 65535))
    return invalid, since_origin(), *delivery_identity()


@rule("order.packet_id_reused", SLOTS)
def packet_id_reused():
    return (F.col("reused"), since_origin(), *delivery_identity(), witness_name("prev_publisher"), "prev_pub_seq",
            "prev_t")


@rule("order.dup_flag", SLOTS)
def resend_without_dup():
    return (F.col("resend") & ~F.coalesce("dup", F.lit(False)), since_origin(), *delivery_identity(),
            F.lit("resend without DUP").alias("problem"))


# [MQTT-3.3.1-2] / [MQTT-4.3.1-1] (3.1.1 [MQTT-3.3.1-2]): a QoS 0 PUBLISH is never a resend, its DUP flag MUST be 0.
@rule("order.dup_flag", SLOTS)
def dup_on_qos0():
    return ((F.coalesce("qos", F.lit(0)) == 0) & F.coalesce("dup", F.lit(False)), since_origin(),
            *delivery_identity(), F.lit("DUP = 1 on a QoS 0 PUBLISH, which is never a resend ([MQTT-3.3.1-2])")
            .alias("problem"))


# MQTT 5 §4.4 [MQTT-4.4.0-1]: unacknowledged PUBLISH packets are resent only on a reconnect (Clean Start 0,
# session present), never within the connection they were sent on.  MQTT 3.1.1 §4.4 only says when a
# resend is required, it forbids none: its connections are not judged.
@rule("order.resend_within_connection", SLOTS)
def resend_within_connection():
    return (F.col("resend") & (F.col("prev_conn") == F.col("conn")) & (F.col("protocol") == 5), since_origin(),
            *delivery_identity(), "prev_t", "protocol")


# DUP = 1 on the first *observed* receipt is legal when the receiving connection was established after the
# publish: the broker may have sent it on an older connection the client had already lost (a disconnect the
# broker never saw, e.g. during a partition) and resends it on the new one (MQTT 3.1.1 §4.4 / MQTT 5 §4.4).
# Invoked after the current connection was established, it cannot have been sent before: DUP is illegal.  Not for
# a shared group's member: a message another member left unacknowledged comes to it as a resend (DUP 1).
@rule("order.dup_flag", MESSAGES)
def first_delivery_with_dup():
    connected_since_publish = sql("exists(coalesce(connects, array()), c -> c.t > t_invoke AND c.seq < first.seq)")
    return (F.coalesce(F.col("first.dup"), F.lit(False)) & qos_positive() & ~connected_since_publish & ~only_shared(),
            since_origin("first.t"), *first_delivery(),
            F.lit("DUP on a first delivery on a connection established before the publish").alias("problem"))


# First deliveries of each (subscriber, publisher, topic, QoS) stream by pub_seq (messages.with_stream_neighbour).
# Not where the client holds only shared subscriptions matching the topic: a group's messages are spread over its
# members and a leaving member's are handed to another (MQTT 5 §4.8.2), so no member's share keeps the order.
@rule("order.out_of_order", MESSAGES)
def out_of_order():
    return ((F.col("pub_seq") < F.col("prev_max.pub_seq")) & ~only_shared(), since_origin("first.t"), *first_delivery(),
            F.col("prev_max.pub_seq").alias("after_pub_seq"), F.col("prev_max.t").alias("after_t"),
            F.col("prev_max.packet_id").alias("after_packet_id"),
            # A wrap only where one session's stored counter went 65535 -> 1 between the two; ids that restart
            # with a new session, or a clean session's per-connection ids, did not wrap.
            (F.col("first.stored") & F.col("prev_max.stored") & (F.col("first.epoch") == F.col("prev_max.epoch"))
             & (F.col("first.packet_id") < F.col("prev_max.packet_id"))).alias("across_wrap"),
            (F.col("first.conn") != F.col("prev_max.conn")).alias("across_reconnect"),
            (F.col("first.epoch") != F.col("prev_max.epoch")).alias("across_new_session"),
            sql("exists(fault_times, x -> x >= prev_max.t AND x <= first.t)").alias("across_failover"))


@explains("order.out_of_order")
def _out_of_order(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    flags = [name for name, key in (("a packet-id wrap", "across_wrap"), ("a new session", "across_new_session"),
                                    ("a reconnect", "across_reconnect"), ("a failover", "across_failover"))
             if w.get(key)]
    return (f"{w['client']} received {w['publisher']}#{w.get('after_pub_seq')} at {seconds(w.get('after_t'), o)} "
            f"(packet id {w.get('after_packet_id')}) and only then #{w['pub_seq']} at {seconds(w.get('t'), o)} "
            f"(packet id {w.get('packet_id')})" + (f", across {' and '.join(flags)}" if flags else "") + ".")


@explains("order.packet_id_invalid")
def _packet_id_invalid(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), o)} with packet id {w.get('packet_id')} "
            f"(QoS {w.get('qos')}).")


@explains("order.packet_id_reused")
def _packet_id_reused(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), o)} with packet id {w.get('packet_id')}, "
            f"still held unacknowledged by {w.get('prev_publisher')}#{w.get('prev_pub_seq')} delivered at "
            f"{seconds(w.get('prev_t'), o)}.")


@explains("order.resend_within_connection")
def _resend_within_connection(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('prev_t'), o)} and again at "
            f"{seconds(w.get('t'), o)} (packet id {w.get('packet_id')}, DUP {'1' if w.get('dup') else '0'}) on the "
            "same MQTT 5 connection before acknowledging it: MQTT 5 allows a resend only after a reconnect "
            "[MQTT-4.4.0-1].")


@explains("order.dup_flag")
def _dup_flag(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}): "
            f"{w.get('problem')}.")
