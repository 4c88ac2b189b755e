"""Witnesses in plain words: each raw witness (a JSON object from a checker) gets a sentence an auditor can
follow, with times in seconds since the start of the run and the faults and reconnects around it."""

from __future__ import annotations

from typing import Any

from spark_checkers.timeline import NEVER, Timeline


def seconds(t: int | None, origin: int) -> str:
    return "?" if t is None else f"{(t - origin) / 1e6:.3f} s"


def _fault_phrase(timeline: Timeline, t_anchor: int | None, t_limit: int | None, origin: int) -> str:
    """The fault nearest in time to ``t_anchor`` among those started before ``t_limit``."""
    if t_anchor is None or not timeline.faults:
        return "no fault was scheduled in this run" if not timeline.faults else ""
    limit = t_limit if t_limit is not None and t_limit < NEVER else 1 << 62
    before = [f for f in timeline.faults if f.t_start <= limit]
    if not before:
        return "no fault had started before it"
    fault = min(before, key=lambda f: abs(f.t_start - t_anchor))
    return f"nearest fault: {fault.kind} of {fault.node or '?'} ({fault.fault_id}) at {seconds(fault.t_start, origin)}"


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
        if cut and (nxt is None or nxt > gap["last_seq"] + 1):
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


_NEW_SESSION_WHY = {
    "clean_start": "with clean start 1",
    "expired": "after its session expiry had elapsed offline",
    "after_clean": "after a non-persistent session (it ended at its disconnect)",
}


