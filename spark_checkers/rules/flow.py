"""The MQTT 5 flow-control rules: no more QoS > 0 PUBLISH packets unacknowledged on a connection than the
client's Receive Maximum (over the PUBLISH packets of the connections that declared one: ``in_flight``), and no
PUBLISH larger than its Maximum Packet Size (over each delivery's packet-id slot)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from contracts.history_schema import Kind
from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import client, delivery_identity, publisher, since_origin
from spark_checkers.rules.registry import IN_FLIGHT, SLOTS, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


@rule("flow.packet_too_large", SLOTS)
def packet_too_large():
    return (F.col("packet_size") > F.col("max_packet_size"), since_origin(), *delivery_identity(), "packet_size",
            "max_packet_size")


def in_flight(events, clients_b, runs_b, by: tuple[str, ...]):
    """One row per QoS > 0 PUBLISH that arrived on an MQTT 5 connection whose CONNECT sent a Receive Maximum, with
    how many QoS > 0 PUBLISH packets of that connection were then unacknowledged, itself included (``in_flight``).

    A PUBLISH is its arrival row: the delivery of a QoS 1 message, the qos2_received of a QoS 2 one (its delivery
    row is the release, at the PUBREL); it is acknowledged by the client's delivery_ack_sent row (PUBACK,
    PUBCOMP).  Counted per (connection, packet id): an arrival opens the slot unless it is open already (a resend
    of the same packet), an ack closes an open one; the running sum over the connection's rows in ``seq`` order is
    what was in flight.  The order is causal: an ack row is recorded in the loop turn that wrote it
    (harness/clients.py), before any later read.  A connection counts afresh: the quota is not part of the session
    (MQTT 5 §4.9), and a message resent after a reconnect takes a slot of the new connection."""
    rows = events.filter(F.col("kind").isin(Kind.QOS2_RECEIVED, Kind.DELIVERY_ACK_SENT)
                         | ((F.col("kind") == Kind.DELIVERY) & (F.col("qos") == 1))).select(
        "run_id", "client", "seq", F.col("t_mono_us").alias("t"), "packet_id", "publisher", "pub_seq", "node", "qos",
        (F.col("kind") != Kind.DELIVERY_ACK_SENT).alias("arrival"))
    rows = (rows.repartition(*by).join(F.broadcast(clients_b.select("run_id", "client", "connect_seqs", "conn_limits")),
                                       ["run_id", "client"])
            .withColumn("conn", sql("size(filter(coalesce(connect_seqs, array()), x -> x < seq))"))
            .withColumn("limits", sql("CASE WHEN conn > 0 THEN try_element_at(conn_limits, conn) END"))
            .filter(F.col("limits.receive_maximum").isNotNull()).drop("connect_seqs", "conn_limits"))
    slot = Window.partitionBy("run_id", "client", "conn", "packet_id").orderBy("seq")
    was_open = F.coalesce(F.lag("arrival").over(slot), F.lit(False))
    rows = rows.select("*", F.when(F.col("arrival") & ~was_open, 1).when(~F.col("arrival") & was_open, -1)
                       .otherwise(0).alias("delta"))
    connection = Window.partitionBy("run_id", "client", "conn").orderBy("seq").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return (rows.select("*", F.sum("delta").over(connection).alias("in_flight")).filter(F.col("delta") == 1)
            .join(runs_b.select("run_id", "t_origin"), "run_id"))


# [MQTT-3.3.4-9]: the Server MUST NOT send more than Receive Maximum QoS 1 and QoS 2 PUBLISH packets for which it has
# not received PUBACK, PUBCOMP, or PUBREC with a Reason Code of 128 or greater.
@rule("flow.receive_maximum", IN_FLIGHT)
def receive_maximum():
    return (F.col("in_flight") > F.col("limits.receive_maximum"), since_origin(), client(), publisher(), "pub_seq",
            "packet_id", "qos", "t", "seq", witness_name("node"), "t_origin", "in_flight",
            F.col("limits.receive_maximum").alias("receive_maximum"), F.col("limits.t").alias("t_connect"))


@explains("flow.receive_maximum")
def _receive_maximum(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} (QoS {w.get('qos')}, packet id {w.get('packet_id')}) at "
            f"{seconds(w.get('t'), o)} with {w.get('in_flight') - 1} QoS > 0 PUBLISH packet(s) of the same connection "
            f"still unacknowledged: {w.get('in_flight')} in flight, more than the Receive Maximum "
            f"{w.get('receive_maximum')} its CONNECT at {seconds(w.get('t_connect'), o)} declared [MQTT-3.3.4-9].")


@explains("flow.packet_too_large")
def _packet_too_large(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}) in a "
            f"PUBLISH packet of {w.get('packet_size')} bytes, larger than the Maximum Packet Size "
            f"{w.get('max_packet_size')} its connection's CONNECT declared: the broker must discard a packet too large "
            "to send [MQTT-3.1.2-24], [MQTT-3.1.2-25].")
