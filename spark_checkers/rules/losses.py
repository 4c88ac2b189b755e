"""The loss rules: each owed message that never arrived (job/queues.py: open_messages) under the one invariant
its loss breaks (``with_cause``: lost, lost to a fault the target never promised to survive, dropped before its
expiry, trimmed under the limit or from the wrong end of the queue), their violations (``owed_checks``), and
how the report shows them: runs of consecutive lost messages as gaps (``loss_gaps``), each in words."""

from __future__ import annotations

import functools
from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.job.metrics import owed_metrics
from spark_checkers.job.queues import drops
from spark_checkers.rules.registry import explains
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import NEVER, Timeline, clock_changes

LOSS_INVARIANTS = ("durability.lost", "durability.lost_allowed", "expiry.dropped_early", "limits.trimmed_under_limit",
                   "limits.trim_not_oldest", "limits.trim_not_newest")
# Not an invariant: the never-delivered messages a moved clock explains (expired_by_clock: expired only within the
# clock's bound, docs/clock-model.md), collected beside the violations and shown with expiry.dropped_early's
# verdict (api.py) as what the clock explains: never counted as a loss, never failing the run.
EXPIRED_BY_CLOCK = "expiry.dropped_early.by_clock"
NODES_DIFFER = "the nodes' clocks differed"


def with_cause(t):
    """The never-delivered candidates of ``open_messages`` with why each was lost (``cause``: one of
    LOSS_INVARIANTS, read for the owed ones) and where in its stream (``position``)."""
    in_b = F.col("in_backlog")
    # Lost to a fault the declared persistence does not cover (a kill of a broker promising only a graceful
    # stop): the fault started before the message's chance to be delivered (the reconnect ending its offline
    # window; online: within the pipeline slack) and after it was acknowledged, or, for a queued message,
    # while its subscriber was away (the kill took the session and its queue: what was queued after it went
    # into a session the broker no longer had).
    chance = "CASE WHEN in_backlog THEN k.c ELSE t_arr + slack_us END"
    since = "CASE WHEN in_backlog THEN least(t_arr, k.d - slack_us) ELSE t_arr END"
    unpromised = sql(f"exists(unpromised_times, x -> x >= {since} AND x <= {chance})")
    not_policy = F.when(F.col("policy") == "drop_newest", F.lit("limits.trim_not_newest")).otherwise(
        F.lit("limits.trim_not_oldest"))
    cause = (F.when(unpromised, F.lit("durability.lost_allowed"))
             .when(in_b & drops() & (F.col("n_backlog") > F.col("limit")) & (F.col("trimmed_delivered") == 1),
                   not_policy)
             .when(in_b & drops() & ~F.col("immediate") & (F.col("n_settled") >= F.col("limit"))
                   & (F.col("trimmed_delivered") == 0)
                   & (F.col("max_rank_delivered_kept").isNull() | (F.col("rank") > F.col("max_rank_delivered_kept"))),
                   F.lit("limits.trimmed_under_limit"))
             .when(in_b & F.col("expiry_s").isNotNull(), F.lit("expiry.dropped_early"))
             .otherwise(F.lit("durability.lost")))
    position = (F.when(F.col("prev_delivered").isNull() & F.col("next_delivered").isNull(), F.lit("whole"))
                .when(F.col("prev_delivered").isNull(), F.lit("prefix"))
                .when(F.col("next_delivered").isNull(), F.lit("suffix")).otherwise(F.lit("middle")))
    return t.select("*", cause.alias("cause"), position.alias("position"))


