"""The expiry rules over delivered messages: nothing delivered after its expiry, and the remaining expiry a
delivery carries reduced by the time the message waited.  A queued message dropped before its expiry is a loss
rule's (losses.py: expiry.dropped_early)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.rules.columns import first_delivery, real, since_origin, tolerance
from spark_checkers.rules.registry import MESSAGES, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


@rule("expiry.delivered_expired", MESSAGES)
def delivered_expired():
    return (real() & (F.col("t_last") > F.col("deadline") + tolerance()), F.col("t_last") - F.col("t_origin"),
            *first_delivery(), "t_last", "expiry_s", "deadline", "tol_us")


# Remaining expiry is whole seconds (rounding may add up to 1 s): t + remaining must not pass the deadline.
@rule("expiry.remaining_not_reduced", MESSAGES)
def remaining_not_reduced():
    not_reduced = F.col("expiry_s").isNotNull() & (F.col("implied_deadline") > F.col("deadline") + tolerance() + 1_000_000)
    return (real() & not_reduced, since_origin("first.t"), *first_delivery(), "expiry_s", "implied_deadline",
            "deadline")


@explains("expiry.delivered_expired")
def _delivered_expired(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{message(w)} expired at {seconds(w.get('deadline'), o)} (expiry {w.get('expiry_s') or 'default TTL'} s) "
            f"but {w['client']} received it at {seconds(w.get('t_last'), o)}, beyond the {w.get('tol_us', 0) // 1000} ms "
            f"clock tolerance.")


@explains("expiry.remaining_not_reduced")
def _remaining_not_reduced(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    late = (w.get("implied_deadline", 0) - w.get("deadline", 0)) / 1e6
    return (f"{message(w)} (expiry {w.get('expiry_s')} s, published at {seconds(w.get('t_invoke'), o)}) reached "
            f"{w['client']} at {seconds(w.get('t'), o)} with a remaining expiry {late:.1f} s longer than the time left.")
