"""Anomalies planted in the rows of a correct run (oracle/simulate.py): each ``PERTURBATIONS[name](rows, choice)``
returns new rows with one anomaly (``choice`` picks where, modulo the places it fits), or None where it fits
nowhere.  What a perturbation breaks is left to the judges: the point is that the oracle and the checkers see
the same anomalous history.  A few change the run, not its rows (``RUN_PERTURBATIONS``: the manifest)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

from contracts.history_schema import Kind, Phase

Row = dict
Rows = list[Row]


def _deliveries(rows: Rows, qos_positive: bool = False) -> list[int]:
    return [i for i, r in enumerate(rows) if r["kind"] == Kind.DELIVERY and (not qos_positive or (r.get("qos") or 0) > 0)]


def _pick(candidates: list, choice: int):
    return candidates[choice % len(candidates)] if candidates else None


def _ack_of(rows: Rows, i: int) -> int | None:
    """The ack row that answers delivery ``i``: the next row of its client and packet id, if an ack."""
    d = rows[i]
    for j in range(i + 1, len(rows)):
        r = rows[j]
        if r.get("client") == d.get("client") and r.get("packet_id") == d.get("packet_id") and r["kind"] in (
                Kind.DELIVERY, Kind.DELIVERY_ACK_SENT):
            return j if r["kind"] == Kind.DELIVERY_ACK_SENT else None
    return None


def _between(rows: Rows, i: int) -> int:
    """A time strictly between row ``i`` and the next (the rows' times are strictly increasing)."""
    t = rows[i]["t_mono_us"]
    later = rows[i + 1]["t_mono_us"] if i + 1 < len(rows) else t + 2
    return t + max(1, (later - t) // 2) if later - t > 1 else t


def _sorted(rows: Rows) -> Rows:
    return sorted(rows, key=lambda r: r["t_mono_us"])


def drop_delivery(rows: Rows, choice: int) -> Rows | None:
    """A delivery never arrives (with its ack and QoS 2 steps); mostly one at QoS > 0 (one that may be owed)."""
    i = _pick(_deliveries(rows, qos_positive=choice % 4 != 0), choice // 4)
    if i is None:
        return None
    d = rows[i]
    gone = {i}
    ack = _ack_of(rows, i)
    if ack is not None:
        gone.add(ack)
    for j in range(max(0, i - 3), i):
        if rows[j]["kind"] in (Kind.QOS2_RECEIVED, Kind.PUBREL_RECEIVED) and rows[j].get("client") == d.get("client") \
                and rows[j].get("packet_id") == d.get("packet_id"):
            gone.add(j)
    return [r for j, r in enumerate(rows) if j not in gone]


IDENTITY = ("publisher", "pub_seq", "body_hash", "send_wall_us", "remaining_expiry_s", "props", "topic")


def swap_messages(rows: Rows, choice: int) -> Rows | None:
    """Two deliveries of one client carry each other's message (the packet ids stay where they were)."""
    by_client: dict[str, list[int]] = {}
    for i in _deliveries(rows):
        by_client.setdefault(rows[i]["client"], []).append(i)
    pairs = [(a, b) for idx in by_client.values() for a, b in zip(idx, idx[1:], strict=False)]
    pair = _pick(pairs, choice)
    if pair is None:
        return None
    rows = copy.deepcopy(rows)
    a, b = rows[pair[0]], rows[pair[1]]
    for key in IDENTITY:
        a[key], b[key] = b.get(key), a.get(key)
    return rows


def resend_before_ack(rows: Rows, choice: int) -> Rows | None:
    """The same PUBLISH again, same packet id, before the client acknowledged it (DUP as the choice says)."""
    candidates = [i for i in _deliveries(rows, qos_positive=True)]
    i = _pick(candidates, choice)
    if i is None:
        return None
    copy_row = {**rows[i], "t_mono_us": _between(rows, i), "dup": choice % 3 != 0}
    return _sorted([*rows, copy_row])


def deliver_again(rows: Rows, choice: int) -> Rows | None:
    """The message again later on the same connection, with an unused packet id, acknowledged."""
    candidates = _deliveries(rows)
    i = _pick(candidates, choice)
    if i is None:
        return None
    d = rows[i]
    end = next((j for j in range(i + 1, len(rows)) if rows[j].get("client") == d["client"]
                and rows[j]["kind"] in (Kind.DISCONNECT, Kind.CONNECT)), len(rows))
    at = i + 1 + (choice // 7) % max(1, end - i - 1) if end - i > 1 else i
    used = {r.get("packet_id") for r in rows if r.get("client") == d["client"] and r.get("packet_id")}
    pid = next(p for p in range(1, 70000) if p not in used) if d.get("qos") else None
    t = _between(rows, min(at, len(rows) - 1))
    again = {**d, "t_mono_us": t, "packet_id": pid, "dup": choice % 2 == 1}
    extra = [again]
    if d.get("qos"):
        extra.append({"kind": Kind.DELIVERY_ACK_SENT, "t_mono_us": t + 1, "client": d["client"], "node": d.get("node"),
                      "protocol": d.get("protocol"), "topic": d.get("topic"), "qos": d.get("qos"), "packet_id": pid,
                      "publisher": d.get("publisher"), "pub_seq": d.get("pub_seq")})
    return _sorted([*rows, *extra])


def redeliver_after_reconnect(rows: Rows, choice: int) -> Rows | None:
    """An acknowledged message sent again (DUP) right after its client's next reconnect."""
    options = []
    for i in _deliveries(rows, qos_positive=True):
        d = rows[i]
        nxt = next((j for j in range(i + 1, len(rows)) if rows[j]["kind"] == Kind.CONNECT
                    and rows[j].get("client") == d["client"]), None)
        if nxt is not None and _ack_of(rows, i) is not None:
            options.append((i, nxt))
    pick = _pick(options, choice)
    if pick is None:
        return None
    i, nxt = pick
    return _sorted([*rows, {**rows[i], "t_mono_us": _between(rows, nxt), "dup": True}])


def flip_dup(rows: Rows, choice: int) -> Rows | None:
    i = _pick(_deliveries(rows), choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["dup"] = not rows[i].get("dup")
    return rows


def reuse_packet_id(rows: Rows, choice: int) -> Rows | None:
    """A delivery takes the packet id of an earlier one of its session that is left unacknowledged."""
    qos = _deliveries(rows, qos_positive=True)
    pairs = []
    for a, b in zip(qos, qos[1:], strict=False):
        if rows[a]["client"] != rows[b]["client"] or rows[a]["packet_id"] == rows[b]["packet_id"]:
            continue
        between = rows[a + 1:b]
        if any(r["kind"] == Kind.CONNECT and r.get("client") == rows[a]["client"] for r in between):
            continue
        pairs.append((a, b))
    pair = _pick(pairs, choice)
    if pair is None:
        return None
    a, b = pair
    ack_a, ack_b = _ack_of(rows, a), _ack_of(rows, b)
    rows = copy.deepcopy(rows)
    pid = rows[a]["packet_id"]
    rows[b]["packet_id"] = pid
    if ack_b is not None:
        rows[ack_b]["packet_id"] = pid
    return [r for j, r in enumerate(rows) if j != ack_a or (ack_a is not None and ack_a > b)]


def invalid_packet_id(rows: Rows, choice: int) -> Rows | None:
    i = _pick(_deliveries(rows, qos_positive=True), choice)
    if i is None:
        return None
    ack = _ack_of(rows, i)
    rows = copy.deepcopy(rows)
    bad = (0, None, 70000)[choice % 3]
    rows[i]["packet_id"] = bad
    if ack is not None:
        rows[ack]["packet_id"] = bad
    return rows


def lose_session(rows: Rows, choice: int) -> Rows | None:
    """A resumed session answered session present 0."""
    connects = [i for i, r in enumerate(rows) if r["kind"] == Kind.CONNECT and r.get("clean_start") is False
                and r.get("session_present") is True]
    i = _pick(connects, choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["session_present"] = False
    return rows


def present_session(rows: Rows, choice: int) -> Rows | None:
    """A connect without a session to resume (or one asking for a clean start) answered session present 1."""
    connects = [i for i, r in enumerate(rows) if r["kind"] == Kind.CONNECT and r.get("session_present") is False
                and r.get("client", "").startswith("sub")]
    i = _pick(connects, choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["session_present"] = True
    return rows


def _deadline(rows: Rows, d: Row, ttl_s: int | None) -> int | None:
    invoke = next((r for r in rows if r["kind"] == Kind.PUBLISH_INVOKE and r.get("publisher") == d.get("publisher")
                   and r.get("pub_seq") == d.get("pub_seq")), None)
    if invoke is None:
        return None
    expiry = invoke.get("expiry_s")
    if expiry is None and ttl_s is None:
        return None
    return invoke["t_mono_us"] + (expiry if expiry is not None else ttl_s) * 1_000_000


def deliver_late(rows: Rows, choice: int, ttl_s: int | None = None) -> Rows | None:
    """A delivery of a message with a lifetime moved past its deadline (by a little, or well past the tolerance)."""
    options = [(i, dl) for i in _deliveries(rows) if (dl := _deadline(rows, rows[i], ttl_s)) is not None]
    pick = _pick(options, choice)
    if pick is None:
        return None
    i, dl = pick
    late = (50_000, 600_000, 2_500_000)[choice % 3]
    rows = copy.deepcopy(rows)
    rows[i]["t_mono_us"] = dl + late + 7
    return _sorted(rows)


def keep_remaining_expiry(rows: Rows, choice: int) -> Rows | None:
    """A delivery's remaining expiry not reduced by the time the message waited (or raised)."""
    options = [i for i in _deliveries(rows) if rows[i].get("remaining_expiry_s") is not None]
    i = _pick(options, choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["remaining_expiry_s"] += 1 + choice % 3
    return rows


def phantom(rows: Rows, choice: int) -> Rows | None:
    i = _pick(_deliveries(rows), choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    how = choice % 3
    if how == 0:
        rows[i]["body_hash"] = "00000000deadbeef"
    elif how == 1:
        rows[i]["pub_seq"] = (rows[i].get("pub_seq") or 0) + 1000
    else:
        rows[i]["publisher"], rows[i]["pub_seq"] = None, None
    return rows


def deliver_to_stranger(rows: Rows, choice: int) -> Rows | None:
    """A delivery to a client that never subscribed (a publisher)."""
    i = _pick(_deliveries(rows), choice)
    publishers = sorted({r["client"] for r in rows if r["kind"] == Kind.PUBLISH_INVOKE})
    if i is None or not publishers:
        return None
    stranger = publishers[choice % len(publishers)]
    return _sorted([*rows, {**rows[i], "client": stranger, "t_mono_us": _between(rows, i), "packet_id": 4242
                            if rows[i].get("qos") else None, "dup": False}])


def unsubscribe(rows: Rows, choice: int) -> Rows | None:
    """A subscriber's subscription ends (unsubscribe_ack) while the broker goes on delivering."""
    subs = [i for i, r in enumerate(rows) if r["kind"] == Kind.SUBSCRIBE_ACK]
    i = _pick(subs, choice)
    if i is None:
        return None
    later = [j for j in range(i + 1, len(rows)) if rows[j].get("client") == rows[i]["client"]]
    if not later:
        return None
    at = later[(choice // 5) % len(later)]
    return _sorted([*rows, {**rows[i], "kind": Kind.UNSUBSCRIBE_ACK, "t_mono_us": _between(rows, at), "detail": None}])


def fault_unproven(rows: Rows, choice: int) -> Rows | None:
    evidence = [i for i, r in enumerate(rows) if r["kind"] == Kind.FAULT_EVIDENCE]
    i = _pick(evidence, choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    how = choice % 3
    if how == 0:
        rows[i]["bit"] = False
    elif how == 1:
        del rows[i]
    else:
        rows[i] = {**rows[i], "kind": Kind.FAULT_ERROR, "bit": None,
                   "detail": json.dumps({"stage": "apply", "reason": "could not apply"})}
    return rows


def node_exits(rows: Rows, choice: int) -> Rows | None:
    i = choice % len(rows)
    return _sorted([*rows, {"kind": Kind.NODE_EVENT, "t_mono_us": _between(rows, i), "node": "broker-1",
                            "detail": json.dumps({"action": "exited", "exit_status": -9, "planned": False})}])


def drain_times_out(rows: Rows, choice: int) -> Rows | None:
    rows = copy.deepcopy(rows)
    for i, r in enumerate(rows):
        if r["kind"] == Kind.PHASE and json.loads(r.get("detail") or "{}").get("phase") == Phase.DRAIN_END:
            if choice % 2:
                del rows[i]
            else:
                r["detail"] = json.dumps({"phase": Phase.DRAIN_END, "reason": "timeout", "outstanding": 1})
            return rows
    return None


def fail_publish(rows: Rows, choice: int) -> Rows | None:
    """A publish acknowledged (and delivered) recorded as failed, or as indeterminate."""
    acks = [i for i, r in enumerate(rows) if r["kind"] == Kind.PUBLISH_ACK]
    i = _pick(acks, choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    failed = choice % 2 == 0
    rows[i] = {**rows[i], "kind": Kind.PUBLISH_FAIL if failed else Kind.PUBLISH_INDETERMINATE,
               "reason_code": 0x87 if failed else None, "detail": json.dumps({"reason": "perturbed"})}
    return rows


def lose_ack(rows: Rows, choice: int) -> Rows | None:
    acks = [i for i, r in enumerate(rows) if r["kind"] == Kind.DELIVERY_ACK_SENT]
    i = _pick(acks, choice)
    if i is None:
        return None
    return rows[:i] + rows[i + 1:]


def drop_backlog(rows: Rows, choice: int) -> Rows | None:
    """Every delivery of a client between one of its reconnects and its next disconnect is gone."""
    connects = [i for i, r in enumerate(rows) if r["kind"] == Kind.CONNECT and r.get("session_present") is True]
    i = _pick(connects, choice)
    if i is None:
        return None
    client = rows[i]["client"]
    end = next((j for j in range(i + 1, len(rows)) if rows[j].get("client") == client
                and rows[j]["kind"] == Kind.DISCONNECT), len(rows))
    gone = {j for j in range(i, end) if rows[j].get("client") == client and rows[j]["kind"] in (
        Kind.DELIVERY, Kind.DELIVERY_ACK_SENT, Kind.QOS2_RECEIVED, Kind.PUBREL_RECEIVED)}
    if not gone:
        return None
    ordered = sorted(gone)
    if (choice // 11) % 2:  # sometimes only the oldest half of it
        ordered = ordered[:max(1, len(ordered) // 2)]
    drop = set(ordered)
    return [r for j, r in enumerate(rows) if j not in drop]


def delay_publish_ack(rows: Rows, choice: int) -> Rows | None:
    """A publish acknowledged much later than it was delivered (its arrival moves in every queue's order)."""
    acks = [i for i, r in enumerate(rows) if r["kind"] == Kind.PUBLISH_ACK]
    i = _pick(acks, choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["t_mono_us"] += (5_000, 300_000, 3_000_000)[choice % 3] + 3
    return _sorted(rows)


def change_qos(rows: Rows, choice: int) -> Rows | None:
    """A delivery at another QoS than the broker owed (its flow rows left as they were)."""
    i = _pick(_deliveries(rows), choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    old = rows[i].get("qos") or 0
    rows[i]["qos"] = (old + 1 + choice % 2) % 3
    if rows[i]["qos"] > 0 and rows[i].get("packet_id") is None:
        rows[i]["packet_id"] = 4000 + choice % 100
    return rows


def oversize_packet(rows: Rows, choice: int) -> Rows | None:
    """A PUBLISH far larger than any a plan sends (beyond a client's Maximum Packet Size, where it declared one)."""
    i = _pick([i for i in _deliveries(rows) if rows[i].get("packet_size") is not None], choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["packet_size"] = 4000 + choice % 1000
    return rows


def change_sub_ids(rows: Rows, choice: int) -> Rows | None:
    """A delivery carrying other Subscription Identifiers (another one, none, or one more)."""
    i = _pick(_deliveries(rows), choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["sub_ids"] = ("77", None, f"{rows[i].get('sub_ids') or '5'},88")[choice % 3]
    return rows


def set_retain(rows: Rows, choice: int) -> Rows | None:
    """A live forward with RETAIN 1 (no message is published retained)."""
    i = _pick(_deliveries(rows), choice)
    if i is None:
        return None
    rows = copy.deepcopy(rows)
    rows[i]["retain"] = True
    return rows


PERTURBATIONS: dict[str, Callable[[Rows, int], Rows | None]] = {
    "drop_delivery": drop_delivery, "swap_messages": swap_messages, "resend_before_ack": resend_before_ack,
    "deliver_again": deliver_again, "redeliver_after_reconnect": redeliver_after_reconnect, "flip_dup": flip_dup,
    "reuse_packet_id": reuse_packet_id, "invalid_packet_id": invalid_packet_id, "lose_session": lose_session,
    "present_session": present_session, "deliver_late": deliver_late, "keep_remaining_expiry": keep_remaining_expiry,
    "phantom": phantom, "deliver_to_stranger": deliver_to_stranger, "unsubscribe": unsubscribe,
    "fault_unproven": fault_unproven, "node_exits": node_exits, "drain_times_out": drain_times_out,
    "fail_publish": fail_publish, "lose_ack": lose_ack, "drop_backlog": drop_backlog,
    "delay_publish_ack": delay_publish_ack, "change_qos": change_qos, "oversize_packet": oversize_packet,
    "change_sub_ids": change_sub_ids, "set_retain": set_retain,
}
RUN_PERTURBATIONS = ("manifest_incomplete",)
