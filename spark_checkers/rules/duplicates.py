"""The duplicate rules over delivered messages: nothing delivered again after the subscriber acknowledged it
(QoS 1, and QoS 2's exactly once), and no message twice within one connection (a backlog sent twice)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import first_delivery, publisher_may_have_resent, real
from spark_checkers.rules.registry import MESSAGES, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


def _redelivered():
    """Redelivered after the subscriber acked; legal only if the connection died within the tolerance after the
    ack (the PUBACK may never have left the socket)."""
    ack_maybe_lost = sql("exists(coalesce(disconnects, array()), d -> d.seq > first_ack_seq AND d.seq < redelivery.seq"
                         " AND d.t - first_ack_t < tol_us)")
    return real() & (F.col("n_after_ack") > 0) & ~ack_maybe_lost


def _redelivery_witness() -> tuple:
    """(sort key, *witness columns) of a redelivery after the ack."""
    return (F.col("redelivery.t") - F.col("t_origin"), *first_delivery(), "first_ack_t",
            F.col("redelivery.t").alias("t_redelivery"), F.col("redelivery.packet_id").alias("redelivery_packet_id"),
            "n_after_ack")


@rule("duplicates.redelivered_after_ack", MESSAGES)
def redelivered_after_ack():
    return _redelivered() & (F.coalesce("qos", F.lit(0)) < 2), *_redelivery_witness()


@rule("duplicates.qos2", MESSAGES)
def qos2_twice():
    return _redelivered() & (F.col("qos") == 2), *_redelivery_witness()


# The same message twice within one connection (not the resend of one packet, nor a retained copy beside the
# normal forward: the ``twice`` column, job/messages.py): a backlog sent twice.  Only a fault around the
# message's life (a save repeated after a failure, a rolled-back removal) or a publisher that may have sent it
# twice (published more than once, or disconnected before its ack) excuses it.
@rule("duplicates.backlog_twice_in_connection", MESSAGES)
def backlog_twice_in_connection():
    fault_near = sql("exists(coalesce(fault_spans, array()), x -> x.s <= twice.t"
                     " AND x.e + slack_us >= t_invoke - slack_us)")
    return (real() & F.col("twice").isNotNull() & ~fault_near & ~publisher_may_have_resent(),
            F.col("twice.t") - F.col("t_origin"), *first_delivery(), F.col("twice.t").alias("t_again"),
            F.col("twice.packet_id").alias("again_packet_id"), F.col("twice.dup").alias("again_dup"),
            F.col("twice.prev_t").alias("prev_t"), F.col("twice.prev_packet_id").alias("prev_packet_id"),
            "n_deliveries")


@explains("duplicates.redelivered_after_ack", "duplicates.qos2")
def _redelivered_after_ack(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} acknowledged {message(w)} at {seconds(w.get('first_ack_t'), o)} and received it again at "
            f"{seconds(w.get('t_redelivery'), o)} (packet id {w.get('redelivery_packet_id')}); "
            f"{w.get('n_after_ack')} redelivery(ies) after the ack.")


@explains("duplicates.backlog_twice_in_connection")
def _backlog_twice(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}) and "
            f"again at {seconds(w.get('t_again'), o)} (packet id {w.get('again_packet_id')}, DUP "
            f"{'1' if w.get('again_dup') else '0'}) on the same connection, with no reconnect between and no fault "
            f"around the message; {w.get('n_deliveries')} deliveries of it in all.")