def owed_checks(table, gaps):
    """The loss rules' violations (each owed, never-delivered message of ``gaps``, open_messages, under its
    cause) and the owed metrics: (violations, metrics)."""
    client, publisher = witness_name("client"), witness_name("publisher")
    lost = gaps.filter(F.col("owed"))
    # Each lost message with the whole gap it belongs to (a run of consecutive pub_seq of one stream under one
    # cause): the report shows only the first LOSS_ROWS_CAP rows, and a gap must still state its exact range.
    # Over the lost rows only (few): an island's members share pub_seq - row_number.
    stream = ["run_id", "cause", "client", "publisher"]
    island = F.col("pub_seq") - F.row_number().over(Window.partitionBy(*stream).orderBy("pub_seq"))
    lost = lost.select("*", island.alias("_island"))
    whole = Window.partitionBy(*stream, "_island")
    lost = lost.select("*", F.min("pub_seq").over(whole).alias("gap_first"),
                       F.max("pub_seq").over(whole).alias("gap_last"),
                       F.count(F.lit(1)).over(whole).alias("gap_count")).drop("_island")
    carried_into = F.col("carried_into").isNotNull()
    loss_cols = [client, publisher, "pub_seq", witness_name("topic"), "t_invoke", "t_ack", "t_origin", "expiry_s",
                 "in_backlog",
                 F.coalesce("carried_into.d", "k.d").alias("t_offline"), F.coalesce("carried_into.c", "k.c").alias("t_reconnect"),
                 F.when(carried_into, F.col("k.d")).alias("carried_from_offline"),
                 F.when(carried_into, F.col("k.c")).alias("carried_from_reconnect"),
                 F.when(~carried_into, F.col("rank")).alias("rank"),
                 F.coalesce("carried_into.n_backlog", "n_backlog").alias("n_backlog"), "limit",
                 "prev_delivered", "next_delivered", "position", witness_name("pub_node"), "policy",
                 "gap_first", "gap_last", "gap_count",
                 # only under a clock that moved (null, so left out of the JSON, without clock rows)
                 F.when(F.col("skew_early_us") > 0, F.col("skew_early_us")).alias("skew_early_us")]
    lost_w = lost.select("run_id", F.col("cause").alias("invariant"),
                         (F.col("t_invoke") - F.col("t_origin")).cast("long").alias("sort_key"),
                         F.to_json(F.struct(*loss_cols)).alias("witness"))
    # What only the clock explains: not owed for no other reason (not trimmed, not undeliverable), expired only
    # within skew_early_us of its chance (job/subscribers.py).  No row at all in a run without clock rows.
    by_clock = gaps.filter(F.col("expired_by_clock") & ~F.col("undeliverable") & ~F.col("legally_trimmed"))
    clock_cols = [client, publisher, "pub_seq", witness_name("topic"), "t_invoke", "t_ack", "t_origin", "expiry_s",
                  "in_backlog", F.col("k.d").alias("t_offline"), F.col("k.c").alias("t_reconnect"), "skew_early_us",
                  witness_name("pub_node")]
    lost_w = lost_w.unionByName(by_clock.select(
        "run_id", F.lit(EXPIRED_BY_CLOCK).alias("invariant"),
        (F.col("t_invoke") - F.col("t_origin")).cast("long").alias("sort_key"),
        F.to_json(F.struct(*clock_cols)).alias("witness")))
    # Every candidate with what it owes: the delivered ones from the table, the others as open_messages settled.
    owing = ("run_id", "owed", "legally_trimmed", "expired_legally", "undeliverable", "delivered",
             "t_invoke", "t_first", "t_origin", "bucket_us", "client",
             F.when(F.col("in_backlog"), F.col("k.c")).alias("window_c"))
    settled = table.filter(F.col("is_cand") & F.col("delivered")).select(*owing).unionByName(gaps.select(*owing))
    # The window a message was queued in (not the one it may have been carried into): what a session lost at
    # that reconnect took with it.
    window_lost = lost.select("run_id", "client", "cause", F.when(F.col("in_backlog"), F.col("k.c")).alias("window_c"))
    return lost_w, owed_metrics(settled, lost, window_lost)


def nearest_fault(timeline: Timeline, t_anchor: int | None, t_limit: int | None) -> dict | None:
    """The fault to name for a message lost between ``t_anchor`` (its ack) and ``t_limit`` (its chance to be
    delivered): one active in that window if any (the earliest: the window it was dropped in), else the fault
    nearest in time among those started before ``t_limit``."""
    limit = t_limit if t_limit is not None and t_limit < NEVER else 1 << 62
    before = [f for f in timeline.faults if f.t_start <= limit]
    if t_anchor is None or not before:
        return None
    within = [f for f in before if f.t_heal is None or f.t_heal >= t_anchor]
    fault = (min(within, key=lambda f: f.t_start) if within
             else min(before, key=lambda f: abs(f.t_start - t_anchor)))
    return {"fault_id": fault.fault_id, "kind": fault.kind, "node": fault.node, "t_start": fault.t_start}


