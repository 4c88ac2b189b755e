"""The witness columns and conditions several rule families share, and the per-message table the MESSAGES rules
read (``message_table``: every delivered message with the publish it claims to be)."""

from __future__ import annotations

from pyspark.sql import functions as F

from spark_checkers.job.clock import skew_late
from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.job.subscribers import expiry_deadline
from spark_checkers.timeline import NEVER


def qos_positive():
    return F.coalesce("qos", F.lit(0)) > 0


def tolerance():
    """The run's clock tolerance (the runs table's ``tol_us``)."""
    return F.col("tol_us")


def since_origin(column: str = "t"):
    """A time as the sort key of a witness: since the run's first event."""
    return F.col(column) - F.col("t_origin")


def client():
    return witness_name("client")


def publisher():
    return witness_name("publisher")


def delivery_identity() -> list:
    """The witness columns of one delivery (a SLOTS row)."""
    return [client(), publisher(), "pub_seq", "packet_id", "dup", "qos", "t", "seq", witness_name("node"), "t_origin"]


def first_delivery() -> list:
    """The witness columns of a delivered message by its first delivery (a MESSAGES row)."""
    return [client(), publisher(), "pub_seq", F.col("first.t").alias("t"), F.col("first.packet_id").alias("packet_id"),
            witness_name("first.node", "node"), "t_invoke", "t_ack", "t_origin", witness_name("topic")]


def only_shared():
    """The client holds only shared subscriptions matching the topic ($share/NAME/FILTER): the delivery is its
    group's message (spark_checkers/shared.py), handed to whichever member the broker chose."""
    return sql("exists(coalesce(subs, array()), x -> x.client = client) AND"
               " NOT exists(coalesce(subs, array()), x -> x.client = client AND NOT x.shared)")


def real():
    """The delivered message is one that was published (not a phantom: durability.phantom)."""
    return F.col("phantom_reason").isNull()


def publisher_may_have_resent():
    """The publisher may have sent the message twice: published more than once, or disconnected before its ack."""
    return (F.coalesce("n_invoke", F.lit(0)) > 1) | sql(
        f"exists(coalesce(pub_disconnects, array()), d -> d.t >= t_invoke AND d.t <= coalesce(t_ack, t_fail, {NEVER}L))")


def message_table(delivered, runs_b, match_b, clients_b):
    """The MESSAGES rows: each delivered (subscriber, message) of ``delivered`` (subscribers.delivered_messages)
    with the publish it claims to be, why it is a phantom if it is one, and its expiry deadline.  The per-run and
    per-client arrays are looked up here, by broadcast, rather than stored with every materialised row."""
    dr = (delivered.join(runs_b.select("run_id", "fault_times", "fault_spans", "clock_rows"), "run_id")
          .join(match_b, ["run_id", "topic"], "left")
          .join(clients_b.select("run_id", "client", "disconnects", "connects", "new_sessions"), ["run_id", "client"],
                "left")
          .join(clients_b.select("run_id", F.col("client").alias("publisher"),
                                 F.col("disconnects").alias("pub_disconnects")), ["run_id", "publisher"], "left"))
    phantom_reason = (F.when(F.col("publisher").isNull() | F.col("pub_seq").isNull(), F.lit("payload identity unreadable"))
                      .when(F.col("n_invoke").isNull() | (F.col("n_invoke") == 0), F.lit("never published"))
                      .when((F.col("min_hash") != F.col("pub_hash")) | (F.col("max_hash") != F.col("pub_hash")),
                            F.lit("body hash differs from the published one")))
    # How late a broker whose clock moved between the publish and the last delivery may still deliver the
    # message, or count its remaining interval (docs/clock-model.md; rules/expiry.py): 0 without clock rows.
    return dr.select("*", phantom_reason.alias("phantom_reason"), expiry_deadline().alias("deadline"),
                     skew_late("t_invoke", "t_last").alias("skew_late_us")).drop("clock_rows")
