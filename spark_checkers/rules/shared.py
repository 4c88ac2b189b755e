"""The shared-subscription rules over the SHARED rows (spark_checkers/shared.py: one per group and message on a
topic its filter matches): the group got every message it was owed, at least once; none went to a second member
after a member had acknowledged it; how many went to more than one member (counted)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import publisher, since_origin
from spark_checkers.rules.registry import SHARED, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline

# The members that got the message, each as a coded name (named again after the collect, job/codes.py).
_MEMBERS = "transform(coalesce(got, array()), g -> concat(char(0), cast(g.client AS STRING)))"
# A member acknowledged it at a.ack_t and its connection lived on for the clock tolerance after (so the PUBACK left
# its socket), then another member got it, with no fault or node event of the target in between (a killed node's
# uncommitted acknowledgements are read again by the next: at least once, MQTT 4.8.2).
_AFTER_ACK = ("exists(coalesce(got, array()), a -> a.ack_t IS NOT NULL"
              " AND NOT (a.ack_end IS NOT NULL AND a.ack_end - a.ack_t < tol_us)"
              " AND exists(got, b -> b.client <> a.client AND b.t > a.ack_t + tol_us"
              " AND NOT exists(coalesce(fault_spans, array()), x -> x.s <= b.t AND x.e + slack_us >= a.ack_t)))")


def _message() -> tuple:
    return ("group", publisher(), "pub_seq", witness_name("topic"), "t_invoke", "t_ack", "t_origin")


# MQTT 5 §4.8.2: each message goes to one of the group's sessions, and one a member left with unacknowledged (its
# session ending) goes to another member; at least once for the group, QoS 1 and 2 alike.
# Settled for the group: a member acknowledged it, or holds it on a connection the history ends with.
_SETTLED = "exists(coalesce(got, array()), g -> g.ack_t IS NOT NULL OR g.conn_end IS NULL)"


@rule("shared.lost", SHARED)
def shared_lost():
    return (F.col("owed") & ~sql(_SETTLED), since_origin("t_invoke"), *_message(), sql(_MEMBERS).alias("members"))


@rule("shared.redelivered_after_ack", SHARED)
def shared_redelivered_after_ack():
    return (sql(_AFTER_ACK), since_origin("t_first"), *_message(), sql(_MEMBERS).alias("members"),
            "n_deliveries")


@rule("shared.duplicates", SHARED)
def shared_duplicates():
    return (F.col("n_members") > 1, since_origin("t_first"), *_message(), sql(_MEMBERS).alias("members"),
            "n_deliveries")


@explains("shared.lost")
def _lost(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    members = w.get("members") or []
    got = (f"only {', '.join(str(m) for m in members)} got it, never acknowledged it, and its connection ended"
           if members else "no member of the group got it")
    return (f"{message(w)} on {w.get('topic')}, acknowledged to its publisher at {seconds(w.get('t_ack'), o)} while "
            f"{w.get('group')} had a member: {got}; by the end of the history it was never sent again.")


@explains("shared.redelivered_after_ack")
def _after_ack(w: dict[str, Any], timeline: Timeline) -> str:
    members = ", ".join(str(m) for m in w.get("members") or [])
    return (f"{message(w)} of {w.get('group')} was acknowledged by one member and then sent to another "
            f"(members that got it: {members}; {w.get('n_deliveries')} deliveries in all), with no fault between.")


@explains("shared.duplicates")
def _duplicates(w: dict[str, Any], timeline: Timeline) -> str:
    members = ", ".join(str(m) for m in w.get("members") or [])
    return (f"{message(w)} of {w.get('group')} went to {len(w.get('members') or [])} members ({members}), "
            f"{w.get('n_deliveries')} deliveries in all.")