def _seq_range(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}–{last}"


def loss_gaps(rows: list[dict], timeline: Timeline, total: int | None = None) -> list[dict]:
    """Group lost messages into gaps: runs of consecutive pub_seq in one (subscriber, publisher) stream.
    ``total``: how many lost messages there were in all; the rows are only the first few hundred (the
    checker caps them), so a gap whose stream has no delivery right after it may go on beyond its last row:
    such a gap says so ("truncated"), instead of claiming a range that ends too early."""
    rows = sorted(rows, key=lambda r: (r["client"], r["publisher"], r["pub_seq"]))
    gaps: list[dict] = []
    for row in rows:
        last = gaps[-1] if gaps else None
        if (last and last["client"] == row["client"] and last["publisher"] == row["publisher"]
                and row["pub_seq"] == last["last_seq"] + 1):
            last["last_seq"], last["count"] = row["pub_seq"], last["count"] + 1
            last["next_delivered"] = row.get("next_delivered")
            last["position"] = _merge_position(last["position"], row.get("position"))
            continue
        gaps.append({**row, "first_seq": row["pub_seq"], "last_seq": row["pub_seq"], "count": 1})
    cut = total is not None and total > len(rows)
    for gap in gaps:
        nxt = gap.get("next_delivered")
        if gap.get("gap_last") is not None and gap.get("gap_first") == gap["first_seq"]:
            # The checker knows the whole gap (owed_checks): its exact range, however few of its rows were listed.
            gap["last_seq"], gap["count"] = gap["gap_last"], gap["gap_count"]
        elif cut and (nxt is None or nxt > gap["last_seq"] + 1):
            gap["truncated"] = {"listed": len(rows), "total": total, "next_delivered": nxt}
        gap["fault"] = nearest_fault(timeline, gap.get("t_ack") or gap.get("t_invoke"), gap.get("t_reconnect"))
    gaps.sort(key=lambda g: (g.get("t_invoke") or 0, g["client"], g["publisher"]))  # earliest gap first
    return gaps


def _merge_position(a: str | None, b: str | None) -> str | None:
    if a == b:
        return a
    if "whole" in (a, b):
        return "whole"
    return {frozenset({"prefix", "middle"}): "prefix", frozenset({"middle", "suffix"}): "suffix"}.get(
        frozenset({a, b}), a)


