"""The forwarding rules over delivered messages: the MQTT 5 properties a broker forwards unchanged, the
Subscription Identifiers of the matching subscriptions, and the RETAIN flag as the Retain As Published option
says.  What a message's deliveries carried comes as aggregates (job/messages.py: ``_v5_aggregates``): the
properties and the identifiers as codes, so the table stays primitive; a witness names the codes again."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.job.codes import named
from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import first_delivery, real, since_origin
from spark_checkers.rules.qos import HELD, THROUGHOUT, held
from spark_checkers.rules.registry import MESSAGES, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline


def _props_name(column):
    """A props code (0: none) as the witness carries it: the canonical JSON named again, or null for none."""
    return F.when(column != 0, named(column))


# [MQTT-3.3.2-4] payload format, -15 response topic, -16 correlation data, -17 / -18 user properties (unchanged, in
# order), -20 content type: the strings are canonical JSON (contracts/mqtt_properties.py), equal iff forwarded
# unchanged.  Only an MQTT 5 publisher's message on an MQTT 5 delivery: a 3.1.1 publish carries none, and a 3.1.1
# delivery can carry none (the aggregates count MQTT 5 deliveries only).
@rule("props.forwarded_changed", MESSAGES)
def forwarded_changed():
    published = F.coalesce("pub_props", F.lit(0).cast("long"))
    changed = (F.col("min_props") != published) | (F.col("max_props") != published)
    received = F.when(F.col("min_props") != published, F.col("min_props")).otherwise(F.col("max_props"))
    return (real() & (F.col("pub_protocol") == 5) & F.col("min_props").isNotNull() & changed,
            since_origin("first.t"), *first_delivery(), _props_name(published).alias("published"),
            _props_name(received).alias("received"), (F.col("min_props") != F.col("max_props")).alias("varied"))


def _ids(condition: str) -> str:
    """The distinct Subscription Identifiers of the subscriptions ``condition`` holds for, sorted, as SQL."""
    return f"array_sort(array_distinct(filter(transform({held(condition)}, x -> x.sub_id), i -> i IS NOT NULL)))"


# [MQTT-3.3.4-3]: the identifiers of the overlapping subscriptions that have one; -4: one copy carries them all, in
# any order; -5: one copy per subscription carries that subscription's own (several subscriptions may share one id).  Judged only where the client's
# matching subscriptions held throughout the message's life are all it held (a subscribe, re-subscribe or
# unsubscribe between the publish and the delivery leaves the identifiers owed open).
@rule("props.subscription_ids", MESSAGES)
def subscription_ids():
    expected = sql(_ids(HELD))
    code = F.when(F.size(expected) > 0, F.xxhash64(F.array_join(expected.cast("array<string>"), ","))).otherwise(
        F.lit(0).cast("long"))
    stable = sql(f"size({held()}) > 0 AND NOT exists({held()}, x -> NOT ({THROUGHOUT}))")
    without_id = sql(f"exists({held()}, x -> x.sub_id IS NULL)")
    one_copy = (F.col("min_sids") == F.col("max_sids")) & (F.col("min_sids") == code)
    # One copy per subscription: each copy with at most one identifier, the copies' lowest and highest those of the
    # subscriptions (each subscription with an identifier got its copy: exact for up to two of them), and a copy
    # with none only if a matching subscription has none.
    covered = F.coalesce(F.when(F.size(expected) > 0, (F.col("min_sid") == F.array_min(expected))
                                & (F.col("max_sid") == F.array_max(expected))).otherwise(F.col("max_n_sids") == 0),
                         F.lit(False))
    per_subscription = (F.col("max_n_sids") <= 1) & covered & ((F.col("min_n_sids") >= 1) | without_id)
    return (real() & F.col("min_sids").isNotNull() & stable & ~one_copy & ~per_subscription, since_origin("first.t"),
            *first_delivery(), expected.alias("expected"), "min_sid", "max_sid", "min_n_sids", "max_n_sids",
            (F.col("min_sids") == F.col("max_sids")).alias("same_in_every_copy"), without_id.alias("one_without_id"))


# [MQTT-3.3.1-12]: with Retain As Published 0 the RETAIN flag of a forwarded message is 0; -13: with it 1, as
# published.  MQTT 3.1.1 [MQTT-3.3.1-9]: a message sent because it matches an established subscription has RETAIN 0.
# So a message published with RETAIN 0 is forwarded with RETAIN 0 on any subscription.  One published with RETAIN 1
# may also reach the client as the retained message a new subscription is sent ([MQTT-3.3.1-9] of MQTT 5, 3.1.1
# [MQTT-3.3.1-8]: RETAIN 1): RETAIN 1 is excused when a matching subscription began after the publish.
@rule("props.retain_as_published", MESSAGES)
def retain_as_published():
    published = F.coalesce("pub_retain", F.lit(False))
    every_rap = sql(f"size({held()}) > 0 AND NOT exists({held()}, x -> NOT x.rap)")
    any_rap = sql(f"exists({held()}, x -> x.rap)")
    subscribed_after = sql(f"exists({held()}, x -> x.t_from >= t_invoke - tol_us)")
    set_not_published = ~published & (F.col("max_retain") == 1)
    cleared_as_published = published & every_rap & (F.col("min_retain") == 0)
    kept_without_rap = published & ~any_rap & ~subscribed_after & (F.col("max_retain") == 1)
    return (real() & (set_not_published | cleared_as_published | kept_without_rap), since_origin("first.t"),
            *first_delivery(), published.alias("published_retain"), "min_retain", "max_retain",
            every_rap.alias("retain_as_published"), any_rap.alias("some_retain_as_published"))


def _delivered(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), timeline.t_first)} (packet id "
            f"{w.get('packet_id')})")


@explains("props.forwarded_changed")
def _forwarded_changed(w: dict[str, Any], timeline: Timeline) -> str:
    copies = " (its copies differ among themselves)" if w.get("varied") else ""
    return (f"{_delivered(w, timeline)} with the properties {w.get('received') or 'none'}{copies}, but it was "
            f"published with {w.get('published') or 'none'}: the payload format, content type, correlation data, "
            "response topic and user properties (in order) are forwarded unchanged [MQTT-3.3.2-4], [MQTT-3.3.2-15], "
            "[MQTT-3.3.2-16], [MQTT-3.3.2-17], [MQTT-3.3.2-18], [MQTT-3.3.2-20].")


def _received_ids(w: dict[str, Any]) -> str:
    low, high, fewest, most = w.get("min_sid"), w.get("max_sid"), w.get("min_n_sids"), w.get("max_n_sids")
    if not most:
        return "no subscription identifier"
    if most == 1 and low == high:
        return f"subscription identifier {low}" + (" (and a copy with none)" if fewest == 0 else "")
    if most <= 2 and w.get("same_in_every_copy"):
        return f"subscription identifiers {low} and {high}"
    return f"between {fewest} and {most} subscription identifiers per copy, from {low} to {high}"


@explains("props.subscription_ids")
def _subscription_ids(w: dict[str, Any], timeline: Timeline) -> str:
    expected = w.get("expected") or []
    owed = (f"identifier(s) {', '.join(str(i) for i in expected)}" if expected else "no identifier")
    return (f"{_delivered(w, timeline)} with {_received_ids(w)}, but its subscriptions matching {w.get('topic')} carry "
            f"{owed}" + (" (and one has none)" if w.get("one_without_id") and expected else "")
            + ": a delivery carries the Subscription Identifiers of the matching subscriptions, all of them in one "
            "copy or each its own in one copy per subscription [MQTT-3.3.4-3], [MQTT-3.3.4-4], [MQTT-3.3.4-5].")


@explains("props.retain_as_published")
def _retain_as_published(w: dict[str, Any], timeline: Timeline) -> str:
    published = bool(w.get("published_retain"))
    if not published:
        why = ("with RETAIN 1, though it was published with RETAIN 0: a forwarded message has RETAIN 0 unless "
               "Retain As Published forwards the published flag [MQTT-3.3.1-12], [MQTT-3.3.1-13] (MQTT 3.1.1 "
               "[MQTT-3.3.1-9])")
    elif w.get("retain_as_published") and w.get("min_retain") == 0:
        why = ("with RETAIN 0, though it was published with RETAIN 1 and its subscriptions have Retain As Published "
               "1: the RETAIN flag is forwarded as published [MQTT-3.3.1-13]")
    else:
        why = ("with RETAIN 1 as a live forward (no subscription made after the publish), though no matching "
               "subscription has Retain As Published: RETAIN is 0 then [MQTT-3.3.1-12] (MQTT 3.1.1 [MQTT-3.3.1-9])")
    return f"{_delivered(w, timeline)} {why}."
