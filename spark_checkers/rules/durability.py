"""The durability rules over delivered messages: no phantom, nothing delivered after its publish failed or to a
client not subscribed, no discarded session's message in a later session.  The losses of owed messages are the
loss rules' (losses.py); the explanations of the sessions lost at a reconnect (found by timeline.py) are here."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.job.codes import witness_name
from spark_checkers.job.columns import sql
from spark_checkers.rules.columns import (
    client,
    first_delivery,
    publisher,
    publisher_may_have_resent,
    real,
    since_origin,
    tolerance,
)
from spark_checkers.rules.registry import MESSAGES, explains, rule
from spark_checkers.rules.words import message, seconds
from spark_checkers.timeline import Timeline, clock_changes


@rule("durability.phantom", MESSAGES)
def phantom():
    return (~real(), since_origin("first.t"), *first_delivery(), "phantom_reason",
            *[witness_name(h) for h in ("min_hash", "max_hash", "pub_hash")])


@rule("durability.delivered_after_failed_publish", MESSAGES)
def delivered_after_failed_publish():
    return (real() & F.col("t_fail").isNotNull() & F.col("t_ack").isNull(), since_origin("first.t"),
            *first_delivery(), "t_fail")


@rule("durability.unsubscribed_delivery", MESSAGES)
def unsubscribed_delivery():
    subscribed = sql("exists(coalesce(subs, array()), x -> x.client = client AND x.t_from <= first.t + tol_us"
                     " AND (x.t_to IS NULL OR x.t_to >= t_invoke - tol_us))")
    return real() & ~subscribed, since_origin("first.t"), *first_delivery()


# A discarded session's message reaching a later session ([MQTT-3.1.2-4]).  The broker routes a message to
# the subscriptions that exist when its pipeline gets to it, so one published shortly before a new session
# subscribed may legally reach it; but one acknowledged more than the pipeline slack (+ the clock tolerance)
# before the connect that began the receiving session was routed before that session existed: to the
# session it discarded (or an older one), never to this one.  Judged on the last delivery (the latest
# session that got it).  Not judged where the pipeline may have been held up longer (a fault or node event
# between the publish and the delivery) or where the publisher may have sent it again later (published more
# than once, or disconnected before its ack).
@rule("durability.discarded_session_delivery", MESSAGES)
def discarded_session_delivery():
    t_last_d = F.col("last.t")
    session = sql("element_at(filter(coalesce(new_sessions, array()), x -> x.seq < last.seq), -1)")
    held = sql("element_at(filter(coalesce(new_sessions, array()), x -> x.t <= t_ack), -1)")
    discarded_by = sql("element_at(filter(coalesce(new_sessions, array()), x -> x.t > t_ack), 1)")
    fault_in_life = sql("exists(coalesce(fault_spans, array()), x -> x.s <= last.t AND x.e + slack_us >= t_invoke)")
    from_discarded = (real() & F.col("t_ack").isNotNull() & session.isNotNull()
                      & (F.col("t_ack") + F.col("slack_us") + tolerance() < session["t"]) & ~fault_in_life
                      & ~publisher_may_have_resent())
    return (from_discarded, t_last_d - F.col("t_origin"),
            client(), publisher(), "pub_seq", t_last_d.alias("t"), F.col("last.packet_id").alias("packet_id"),
            F.col("last.dup").alias("dup"), witness_name("last.node", "node"), "t_invoke", "t_ack", "t_origin",
            witness_name("topic"), session["t"].alias("t_session"), session["why"].alias("session_why"),
            session["clean_start"].alias("session_clean_start"), held["t"].alias("t_held_since"),
            discarded_by["t"].alias("t_discarded"), discarded_by["why"].alias("discarded_why"),
            discarded_by["clean_start"].alias("discarded_clean_start"), "n_deliveries", "slack_us", "tol_us")


_NEW_SESSION_WHY = {
    "clean_start": "with clean start 1",
    "expired": "after its session expiry had elapsed offline",
    "after_clean": "after a non-persistent session (it ended at its disconnect)",
}


@explains("durability.discarded_session_delivery")
def _discarded_session(w: dict[str, Any], timeline: Timeline) -> str:
    """The session that held the message, the connect that discarded it, and the later session that got it."""
    o = timeline.t_first
    who, client_name = message(w), w.get("client")
    began, acked = w.get("t_session") or 0, w.get("t_ack") or 0
    margin_ms = ((w.get("slack_us") or 0) + (w.get("tol_us") or 0)) // 1000
    held = (f"the session begun at {seconds(w['t_held_since'], o)}" if w.get("t_held_since") is not None
            else f"the first session of {client_name}")
    text = (f"{client_name} received {who} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}, DUP "
            f"{'1' if w.get('dup') else '0'}) in the session begun by its connect at {seconds(began, o)} "
            f"{_NEW_SESSION_WHY.get(w.get('session_why'), '')}; {who} was acknowledged at {seconds(acked, o)}, "
            f"{(began - acked) / 1e6:.3f} s before that connect (more than the pipeline slack + clock tolerance, "
            f"{margin_ms} ms), so the broker routed it before that session existed: it belonged to an earlier "
            f"session, {held} (current when it was acknowledged)")
    discarded = w.get("t_discarded")
    if discarded is not None and discarded < began:
        text += (f", which the connect at {seconds(discarded, o)} {_NEW_SESSION_WHY.get(w.get('discarded_why'), '')} "
                 f"discarded, and still reached the later session")
    else:
        text += ", which that connect discarded"
    return text + ". A discarded session's messages must never reach a later session [MQTT-3.1.2-4]."


@explains("durability.phantom")
def _phantom(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} at {seconds(w.get('t'), o)}: {w.get('phantom_reason')}"
            + (f" (published {w.get('pub_hash')}, received {w.get('min_hash')})" if w.get("pub_hash") else "") + ".")


@explains("durability.unsubscribed_delivery")
def _unsubscribed(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{w['client']} received {message(w)} on topic {w.get('topic')} at {seconds(w.get('t'), o)} without a "
            "matching subscription at that time.")


@explains("durability.delivered_after_failed_publish")
def _after_failed_publish(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"the publish of {message(w)} failed at {seconds(w.get('t_fail'), o)}, yet {w['client']} received it at "
            f"{seconds(w.get('t'), o)}.")


def _by_cause(w: dict[str, Any]) -> str:
    """' (31 durability.lost, ...)': the invariants a session window's lost messages fall under, or ''."""
    causes = sorted((w.get("lost_by_cause") or {}).items())
    return f" ({', '.join(f'{n} {cause}' for cause, n in causes)})" if w.get("acked_lost") else ""