def _lost(w: dict[str, Any], timeline: Timeline, invariant: str) -> str:
    """A gap of lost messages (``loss_gaps``) in words, with what its invariant adds."""
    o = timeline.t_first
    msgs = _seq_range(w["first_seq"], w["last_seq"])
    cut = w.get("truncated")
    noun = "message" if w["count"] == 1 and not cut else f"{w['count']} messages"
    if cut:
        noun = f"at least {noun}"
    parts = [f"{noun} {msgs} from {w['publisher']} (topic {w.get('topic')}) "
             f"{'was' if w['count'] == 1 else 'were'} acknowledged at {seconds(w.get('t_ack') or w.get('t_invoke'), o)}"]
    fault = w.get("fault")
    if fault:
        parts.append(f"the nearest fault was {fault['kind']} of {fault['node'] or '?'} ({fault['fault_id']}) at "
                     f"{seconds(fault['t_start'], o)}")
    elif timeline.faults:
        parts.append("no fault had started before it could be delivered")
    if w.get("in_backlog") and w.get("t_reconnect") is not None and w["t_reconnect"] < NEVER:
        policy = w.get("policy") or "drop_oldest"
        if policy in ("drop_oldest", "drop_newest"):
            queue = (f"limit {w.get('limit')}, {policy}; this one was number {w.get('rank')} counting from the "
                     f"{'newest' if policy == 'drop_oldest' else 'oldest'}")
        else:
            queue = ("no queue limit declared" if policy == "none"
                     else f"limit {w.get('limit')}, policy reject: nothing may be dropped once accepted")
        if w.get("carried_from_offline") is not None:
            # Blamed on the window it was dropped in: still queued from the one before, it was carried into this.
            parts.append(f"it was queued while {w['client']} was offline from {seconds(w['carried_from_offline'], o)} "
                         f"to {seconds(w.get('carried_from_reconnect'), o)}, not yet sent when {w['client']} went "
                         f"offline again at {seconds(w.get('t_offline'), o)}, and still in the queue when it "
                         f"reconnected at {seconds(w['t_reconnect'], o)} with {w.get('n_backlog')} messages queued "
                         f"(limit {w.get('limit')}, {policy}): dropped there")
        else:
            arrived = w.get("t_ack") or w.get("t_invoke")
            if arrived is not None and w.get("t_offline") is not None and arrived < w["t_offline"]:
                parts.append(f"it arrived while {w['client']} was online and was not sent before it went offline")
            parts.append(f"subscriber {w['client']} was offline from {seconds(w.get('t_offline'), o)} and reconnected "
                         f"at {seconds(w['t_reconnect'], o)} with {w.get('n_backlog')} messages queued ({queue})")
    prev, nxt = w.get("prev_delivered"), w.get("next_delivered")
    received = " then ".join(str(x) for x in (prev, nxt) if x is not None)
    if received:
        parts.append(f"{w['client']} received {received}")
    parts.append(f"{msgs} never arrived ({w.get('position')} gap of the stream)")
    if cut:
        beyond = cut["next_delivered"]
        parts.append(f"only the first {cut['listed']} of {cut['total']} lost messages are listed, so this gap may "
                     "go on after " + str(w["last_seq"])
                     + (f" (the stream's next delivery was {beyond})" if beyond is not None else ""))
    if invariant == "durability.lost_allowed":
        parts.append("the target does not promise that acknowledged messages survive this fault (its declared "
                     "persistence): allowed, not a violation")
    if invariant == "limits.trim_not_newest":
        parts.append("newer messages beyond the limit were delivered instead (the declared policy drops the "
                     "newest)")
    if invariant == "expiry.dropped_early":
        parts.append(f"it carried an expiry of {w.get('expiry_s')} s, not yet over when the subscriber came back")
        if w.get("skew_early_us"):
            changes = clock_changes(timeline, None, w.get("t_invoke") or 0, w.get("t_reconnect") or NEVER)
            parts.append(f"not even {w['skew_early_us'] / 1e6:.3f} s early, the most the clocks that moved can have "
                         f"brought it forward ({changes})")
    if invariant == "limits.trimmed_under_limit":
        parts.append("the broker trimmed more than the limit required")
    if invariant == "limits.trim_not_oldest":
        parts.append("older messages beyond the limit were delivered instead")
    return "; ".join(parts) + "."


for _invariant in LOSS_INVARIANTS:  # one explanation, with each invariant's own last words
    explains(_invariant)(functools.partial(_lost, invariant=_invariant))


@explains(EXPIRED_BY_CLOCK)
def _expired_by_clock(w: dict[str, Any], timeline: Timeline) -> str:
    """A never-delivered message the clock explains (EXPIRED_BY_CLOCK): expired early by up to skew_early_us."""
    o = timeline.t_first
    deadline = (w.get("t_invoke") or 0) + (w.get("expiry_s") or 0) * 1_000_000
    chance = w.get("t_reconnect") if w.get("in_backlog") and w.get("t_reconnect") is not None else w.get("t_ack")
    changes = clock_changes(timeline, None, w.get("t_invoke") or 0, chance if chance is not None else NEVER)
    where = (f"queued while {w['client']} was offline from {seconds(w.get('t_offline'), o)} to "
             f"{seconds(w.get('t_reconnect'), o)}" if w.get("in_backlog") else f"sent to {w['client']} while online")
    return (f"message {w.get('pub_seq')} from {w.get('publisher')} (topic {w.get('topic')}, expiry "
            f"{w.get('expiry_s') if w.get('expiry_s') is not None else 'the default TTL'} s"
            + (f", due at {seconds(deadline, o)}" if w.get("expiry_s") is not None else "")
            + f"), {where}, never arrived: expired early by up to {(w.get('skew_early_us') or 0) / 1e6:.3f} s: "
            f"{changes or NODES_DIFFER} — an expiry the clock explains, not a loss.")
