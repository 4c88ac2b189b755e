"""The liveness rule over delivered messages: a QoS > 0 delivery the subscriber never acknowledged.  The owed
messages never seen over time (liveness.unseen_over_time) are a reported series of the metrics
(job/metrics.py: owed_metrics), not a rule."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.rules.columns import first_delivery, real, since_origin
from spark_checkers.rules.registry import MESSAGES, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


@rule("liveness.stuck_inflight", MESSAGES)
def stuck_inflight():
    return (real() & (F.col("any_unacked") == 1) & F.col("first_ack_seq").isNull(), since_origin("first.t"),
            *first_delivery())


@explains("liveness.stuck_inflight")
def _stuck_inflight(w: dict[str, Any], timeline: Timeline) -> str:
    return f"{w['client']} received {message(w)} at {seconds(w.get('t'), timeline.t_first)} and never acknowledged it."
