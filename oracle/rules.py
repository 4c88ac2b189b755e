"""One function per invariant: the items of a run that break it (docs/invariants.md, the invariants table).

Each returns a list of items, one per counted violation: a message to a subscriber as (client, publisher,
pub_seq), a delivery as (client, seq), a session as (client, seq of the connect), a backlog as (client,
reconnect time), a fault as its id, a node event as (node, t), a snapshot as (client, seq).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts.app_clients import is_application
from contracts.history_schema import Kind
from oracle.messages import Received
from oracle.model import Model
from oracle.owed import deadline
from oracle.run import NEVER, detail
from oracle.topics import matches, shared

Item = tuple
RULES: dict[str, Callable[[Model], list[Item]]] = {}
LOSS_CAUSES = ("durability.lost", "durability.lost_allowed", "expiry.dropped_early", "limits.trimmed_under_limit",
               "limits.trim_not_oldest", "limits.trim_not_newest")


def rule(*invariants: str):
    def add(find):
        for invariant in invariants:
            RULES[invariant] = find if len(invariants) == 1 else (lambda m, i=invariant: find(m, i))
        return find
    return add


# -- Losses ----------------------------------------------------------------------------------------------


@rule(*LOSS_CAUSES)
def lost(m: Model, invariant: str) -> list[Item]:
    return [c.key for c in m.lost if c.cause == invariant]


@rule("liveness.unseen_over_time")
def unseen(m: Model) -> list[Item]:
    """Reported: the owed messages still unseen at the end."""
    return [c.key for c in m.lost]


# -- Sessions --------------------------------------------------------------------------------------------


def _session_losses(m: Model) -> tuple[list[Item], list[Item]]:
    """(lost sessions, those lost across a fault the target's persistence does not cover)."""
    starts = m.unpromised_starts()
    lost, allowed = [], []
    for life in m.lives.values():
        for loss in life.lost:
            excused = any(loss["t_disconnect"] - m.declared.slack <= s <= loss["t"] for s in starts)
            (allowed if excused else lost).append((life.client, loss["seq"]))
    return lost, allowed


@rule("durability.session_lost")
def session_lost(m: Model) -> list[Item]:
    return _session_losses(m)[0]


@rule("durability.session_lost_allowed")
def session_lost_allowed(m: Model) -> list[Item]:
    return _session_losses(m)[1]


@rule("durability.clean_start_session_present")
def clean_start_session_present(m: Model) -> list[Item]:
    """An accepted connect with clean start 1 (3.1.1 CleanSession = 1) answered session present 1."""
    return [(life.client, c["seq"]) for life in m.lives.values() for c in life.accepted
            if c.get("clean_start") is True and c.get("session_present") is True]


@rule("durability.expired_session_present")
def expired_session_present(m: Model) -> list[Item]:
    """An MQTT 5 reconnect answered session present 1 more than the tolerance after its disconnect + the Session
    Expiry Interval the connection's CONNECT sent (0, none and 0xFFFFFFFF: the session never expires), with no
    fault or node event in that offline window."""
    out = []
    for client in m.lives:
        expiry, gone, online = None, None, False
        for r in m.run.rows:
            if r.get("client") != client or r["kind"] not in (Kind.CONNECT, Kind.DISCONNECT):
                continue
            if r["kind"] == Kind.DISCONNECT:
                if online:
                    online, gone = False, r["t_mono_us"]
                continue
            if (r.get("reason_code") or 0) >= 0x80:
                continue
            if gone is not None and expiry and 0 < expiry < 0xFFFFFFFF and r.get("session_present") is True:
                offline = r["t_mono_us"] - gone
                disturbed = any(s <= r["t_mono_us"] and e >= gone for s, e in m.disturbances())
                if offline > expiry * 1_000_000 + m.declared.tol and not disturbed:
                    out.append((client, r["seq"]))
            expiry = r.get("session_expiry_s") if r.get("protocol") == 5 else None
            online, gone = True, None
    return out


@rule("durability.session_returned")
def session_returned(m: Model) -> list[Item]:
    return [(life.client, r["seq"]) for life in m.lives.values() for r in life.returned]


# -- Each delivered message ------------------------------------------------------------------------------


def phantom_reason(m: Model, r: Received) -> str | None:
    if r.publisher is None or r.pub_seq is None:
        return "payload identity unreadable"
    p = m.messages.get((r.publisher, r.pub_seq))
    if p is None or p.invokes == 0:
        return "never published"
    hashes = [d.row.get("body_hash") for d in r.all if d.row.get("body_hash") is not None]
    if hashes and p.body_hash is not None and (min(hashes) != p.body_hash or max(hashes) != p.body_hash):
        return "body hash differs"
    return None


def _real(m: Model) -> list[Received]:
    return [r for r in m.got.values() if phantom_reason(m, r) is None]


def _key(r: Received) -> Item:
    return r.client, r.publisher, r.pub_seq


@rule("durability.phantom")
def phantom(m: Model) -> list[Item]:
    return [_key(r) for r in m.got.values() if phantom_reason(m, r) is not None]


@rule("durability.delivered_after_failed_publish")
def after_failed_publish(m: Model) -> list[Item]:
    return [_key(r) for r in _real(m) if m.messages[(r.publisher, r.pub_seq)].t_fail is not None
            and m.messages[(r.publisher, r.pub_seq)].t_ack is None]


@rule("durability.unsubscribed_delivery")
def unsubscribed(m: Model) -> list[Item]:
    tol, out = m.declared.tol, []
    for r in _real(m):
        p = m.messages[(r.publisher, r.pub_seq)]
        held = any(s.client == r.client and matches(s.topic_filter, p.topic) and s.t_from <= r.t_first + tol
                   and (s.t_to is None or s.t_to >= p.t_invoke - tol) for s in m.subscriptions)
        if not held:
            out.append(_key(r))
    return out


def _may_have_resent(m: Model, publisher: str) -> Callable[[Any], bool]:
    """Whether the publisher may have sent the message twice: published more than once, or it disconnected
    between its publish and its outcome."""
    life = m.lives.get(publisher)

    def check(p) -> bool:
        end = p.t_ack if p.t_ack is not None else p.t_fail if p.t_fail is not None else NEVER
        return p.invokes > 1 or any(p.t_invoke <= t <= end for _, t in (life.disconnects if life else []))
    return check


@rule("durability.discarded_session_delivery")
def discarded_session(m: Model) -> list[Item]:
    out = []
    for r in _real(m):
        p = m.messages[(r.publisher, r.pub_seq)]
        life = m.lives.get(r.client)
        if p.t_ack is None or life is None:
            continue
        began = [s for s in life.new_sessions if s["seq"] < r.last.seq]
        if not began or not p.t_ack + m.declared.slack + m.declared.tol < began[-1]["t"]:
            continue
        disturbed = any(s <= r.last.t and e + m.declared.slack >= p.t_invoke for s, e in m.disturbances())
        if not disturbed and not _may_have_resent(m, p.publisher)(p):
            out.append(_key(r))
    return out


def _only_shared(m: Model, client: str, topic: str | None) -> bool:
    """The client holds only shared subscriptions matching ``topic``: what it gets is its group's message."""
    mine = [s for s in m.subscriptions if s.client == client and topic is not None and matches(s.topic_filter, topic)]
    return bool(mine) and all(shared(s.topic_filter) for s in mine)


def _groups(m: Model) -> dict[str, list]:
    """Each shared subscription's text -> the members' granted subscriptions to it."""
    groups: dict[str, list] = {}
    for sub in m.subscriptions:
        if shared(sub.topic_filter) and (sub.granted or 0) > 0:
            groups.setdefault(sub.topic_filter, []).append(sub)
    return groups


def _held_to_the_end(subs: list, t: int) -> bool:
    """Some member held the group at ``t`` and, member after member, until the history's end."""
    reach = None  # how far the members holding it so far reach (NEVER: to the end)
    for sub in sorted(subs, key=lambda x: x.t_from):
        end = NEVER if sub.t_to is None else sub.t_to
        if reach is None:
            if sub.t_from < t and end > t:
                reach = end
        elif sub.t_from <= reach:
            reach = max(reach, end)
    return reach == NEVER


@rule("shared.lost")
def shared_lost(m: Model) -> list[Item]:
    """A message a group was owed that none of its members acknowledged, nor held on a connection open at the
    end.  Owed: QoS 1 (QoS 2 while no member's subscription ended), acknowledged to its publisher while the group
    was held, held from then to the end, not expirable by the end."""
    end = max((r["t_mono_us"] for r in m.run.rows), default=0)
    out: list[Item] = []
    for name, subs in sorted(_groups(m).items()):
        members = {s.client for s in subs}
        stable = all(s.t_to is None for s in subs)
        for p in m.messages.values():
            if (p.invokes == 0 or p.topic is None or p.t_ack is None or not matches(name, p.topic)
                    or not (p.qos == 1 or (p.qos == 2 and stable)) or deadline(p, m.declared) <= end
                    or not _held_to_the_end(subs, p.t_invoke)):
                continue
            copies = [m.got[(c, p.publisher, p.pub_seq)] for c in members if (c, p.publisher, p.pub_seq) in m.got]
            settled = any(d.acked for r in copies for d in r.all) or any(
                not any(seq > r.first.seq for seq, _ in m.lives[r.client].disconnects) for r in copies)
            if not settled:
                out.append((name, p.publisher, p.pub_seq))
    return out


def _group_copies(m: Model):
    """Each (group, published message on a topic its filter matches, what its members got of it: Received)."""
    for name, subs in sorted(_groups(m).items()):
        members = sorted({s.client for s in subs})
        for p in m.messages.values():
            if p.invokes == 0 or p.topic is None or not matches(name, p.topic):
                continue
            yield name, p, [m.got[(c, p.publisher, p.pub_seq)] for c in members if (c, p.publisher, p.pub_seq) in m.got]


def _ended_after(m: Model, client: str, t: int) -> int | None:
    """When the client's first connection end at or after ``t`` came (None: none before the history's end)."""
    return min((at for _, at in m.lives[client].disconnects if at >= t), default=None)


@rule("shared.redelivered_after_ack")
def shared_redelivered_after_ack(m: Model) -> list[Item]:
    """A member acknowledged the message, its connection lived on for the clock tolerance after (the PUBACK left
    its socket), and later than that tolerance another member got it, with no fault or node event between."""
    tol, slack = m.declared.tol, m.declared.slack
    out: list[Item] = []
    for name, p, copies in _group_copies(m):
        for a in copies:
            ack_t = a.first_ack_t
            if ack_t is None:
                continue
            ended = _ended_after(m, a.client, ack_t)
            if ended is not None and ended - ack_t < tol:
                continue
            if any(b.client != a.client and b.t_first > ack_t + tol
                   and not any(s <= b.t_first and e + slack >= ack_t for s, e in m.disturbances()) for b in copies):
                out.append((name, p.publisher, p.pub_seq))
                break
    return out


@rule("shared.duplicates")
def shared_duplicates(m: Model) -> list[Item]:
    """A message of a group that more than one member got (counted, never failing)."""
    return [(name, p.publisher, p.pub_seq) for name, p, copies in _group_copies(m) if len(copies) > 1]


@rule("order.dup_flag")
def dup_flag(m: Model) -> list[Item]:
    """DUP on a first delivery over a connection established before the publish (item: the message), DUP
    missing on a resend, and DUP on a QoS 0 delivery (items: the deliveries)."""
    out: list[Item] = []
    for r in m.got.values():
        if not r.first.row.get("dup") or r.qos <= 0 or _only_shared(m, r.client, r.first.row.get("topic")):
            continue  # a group's member may get another member's unacknowledged message as a resend
        p = m.messages.get((r.publisher, r.pub_seq))
        t_invoke = p.t_invoke if p is not None else None
        before = [c for c in m.lives[r.client].accepted if c["seq"] < r.first.seq] if r.client in m.lives else []
        if t_invoke is None:
            # Nothing to compare a connect with: undecided where a connect came before, decided "not since" else.
            since: bool | None = None if before else False
        else:
            since = any(c["t_mono_us"] > t_invoke for c in before)
        if since is False:
            out.append(_key(r))
    out += [(d.row["client"], d.seq) for d in m.deliveries if d.resend and not d.row.get("dup")]
    # A QoS 0 PUBLISH is never a resend: its DUP is 0 (item: the delivery).
    out += [(d.row["client"], d.seq) for d in m.deliveries if d.qos == 0 and d.row.get("dup")]
    return out


@rule("order.out_of_order")
def out_of_order(m: Model) -> list[Item]:
    """Within a stream (subscriber, publisher, topic and QoS of the first delivery), in first-delivery order,
    a pub_seq lower than one already received.  A retained copy (first delivery RETAIN 1: the topic's stored
    message sent for a new subscription, [MQTT-3.3.1-6]) is no forward of the stream: it is a stream of its own."""
    streams: dict[tuple, list[Received]] = {}
    for r in m.got.values():
        first = r.first.row
        streams.setdefault((r.client, r.publisher, first.get("topic"), first.get("qos"), bool(first.get("retain"))),
                           []).append(r)
    out = []
    for (client, _, topic, _, _), members in streams.items():
        if _only_shared(m, client, topic):  # a member's share keeps no order (MQTT 5 §4.8.2)
            continue
        highest = None
        for r in sorted(members, key=lambda x: x.first.seq):
            if r.pub_seq is not None and highest is not None and r.pub_seq < highest:
                out.append(_key(r))
            if r.pub_seq is not None:
                highest = r.pub_seq if highest is None else max(highest, r.pub_seq)
    return out


@rule("expiry.delivered_expired")
def delivered_expired(m: Model) -> list[Item]:
    return [_key(r) for r in _real(m)
            if r.t_last > deadline(m.messages[(r.publisher, r.pub_seq)], m.declared) + m.declared.tol]


@rule("expiry.remaining_not_reduced")
def remaining_not_reduced(m: Model) -> list[Item]:
    """A remaining expiry above the published interval, or one that ends (delivery + remaining) a second or more
    past the deadline + tolerance: whole seconds on the wire may add less than 1 s, no more."""
    out = []
    for r in _real(m):
        p = m.messages[(r.publisher, r.pub_seq)]
        remaining = [(d.t, d.row["remaining_expiry_s"]) for d in r.all if d.row.get("remaining_expiry_s") is not None]
        if p.expiry_s is None or not remaining:
            continue
        implied = max(t + rem * 1_000_000 for t, rem in remaining)
        if max(rem for _, rem in remaining) > p.expiry_s or implied >= deadline(p, m.declared) + m.declared.tol + 1_000_000:
            out.append(_key(r))
    return out


@rule("expiry.property_missing")
def property_missing(m: Model) -> list[Item]:
    """Published over MQTT 5 with an expiry interval, delivered over MQTT 5 without a remaining one."""
    return [_key(r) for r in _real(m)
            if m.messages[(r.publisher, r.pub_seq)].expiry_s is not None
            and m.messages[(r.publisher, r.pub_seq)].protocol == 5
            and any(d.row.get("protocol") == 5 and d.row.get("remaining_expiry_s") is None for d in r.all)]


@rule("props.forwarded_changed")
def forwarded_changed(m: Model) -> list[Item]:
    """An MQTT 5 publisher's message on an MQTT 5 delivery with other forwarded properties (none = none)."""
    return [_key(r) for r in _real(m) if m.messages[(r.publisher, r.pub_seq)].protocol == 5
            and any(d.row.get("protocol") == 5 and d.row.get("props") != m.messages[(r.publisher, r.pub_seq)].props
                    for d in r.all)]


def _held(m: Model, r: Received, throughout: bool = False) -> list:
    """The client's subscriptions matching the message's topic that may have routed it (held at some moment
    between the publish and the last delivery, ± tolerance), or (``throughout``) that certainly did (from before
    the publish was invoked to after the last delivery + tolerance)."""
    p, tol = m.messages[(r.publisher, r.pub_seq)], m.declared.tol
    out = []
    for s in m.subscriptions:
        if s.client != r.client or not matches(s.topic_filter, p.topic):
            continue
        if throughout:
            ok = s.t_from < p.t_invoke and (s.t_to is None or s.t_to > r.t_last + tol)
        else:
            ok = s.t_from <= r.t_last + tol and (s.t_to is None or s.t_to >= p.t_invoke - tol)
        if ok:
            out.append(s)
    return out


def _sub_ids(d) -> list[int]:
    """A delivery's Subscription Identifiers, as a sorted set of numbers (what does not read as one is none)."""
    ids = set()
    for part in (d.row.get("sub_ids") or "").split(","):
        try:
            ids.add(int(part.strip()))
        except ValueError:
            continue
    return sorted(ids)


@rule("props.subscription_ids")
def subscription_ids(m: Model) -> list[Item]:
    """Judged where every subscription held was held throughout: each MQTT 5 copy carries all the held
    subscriptions' identifiers, or each at most one, together the lowest and the highest of them, a copy without
    one only where a held subscription has none."""
    out = []
    for r in _real(m):
        copies = [d for d in r.all if d.row.get("protocol") == 5]
        held = _held(m, r)
        throughout = _held(m, r, throughout=True)
        if not copies or not held or any(s not in throughout for s in held):
            continue
        expected = sorted({s.sub_id for s in held if s.sub_id is not None})
        carried = [_sub_ids(d) for d in copies]
        counts = [0 if d.row.get("sub_ids") is None else len(ids) for d, ids in zip(copies, carried, strict=True)]
        if all(ids == expected for ids in carried):
            continue  # one copy with them all (or none where none has one)
        lows = [ids[0] for ids in carried if ids]
        highs = [ids[-1] for ids in carried if ids]
        per_subscription = (max(counts) <= 1
                            and (max(counts) == 0 or (min(lows) in expected and max(highs) in expected))
                            and (min(counts) >= 1 or any(s.sub_id is None for s in held)))
        if not per_subscription:
            out.append(_key(r))
    return out


@rule("props.retain_as_published")
def retain_as_published(m: Model) -> list[Item]:
    """RETAIN 1 on a copy of a message published with RETAIN 0; published with RETAIN 1: RETAIN 0 on a copy
    though every held subscription has Retain As Published, or RETAIN 1 though none has it and none began after
    the publish (a retained message sent to a new subscription)."""
    out = []
    for r in _real(m):
        p = m.messages[(r.publisher, r.pub_seq)]
        flags = [bool(d.row.get("retain")) for d in r.all]
        held = _held(m, r)
        if not p.retain:
            broken = any(flags)
        else:
            every_rap = bool(held) and all(s.rap for s in held)
            new_one = any(s.t_from >= p.t_invoke - m.declared.tol for s in held)
            broken = (every_rap and not all(flags)) or (not any(s.rap for s in held) and not new_one and any(flags))
        if broken:
            out.append(_key(r))
    return out


# -- QoS --------------------------------------------------------------------------------------------------


def _grants(m: Model, r: Received, throughout: bool) -> list[int]:
    return [s.granted for s in _held(m, r, throughout)]


def _qos_seen(r: Received) -> list[int]:
    return [d.row["qos"] for d in r.all if d.row.get("qos") is not None]


@rule("qos.upgraded")
def qos_upgraded(m: Model) -> list[Item]:
    return [_key(r) for r in _real(m) if _qos_seen(r) and m.messages[(r.publisher, r.pub_seq)].qos is not None
            and max(_qos_seen(r)) > m.messages[(r.publisher, r.pub_seq)].qos]


@rule("qos.above_grant")
def qos_above_grant(m: Model) -> list[Item]:
    return [_key(r) for r in _real(m) if _qos_seen(r) and _grants(m, r, False)
            and max(_qos_seen(r)) > max(_grants(m, r, False))]


@rule("qos.downgraded")
def qos_downgraded(m: Model) -> list[Item]:
    """Below what the strongest subscription held throughout owes (the highest copy), or a copy below what the
    lowest grant held at all allows (overlapping subscriptions: once at the highest, or once each)."""
    out = []
    for r in _real(m):
        published, seen = m.messages[(r.publisher, r.pub_seq)].qos, _qos_seen(r)
        if published is None or not seen:
            continue
        strongest, held = _grants(m, r, True), _grants(m, r, False)
        if (strongest and max(seen) < min(published, max(strongest))) or (held and min(seen) < min(published, min(held))):
            out.append(_key(r))
    return out


@rule("qos2.pubrel_not_resent")
def pubrel_not_resent(m: Model) -> list[Item]:
    """A QoS 2 PUBLISH answered with PUBREC (qos2_received), its connection then ended, the next accepted connect
    resumed the session (session present 1), and the message was never released after it (no delivery of it
    later, no PUBREL for its packet id before the id carried another message).  Not judged when the connection
    ended within the clock tolerance after the PUBREC."""
    out = []
    rows = m.run.rows
    for i, rec in enumerate(rows):
        if rec["kind"] != Kind.QOS2_RECEIVED:
            continue
        client, key = rec.get("client"), (rec.get("publisher"), rec.get("pub_seq"))
        life = m.lives.get(client)
        resume = next((c for c in (life.accepted if life else []) if c["seq"] > rec["seq"]), None)
        if resume is None or resume.get("session_present") is not True:
            continue
        gone = next((t for seq, t in life.disconnects if seq > rec["seq"]), None)
        ended = min(t for t in (gone, resume["t_mono_us"]) if t is not None)
        if ended - rec["t_mono_us"] < m.declared.tol:
            continue
        later = [r for r in rows[i + 1:] if r.get("client") == client]
        released = any(r["kind"] == Kind.DELIVERY and r.get("qos") == 2 and (r.get("publisher"), r.get("pub_seq")) == key
                       for r in later)
        same_slot = [r for r in later if r.get("packet_id") == rec.get("packet_id") and r["kind"] in (
            Kind.QOS2_RECEIVED, Kind.PUBREL_RECEIVED) or (r["kind"] == Kind.DELIVERY and r.get("qos") == 2
                                                          and r.get("packet_id") == rec.get("packet_id"))]
        for r in same_slot:
            if r["kind"] == Kind.PUBREL_RECEIVED and not detail(r).get("held"):
                released = True
                break
            if r["kind"] != Kind.PUBREL_RECEIVED and (r.get("publisher"), r.get("pub_seq")) != key:
                break  # the id carries another message now: no PUBREL for this one
        if not released:
            out.append((client, rec["seq"]))
    return out


# -- MQTT 5 flow control ---------------------------------------------------------------------------------


def _connect_limit(m: Model, client: str, seq: int, key: str) -> int | None:
    """What the CONNECT of the connection a row at ``seq`` came on sent (MQTT 5 detail ``key``; None: none)."""
    before = [r for r in m.connect_rows(client) if r["seq"] < seq]
    if not before or before[-1].get("protocol") != 5:
        return None
    return detail(before[-1]).get(key)


@rule("flow.packet_too_large")
def packet_too_large(m: Model) -> list[Item]:
    out = []
    for d in m.deliveries:
        limit = _connect_limit(m, d.row["client"], d.seq, "maximum_packet_size")
        if limit is not None and d.row.get("packet_size") is not None and d.row["packet_size"] > limit:
            out.append((d.row["client"], d.seq))
    return out


@rule("flow.receive_maximum")
def receive_maximum(m: Model) -> list[Item]:
    """Per connection that sent a Receive Maximum: its QoS > 0 PUBLISH packets (a QoS 1 delivery, a QoS 2
    qos2_received) each open their packet id until the client's ack closes it; a PUBLISH that opens one while
    as many as the Receive Maximum are open is one too many."""
    out = []
    for client in m.lives:
        open_ids: set = set()
        conn = None
        for r in m.run.rows:
            if r.get("client") != client:
                continue
            if r["kind"] == Kind.CONNECT:
                open_ids, conn = set(), r  # a connection counts afresh (MQTT 5 §4.9)
                continue
            arrival = r["kind"] == Kind.QOS2_RECEIVED or (r["kind"] == Kind.DELIVERY and r.get("qos") == 1)
            if not arrival and r["kind"] != Kind.DELIVERY_ACK_SENT:
                continue
            limit = detail(conn).get("receive_maximum") if conn is not None and conn.get("protocol") == 5 else None
            if limit is None:
                continue
            if arrival and r.get("packet_id") not in open_ids:
                open_ids.add(r.get("packet_id"))
                if len(open_ids) > limit:
                    out.append((client, r["seq"]))
            elif not arrival:
                open_ids.discard(r.get("packet_id"))
    return out


def _after_ack(r: Received) -> tuple[dict[str, Any] | None, list]:
    """(the first ack of the message, its deliveries after that ack)."""
    ack = r.first_ack
    return ack, [d for d in r.all if ack is not None and d.seq > ack["seq"]]


def _redelivered(m: Model) -> list[Received]:
    out = []
    for r in _real(m):
        ack, again = _after_ack(r)
        if not again:
            continue
        life = m.lives.get(r.client)
        # A connection that closed within the tolerance after the ack: the PUBACK may never have left.
        maybe_lost = any(ack["seq"] < seq < again[0].seq and t - r.first_ack_t < m.declared.tol
                         for seq, t in (life.disconnects if life else []))
        if not maybe_lost:
            out.append(r)
    return out


@rule("duplicates.redelivered_after_ack")
def redelivered_after_ack(m: Model) -> list[Item]:
    return [_key(r) for r in _redelivered(m) if r.qos < 2]


@rule("duplicates.qos2")
def qos2_twice(m: Model) -> list[Item]:
    return [_key(r) for r in _redelivered(m) if r.qos == 2]


def _retained_pair(copies: list, i: int) -> bool:
    """copies[i] and copies[i + 1] are the connection's first two copies of the message, one the retained copy a
    SUBSCRIBE sent (RETAIN 1), the other the normal forward (RETAIN 0) of a message published just before that
    subscription: MQTT allows both ([MQTT-3.3.1-9], [MQTT-3.3.1-12]); the Spark twin is job/messages.py ``twice``."""
    prev, d = copies[i], copies[i + 1]
    first_two = i == 0 or copies[i - 1].conn != d.conn
    return first_two and bool(prev.row.get("retain")) != bool(d.row.get("retain"))


@rule("duplicates.backlog_twice_in_connection")
def backlog_twice(m: Model) -> list[Item]:
    out = []
    for r in _real(m):
        twice = next((d for i, (prev, d) in enumerate(zip(r.all, r.all[1:], strict=False))
                      if prev.conn == d.conn and not d.resend and not _retained_pair(r.all, i)), None)
        if twice is None:
            continue
        p = m.messages[(r.publisher, r.pub_seq)]
        slack = m.declared.slack
        disturbed = any(s <= twice.t and e + slack >= p.t_invoke - slack for s, e in m.disturbances())
        if not disturbed and not _may_have_resent(m, p.publisher)(p):
            out.append(_key(r))
    return out


@rule("liveness.stuck_inflight")
def stuck_inflight(m: Model) -> list[Item]:
    """Reported: QoS > 0 messages delivered and never acknowledged by the subscriber (no delivery of them
    answered by an ack)."""
    return [_key(r) for r in _real(m) if any(d.qos > 0 for d in r.all) and r.first_ack is None]


# -- Each delivery's packet-id slot ----------------------------------------------------------------------


@rule("order.packet_id_invalid")
def packet_id_invalid(m: Model) -> list[Item]:
    return [(d.row["client"], d.seq) for d in m.deliveries
            if d.qos > 0 and (d.row.get("packet_id") is None or not 1 <= d.row["packet_id"] <= 65535)]


@rule("order.packet_id_reused")
def packet_id_reused(m: Model) -> list[Item]:
    """Not across a reconnect of a client holding only shared subscriptions: what it left unacknowledged its group
    may have handed to another member, out of its session (MQTT 5 §4.8.2)."""
    members = {c for c in {s.client for s in m.subscriptions}
               if all(shared(s.topic_filter) for s in m.subscriptions if s.client == c)}
    return [(d.row["client"], d.seq) for d in m.deliveries
            if d.reused and not (d.row["client"] in members and d.prev_conn is not None and d.prev_conn < d.conn)]


@rule("order.resend_within_connection")
def resend_within_connection(m: Model) -> list[Item]:
    return [(d.row["client"], d.seq) for d in m.deliveries
            if d.resend and d.prev_conn == d.conn and d.row.get("protocol") == 5]


# -- Backlogs and snapshots ------------------------------------------------------------------------------


@rule("limits.over_limit")
def over_limit(m: Model) -> list[Item]:
    """Black box: more of one settled backlog delivered at or after its reconnect than the limit; white box: a
    snapshot's queue longer than the limit."""
    backlogs = {(c.client, c.window.c): c.backlog for c in m.claims if c.candidate and c.in_backlog}
    out: list[Item] = [k for k, b in backlogs.items() if b["settled_kept"] > m.declared.limit]
    if m.declared.white_box:
        out += [(s.get("client"), s["seq"]) for s in m.snapshots if (s.get("zset_size") or 0) > m.declared.limit]
    return out


@rule("whitebox.orphan_payloads")
def orphan_payloads(m: Model) -> list[Item]:
    return [(s.get("client"), s["seq"]) for s in m.snapshots if (s.get("orphan_payloads") or 0) > 0]


@rule("whitebox.dangling_refs")
def dangling_refs(m: Model) -> list[Item]:
    return [(s.get("client"), s["seq"]) for s in m.snapshots if (s.get("dangling_refs") or 0) > 0]


@rule("whitebox.last_packet_id_behind")
def last_packet_id_behind(m: Model) -> list[Item]:
    """The stored last packet id behind (mod 65535, by less than half) the last stored id delivered: a QoS > 0
    delivery of the client's latest session, when that session is persistent."""
    last: dict[str, int] = {}
    for d in m.deliveries:  # seq order: the last one wins
        life = m.lives.get(d.row["client"])
        if (life is None or d.epoch == 0 or d.epoch != len(life.fresh_seqs) or d.qos <= 0
                or d.row.get("packet_id") is None or life.fresh_seqs[d.epoch - 1] not in life.persistent_fresh_seqs):
            continue
        last[life.client] = d.row["packet_id"]
    out = []
    for s in m.snapshots:
        if s.get("client") in last and s.get("last_packet_id") is not None:
            if 0 < (last[s["client"]] - s["last_packet_id"]) % 65535 < 32768:
                out.append((s["client"], s["seq"]))
    return out


# -- The run ---------------------------------------------------------------------------------------------


@rule("health.unplanned_exit")
def unplanned_exit(m: Model) -> list[Item]:
    return [(e.get("node"), e["t_mono_us"]) for e in m.node_events if detail(e).get("action") == "exited"]


@rule("meta.fault_bit")
def fault_bit(m: Model) -> list[Item]:
    """Counted (never failing): faults applied without proof that they bit."""
    return [f.fault_id for f in m.faults if f.errors == 0 and f.bit is not True]


# -- The reference broker's stored packet ids ------------------------------------------------------------


@rule("whitebox.packet_id_sequence")
def packet_id_sequence(m: Model) -> list[Item]:
    """Within one persistent session (and one run of ids after a preset of its counter), the deliveries that take
    a new stored id, put in the order the broker handed the ids out (laps x 65535 + id), skip no more ids than
    the never-delivered QoS > 0 messages on the client's topics published since the session began explain; a
    skip while a fault or node event was around is not judged, nor an APPLICATION client (its ids follow its
    Kafka topic's offsets, not save.lua's counter).  Item: the delivery where the shortfall reaches a new high."""
    out: list[Item] = []
    presets: dict[str, list[int]] = {}
    for s in m.snapshots:
        if detail(s).get("when") == "preset":
            presets.setdefault(s.get("client"), []).append(s["seq"])
    missing: dict[str, list[int]] = {}
    for c in m.claims:
        if not c.delivered and (c.message.qos or 0) > 0:
            missing.setdefault(c.client, []).append(c.message.t_invoke)
    runs: dict[tuple, list] = {}
    for d in m.deliveries:
        life = m.lives.get(d.row["client"])
        if not _takes_new_id(d, life) or is_application(m.declared.application_clients, life.client):
            continue
        since = life.fresh_seqs[d.epoch - 1]
        segment = sum(1 for p in presets.get(life.client, []) if since < p < d.seq)
        runs.setdefault((life.client, d.epoch, segment), []).append(d)
    for (client, epoch, segment), ids in runs.items():
        life = m.lives[client]
        began = next((c["t_mono_us"] for c in life.accepted if c["seq"] == life.fresh_seqs[epoch - 1]), None)
        placed, lap, last_valid, after_valid = [], 0, None, None
        for d in ids:  # seq order: a lap where the id drops (a wrap) or climbs back by more than half the space
            pid = d.row["packet_id"]
            valid = 1 <= pid <= 65535 and not d.reused
            if valid and last_valid is not None:
                lap += 1 if pid < last_valid - 32767 else -1 if pid > last_valid + 32767 else 0
            if valid:
                placed.append((lap * 65535 + pid, d, after_valid))
                last_valid = pid
            after_valid = valid
        placed.sort(key=lambda x: (x[0], x[1].seq))
        skipped, worst, reach, prev = 0, None, None, None
        for pos, d, after in placed:
            reach = d.t if reach is None else max(reach, d.t)
            if after is False:
                gap = None  # right after an invalid or reused id: its own rule reports it
            elif prev is None:
                gap = d.row["packet_id"] - 1 if epoch > 1 and segment == 0 else None
            else:
                gap = pos - prev[0] - 1
            if gap is not None and gap > 0:
                t_from = min(prev[1].t if prev is not None else began if began is not None else d.t, d.t)
                slack = m.declared.slack
                faulted = any(s <= reach and e + slack >= t_from - slack for s, e in m.disturbances())
                judged = 0 if faulted else gap
                skipped += judged
                explained = sum(1 for t in missing.get(client, [])
                                if t < reach and (began is None or t >= began - slack))
                deficit = skipped - explained
                if judged > 0 and deficit > max(worst if worst is not None else 0, 0):
                    out.append((client, d.seq))
                worst = deficit if worst is None else max(worst, deficit)
            prev = (pos, d)
    return out


def _takes_new_id(d, life) -> bool:
    """A QoS > 0 delivery of a persistent session (an id the reference broker stored) that is not the message
    its id held last in this session (a resend keeps its id)."""
    if (life is None or d.epoch == 0 or d.qos <= 0 or d.row.get("packet_id") is None
            or life.fresh_seqs[d.epoch - 1] not in life.persistent_fresh_seqs):
        return False
    holder = d.holder
    return not (holder is not None and life.epoch(holder["seq"]) == d.epoch
                and (holder.get("publisher"), holder.get("pub_seq")) == d.key)
