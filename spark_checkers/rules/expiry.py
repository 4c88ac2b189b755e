"""The expiry rules over delivered messages: nothing delivered after its expiry, the remaining expiry a delivery
carries reduced by the time the message waited, and carried at all on an MQTT 5 delivery.  A queued message dropped before its expiry is a loss
rule's (losses.py: expiry.dropped_early)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import first_delivery, real, since_origin, tolerance
from spark_checkers.rules.registry import MESSAGES, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import BROKER, Timeline, clock_changes


def skew_late():
    """δ⁻_msg over [t_invoke, t_last] (the MESSAGES table's ``skew_late_us``, columns.message_table): how far behind
    the clock that stamped the message a broker's clock may have been when it delivered it — a clock jumped back
    by Δ lets it deliver up to Δ after the deadline and count up to Δ more remaining (docs/clock-model.md)."""
    return F.col("skew_late_us")


def skew_clause():
    """The witness column ``skew_late_us``, only when a clock moved: a witness without clock rows is as it was."""
    return F.when(skew_late() > 0, skew_late()).alias("skew_late_us")


@rule("expiry.delivered_expired", MESSAGES)
def delivered_expired():
    return (real() & (F.col("t_last") > F.col("deadline") + skew_late() + tolerance()),
            F.col("t_last") - F.col("t_origin"), *first_delivery(), "t_last", "expiry_s", "deadline", "tol_us",
            skew_clause())


# [MQTT-3.3.2-6]: the received interval minus the time the message waited in the server.  A broker counts whole
# seconds: the most a delivery at t may carry is expiry_s - floor(w), w the wait the broker can have seen at least
# (t - t_invoke - the clock tolerance, and never below 0), so never more than expiry_s.  With D = t + remaining (the
# implied deadline, remaining whole seconds): remaining + floor(w) = floor((D - t_invoke - tol) / 1 s) <= expiry_s
# exactly when D < deadline + tol + 1 s.  Both per delivery; their maxima over the deliveries decide the message.
# A delivering clock behind the stamping one by up to δ⁻ adds up to δ⁻ to the remaining interval: both limits
# move by it (the published interval by whole seconds, as a count of them).
@rule("expiry.remaining_not_reduced", MESSAGES)
def remaining_not_reduced():
    skew_s = sql("(skew_late_us + 999999) div 1000000")  # ceil(δ⁻ / 1 s), exact in longs
    not_reduced = F.col("expiry_s").isNotNull() & (
        (F.col("max_remaining") > F.col("expiry_s") + skew_s)
        | (F.col("implied_deadline") >= F.col("deadline") + skew_late() + tolerance() + 1_000_000))
    return (real() & not_reduced, since_origin("first.t"), *first_delivery(), "expiry_s", "implied_deadline",
            "deadline", "max_remaining", "tol_us", skew_clause())


# [MQTT-3.3.2-6]: every PUBLISH the server sends of a message published with a Message Expiry Interval carries the
# remaining interval; a delivery on an MQTT 5 connection without it lost the property.  An MQTT 3.1.1 delivery
# has no properties: not judged (the aggregate counts MQTT 5 deliveries only).
@rule("expiry.property_missing", MESSAGES)
def property_missing():
    return (real() & F.col("expiry_s").isNotNull() & (F.col("pub_protocol") == 5) & F.col("no_remaining_t").isNotNull(),
            F.col("no_remaining_t") - F.col("t_origin"), *first_delivery(), "expiry_s",
            F.col("no_remaining_t").alias("t_missing"), F.col("no_remaining_packet_id").alias("missing_packet_id"))


def _clock_words(w: dict[str, Any], timeline: Timeline) -> str:
    """' and the 1.000 s a broker's clock may have been behind (broker-1's clock jumped -1.000 s at ...)', or ''."""
    late = w.get("skew_late_us") or 0
    if not late:
        return ""
    changes = clock_changes(timeline, timeline.nodes_of(BROKER), w.get("t_invoke") or 0, w.get("t_last") or w.get("t"))
    return f" and the {late / 1e6:.3f} s a broker's clock may have been behind the one that stamped it ({changes})"


@explains("expiry.delivered_expired")
def _delivered_expired(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{message(w)} expired at {seconds(w.get('deadline'), o)} (expiry {w.get('expiry_s') or 'default TTL'} s) "
            f"but {w['client']} received it at {seconds(w.get('t_last'), o)}, beyond the {w.get('tol_us', 0) // 1000} ms "
            f"clock tolerance{_clock_words(w, timeline)}.")


@explains("expiry.remaining_not_reduced")
def _remaining_not_reduced(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    head = (f"{message(w)} (expiry {w.get('expiry_s')} s, published at {seconds(w.get('t_invoke'), o)}) reached "
            f"{w['client']} (first at {seconds(w.get('t'), o)}, packet id {w.get('packet_id')})")
    skew = w.get("skew_late_us") or 0
    clock = _clock_words({**w, "t_last": w.get("t")}, timeline)
    if (w.get("max_remaining") or 0) > (w.get("expiry_s") or 0) + -(-skew // 1_000_000):
        return (f"{head} with a remaining expiry of {w.get('max_remaining')} s, more than the {w.get('expiry_s')} s it "
                f"was published with{clock} [MQTT-3.3.2-6].")
    late = (w.get("implied_deadline", 0) - w.get("deadline", 0)) / 1e6
    return (f"{head} with a remaining expiry that ends {late:.3f} s after the message's own expiry: more than the "
            f"{(w.get('tol_us') or 0) // 1000} ms clock tolerance + the 1 s a count in whole seconds may add"
            f"{clock}; the remaining interval is the published one minus the time the message waited [MQTT-3.3.2-6].")


@explains("expiry.property_missing")
def _property_missing(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{message(w)} was published at {seconds(w.get('t_invoke'), o)} with a Message Expiry Interval of "
            f"{w.get('expiry_s')} s, but {w['client']} received it at {seconds(w.get('t_missing'), o)} (packet id "
            f"{w.get('missing_packet_id')}) over MQTT 5 without one: the server sends the remaining interval "
            "[MQTT-3.3.2-6].")
