"""The clock model's skew bounds per row, in Spark (docs/clock-model.md): over a window [a, b], how far the
offsets of one role's nodes (the brokers, the Redis nodes) spread, from the runs table's ``clock_rows``
(timeline.py ``clock_segments``).  Higher-order functions over that small array, no UDF: a run without clock rows
has an empty array, and every skew is 0."""

from __future__ import annotations

from spark_checkers.job.columns import sql
from spark_checkers.timeline import BROKER, REDIS


def spread_sql(role: str, a: str, b: str) -> str:
    """SQL of max(0, sup − inf) over [a, b] of the offsets of ``role``'s nodes (µs): the stretches of the clock
    timeline that overlap the window, their largest offset minus their smallest (timeline.segments_skew_us)."""
    seen = f"filter(coalesce(clock_rows, array()), s -> s.role = '{role}' AND s.t_from <= {b} AND s.t_to > {a})"
    return f"coalesce(array_max(transform({seen}, s -> s.hi)) - array_min(transform({seen}, s -> s.lo)), 0L)"


def skew_early(a: str, b: str):
    """δ⁺_msg over [a, b]: how early any broker may judge a message's expiry another stamped, plus how far the
    Redis nodes' clocks spread (a stored copy's TTL, judged by its master or by the one a failover promotes)."""
    return sql(f"{spread_sql(BROKER, a, b)} + {spread_sql(REDIS, a, b)}")


def skew_late(a: str, b: str):
    """δ⁻_msg over [a, b]: how late any broker may still deliver a message (or count its remaining interval)
    against another's stamp."""
    return sql(spread_sql(BROKER, a, b))