def _with_session(w: dict[str, Any], timeline: Timeline) -> str:
    """What the lost session owed, in acknowledged messages (api.py: _session_windows), and whether it came back."""
    o = timeline.t_first
    text = ""
    returned = w.get("returned_at")
    if returned is not None:
        text += f" The broker presented the session again at {seconds(returned, o)}"
    if "acked_owed" in w:
        owed, lost = w.get("acked_owed", 0), w.get("acked_lost", 0)
        until = "then" if returned is not None else "at that reconnect"
        text += (("; " if returned is not None else " ") + f"{owed} acknowledged message(s) were owed to it {until}, "
                 f"{lost} of them never delivered{_by_cause(w)}.")
    elif returned is not None:
        text += "."
    return text


@explains("durability.session_lost_allowed")
def _session_lost_allowed(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    fault = w.get("fault") or {}
    return (f"{w['client']} reconnected at {seconds(w.get('t'), o)} (offline since {seconds(w.get('t_disconnect'), o)}) "
            f"without clean start and got session present = 0, after {fault.get('kind')} of {fault.get('node')} "
            f"({fault.get('fault_id')}) at {seconds(fault.get('t_start'), o)}: the target does not promise that "
            "sessions survive that fault (its declared persistence): allowed, not a violation."
            + _with_session(w, timeline))


@explains("durability.session_returned")
def _session_returned(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    where = f" on {w['node']}" if w.get("node") else ""
    lost_where = f" on {w['node_lost']}" if w.get("node_lost") else ""
    times = w.get("reported_lost", 1)
    subs = w.get("subscriptions") or []
    text = (f"{w['client']} reconnected at {seconds(w.get('t'), o)}{where} and got session present = 1, but at "
            f"{seconds(w.get('t_lost'), o)}{lost_where} the broker had answered session present = 0 for the same "
            f"session (offline since {seconds(w.get('t_disconnect'), o)})"
            + (f", and {times - 1} time(s) more after that" if times > 1 else "")
            + ", and no later session of it was granted a subscription: the session the broker said was gone came "
              "back" + (f" with its subscription(s) {', '.join(subs)}" if subs else "") + ".")
    if "acked_owed" in w:
        lost = w.get("acked_lost", 0)
        text += (f" Judged as the one session it was: {w['acked_owed']} acknowledged message(s) owed to it from its "
                 f"disconnect to this reconnect, {lost} never delivered{_by_cause(w)}.")
    return text


@explains("durability.expired_session_present")
def _expired_session_present(w: dict[str, Any], timeline: Timeline) -> str:
    """Decided in the timeline (timeline.py: _expired_sessions_present)."""
    o = timeline.t_first
    offline = (w.get("offline_us") or 0) / 1e6
    late = w.get("skew_late_us") or 0
    # A clock that moved in the offline window may let the expiry come up to δ⁻ late (docs/clock-model.md).
    clock = (f" + the {late / 1e6:.3f} s a broker's clock may have been behind the disconnect's "
             f"({clock_changes(timeline, None, w['t_disconnect'], w['t'])})" if late and w.get("t_disconnect") else "")
    return (f"{w['client']} reconnected at {seconds(w.get('t'), o)}{' on ' + w['node'] if w.get('node') else ''} "
            f"{offline:.3f} s after its disconnect at {seconds(w.get('t_disconnect'), o)}, longer than the Session "
            f"Expiry Interval of {w.get('session_expiry_s')} s its CONNECT had sent (+ the "
            f"{(w.get('tol_us') or 0) // 1000} ms clock tolerance{clock}), yet the broker answered session present = 1: the "
            "session must be discarded once the interval has passed [MQTT-4.1.0-2], and session present is 1 only "
            "for a session the server still holds [MQTT-3.2.2-3].")


@explains("durability.session_lost")
def _session_lost(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    where = ""
    if w.get("node") and w.get("node_before"):  # a cluster's witness says where the session was and went
        where = (f" on {w['node']}, its session last on {w['node_before']}" if w["node"] != w["node_before"]
                 else f" on {w['node']}, the node its session was on")
    return (f"{w['client']} reconnected at {seconds(w.get('t'), o)}{where} (offline since "
            f"{seconds(w.get('t_disconnect'), o)}) without clean start, but the broker answered session present = 0."
            + _with_session(w, timeline))


@explains("durability.clean_start_session_present")
def _clean_start_session_present(w: dict[str, Any], timeline: Timeline) -> str:
    flag = "CleanSession = 1" if w.get("protocol") == 4 else "clean start 1"
    where = f" on {w['node']}" if w.get("node") else ""
    return (f"{w['client']} connected at {seconds(w.get('t'), timeline.t_first)}{where} with {flag} and the broker "
            "answered session present = 1: a clean start discards the session, so no session can be present.")