def _discarded_session(w: dict[str, Any], o: int) -> str:
    """durability.discarded_session_delivery in words: the session that held the message, the connect that
    discarded it, and the later session that got it anyway."""
    who, client = f"{w.get('publisher')}#{w.get('pub_seq')}", w.get("client")
    began, acked = w.get("t_session") or 0, w.get("t_ack") or 0
    margin_ms = ((w.get("slack_us") or 0) + (w.get("tol_us") or 0)) // 1000
    held = (f"the session begun at {seconds(w['t_held_since'], o)}" if w.get("t_held_since") is not None
            else f"the first session of {client}")
    text = (f"{client} received {who} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}, DUP "
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


def explain(invariant: str, w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    who = f"{w.get('publisher')}#{w.get('pub_seq')}"
    if invariant in ("durability.lost", "durability.lost_allowed", "expiry.dropped_early", "limits.trimmed_under_limit",
                     "limits.trim_not_oldest", "limits.trim_not_newest"):
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
        if invariant == "limits.trimmed_under_limit":
            parts.append("the broker trimmed more than the limit required")
        if invariant == "limits.trim_not_oldest":
            parts.append("older messages beyond the limit were delivered instead")
        return "; ".join(parts) + "."
    if invariant == "order.out_of_order":
        flags = [name for name, key in (("a packet-id wrap", "across_wrap"), ("a new session", "across_new_session"),
                                        ("a reconnect", "across_reconnect"), ("a failover", "across_failover"))
                 if w.get(key)]
        return (f"{w['client']} received {w['publisher']}#{w.get('after_pub_seq')} at {seconds(w.get('after_t'), o)} "
                f"(packet id {w.get('after_packet_id')}) and only then #{w['pub_seq']} at {seconds(w.get('t'), o)} "
                f"(packet id {w.get('packet_id')})" + (f", across {' and '.join(flags)}" if flags else "") + ".")
    if invariant == "order.packet_id_invalid":
        return f"{w['client']} received {who} at {seconds(w.get('t'), o)} with packet id {w.get('packet_id')} (QoS {w.get('qos')})."
    if invariant == "order.packet_id_reused":
        return (f"{w['client']} received {who} at {seconds(w.get('t'), o)} with packet id {w.get('packet_id')}, "
                f"still held unacknowledged by {w.get('prev_publisher')}#{w.get('prev_pub_seq')} delivered at "
                f"{seconds(w.get('prev_t'), o)}.")
    if invariant == "order.resend_within_connection":
        return (f"{w['client']} received {who} at {seconds(w.get('prev_t'), o)} and again at {seconds(w.get('t'), o)} "
                f"(packet id {w.get('packet_id')}, DUP {'1' if w.get('dup') else '0'}) on the same MQTT 5 connection "
                "before acknowledging it: MQTT 5 allows a resend only after a reconnect [MQTT-4.4.0-1].")
    if invariant == "duplicates.backlog_twice_in_connection":
        return (f"{w['client']} received {who} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}) and again at "
                f"{seconds(w.get('t_again'), o)} (packet id {w.get('again_packet_id')}, DUP "
                f"{'1' if w.get('again_dup') else '0'}) on the same connection, with no reconnect between and no fault "
                f"around the message; {w.get('n_deliveries')} deliveries of it in all.")
    if invariant == "whitebox.packet_id_sequence":
        prev = w.get("prev_packet_id")
        after = (f"after packet id {prev} at {seconds(w.get('prev_t'), o)}" if prev is not None
                 else f"as the first stored id of the session begun at {seconds(w.get('t_session'), o)} (a new session "
                      "starts at 1)")
        return (f"session {w['client']} (session {w.get('epoch')}): {who} took packet id {w.get('packet_id')} at "
                f"{seconds(w.get('t'), o)} {after}, skipping {w.get('gap')} id(s); {w.get('skipped_total')} skipped in "
                f"this session so far, but only {w.get('undelivered')} of its messages never arrived (trimmed, expired "
                "or lost, each taking one id): the reference broker hands ids out 1..65535 in order, then 1.")
    if invariant == "order.dup_flag":
        return f"{w['client']} received {who} at {seconds(w.get('t'), o)} (packet id {w.get('packet_id')}): {w.get('problem')}."
    if invariant == "durability.phantom":
        return (f"{w['client']} received {who} at {seconds(w.get('t'), o)}: {w.get('phantom_reason')}"
                + (f" (published {w.get('pub_hash')}, received {w.get('min_hash')})" if w.get("pub_hash") else "") + ".")
    if invariant == "durability.unsubscribed_delivery":
        return (f"{w['client']} received {who} on topic {w.get('topic')} at {seconds(w.get('t'), o)} without a matching "
                f"subscription at that time.")
    if invariant == "durability.discarded_session_delivery":
        return _discarded_session(w, o)
    if invariant == "durability.delivered_after_failed_publish":
        return (f"the publish of {who} failed at {seconds(w.get('t_fail'), o)}, yet {w['client']} received it at "
                f"{seconds(w.get('t'), o)}.")
    if invariant == "durability.session_lost_allowed":
        fault = w.get("fault") or {}
        return (f"{w['client']} reconnected at {seconds(w.get('t'), o)} (offline since {seconds(w.get('t_disconnect'), o)}) "
                f"without clean start and got session present = 0, after {fault.get('kind')} of {fault.get('node')} "
                f"({fault.get('fault_id')}) at {seconds(fault.get('t_start'), o)}: the target does not promise that "
                "sessions survive that fault (its declared persistence): allowed, not a violation.")
    if invariant == "durability.session_lost":
        return (f"{w['client']} reconnected at {seconds(w.get('t'), o)} (offline since {seconds(w.get('t_disconnect'), o)}) "
                f"without clean start, but the broker answered session present = 0.")
    if invariant == "expiry.delivered_expired":
        return (f"{who} expired at {seconds(w.get('deadline'), o)} (expiry {w.get('expiry_s') or 'default TTL'} s) but "
                f"{w['client']} received it at {seconds(w.get('t_last'), o)}, beyond the {w.get('tol_us', 0) // 1000} ms "
                f"clock tolerance.")
    if invariant == "expiry.remaining_not_reduced":
        late = (w.get("implied_deadline", 0) - w.get("deadline", 0)) / 1e6
        return (f"{who} (expiry {w.get('expiry_s')} s, published at {seconds(w.get('t_invoke'), o)}) reached {w['client']} "
                f"at {seconds(w.get('t'), o)} with a remaining expiry {late:.1f} s longer than the time left.")
    if invariant in ("duplicates.redelivered_after_ack", "duplicates.qos2"):
        return (f"{w['client']} acknowledged {who} at {seconds(w.get('first_ack_t'), o)} and received it again at "
                f"{seconds(w.get('t_redelivery'), o)} (packet id {w.get('redelivery_packet_id')}); "
                f"{w.get('n_after_ack')} redelivery(ies) after the ack.")
    if invariant == "liveness.stuck_inflight":
        return f"{w['client']} received {who} at {seconds(w.get('t'), o)} and never acknowledged it."
    if invariant == "limits.over_limit":
        return (f"{w.get('client')}: {w.get('kept')} messages kept/delivered where the limit is {w.get('limit')} "
                f"({w.get('source')}, at {seconds(w.get('t'), o)}).")
    if invariant == "whitebox.orphan_payloads":
        return f"session {w.get('client')}: {w.get('count')} payload key(s) with no ZSET reference after the drain."
    if invariant == "whitebox.dangling_refs":
        return f"session {w.get('client')}: {w.get('count')} ZSET reference(s) whose payload key is gone after the drain."
    if invariant == "whitebox.last_packet_id_behind":
        return (f"session {w.get('client')}: stored last packet id {w.get('stored')} is behind packet id "
                f"{w.get('delivered')} already delivered.")
    if invariant == "meta.fault_bit":
        return (f"fault {w.get('fault_id')} ({w.get('fault_kind')} of {w.get('node')}) at {seconds(w.get('t'), o)}: "
                f"{w.get('evidence')}.")
    return str(w)
