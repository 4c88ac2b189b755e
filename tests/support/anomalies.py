"""The anomaly catalog: synthetic histories, each with one anomaly planted alone (and its near-miss twins,
which must pass), named with the invariants a check must fail on them.  Shared by
tests/checkers/test_checkers_anomalies.py (every case in one classic Spark batch) and
tests/checkers/test_spark_connect.py (Connect and classic agree on every case).

``CASES``: name -> (spec, mutation or None, failing invariant ids expected).
``UNKNOWN_CASES``: name -> (spec, mutation or None, keyword arguments of ``synthetic.write_run``, invariant ids
that must be unknown)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from contracts.history_schema import Kind, Phase
from spark_checkers import synthetic as s

BASE = s.Spec(pairs=2, messages=12, offline=(s.Offline(0, 5, 8),),
              faults=(s.Fault("f1", "kill", "redis-7003", 4, 6),))
WRAP = replace(BASE, first_packet_id=65530)
V5 = replace(BASE, protocol=5, expiry_s=2)
V5_LONG = replace(BASE, protocol=5, expiry_s=60, messages=45, offline=(s.Offline(0, 5, 40),))
V5_SHORT = replace(BASE, protocol=5, expiry_s=1, messages=30, offline=(s.Offline(0, 5, 25),))
# Message expiry 0 (MQTT 5 §3.3.2.3.3: a lifetime of 0 s): the correct broker drops every one of them.
V5_ZERO = replace(BASE, protocol=5, expiry_s=0)
LIMIT = replace(BASE, limit=3, offline=(s.Offline(0, 5, 11),))
QOS2 = replace(BASE, qos=2)
EXTERNAL = replace(BASE, target_kind="external")
# A black box that declares a queue of 3 dropping the newest (Mosquitto's max_queued_messages).
DROP_NEWEST = replace(LIMIT, target_kind="external", queue_policy="drop_newest")
# A black box that promises only a graceful stop: its kill (at slot 6, sub-0 offline over slots 5..11) may lose.
KILLED = replace(EXTERNAL, offline=(s.Offline(0, 5, 11),), faults=(s.Fault("f1", "process_kill", "broker", 6, 8),),
                 persistence="graceful")


def _heal_evidence(rows, fault_id, bit):
    """A second fault_evidence row (stage heal) at the fault's heal."""
    heal = next(r for r in rows if r["kind"] == Kind.FAULT_HEAL and r["fault_id"] == fault_id)
    row = {**heal, "kind": Kind.FAULT_EVIDENCE, "t_mono_us": heal["t_mono_us"] + 5, "bit": bit,
           "detail": '{"stage": "heal", "checks": []}'}
    return s.sort_rows([*rows, row])


def _error_stage(rows, stage, reason):
    """The fault_error row says at which stage the fault broke, and why (as the nemesis writes it)."""
    import json

    return [{**r, "detail": json.dumps({"stage": stage, "reason": reason, "error_type": "NodeError"})}
            if r["kind"] == Kind.FAULT_ERROR else r for r in rows]


def _session_gone_after_kill(rows):
    """sub-0 (away over the kill) comes back to session present = 0 and an empty queue, and resubscribes."""
    return s.lose_session(_drop_seqs(rows, "sub-0", "pub-0", range(5, 11)), "sub-0", 1)


def _deliver_expiry_zero(rows, offset_us):
    """sub-1 gets pub-1 #12 (expiry 0) ``offset_us`` after its publish, remaining expiry 0, and acks it."""
    invoke = s.publish_row(rows, Kind.PUBLISH_INVOKE, "pub-1", 12)
    t = invoke["t_mono_us"] + offset_us
    common = {"client": "sub-1", "node": "broker-1", "protocol": 5, "qos": 1, "packet_id": 65535}
    delivery = {**common, "t_mono_us": t, "kind": Kind.DELIVERY, "topic": invoke["topic"], "dup": False,
                "retain": False, "payload_size": 62, "remaining_expiry_s": 0, "publisher": "pub-1", "pub_seq": 12,
                "send_wall_us": invoke["send_wall_us"], "body_hash": invoke["body_hash"]}
    return s.sort_rows([*rows, delivery, {**common, "t_mono_us": t + 300, "kind": Kind.DELIVERY_ACK_SENT}])


def _swap_with_qos(rows, qos_of):
    """sub-1 sees pub-1 #5 before #4 (swapped), with these messages published and delivered at these QoS (its
    subscription granted the highest of them: each goes out as published)."""
    rows = s.set_subscription(s.swap_deliveries(rows, "sub-1", "pub-1", 4, 5), "sub-1", 0, qos=max(qos_of.values()))
    for seq, qos in qos_of.items():
        for row in rows:
            if row.get("publisher") == "pub-1" and row.get("pub_seq") == seq and row["kind"] in (
                    Kind.PUBLISH_INVOKE, Kind.PUBLISH_ACK, Kind.DELIVERY, Kind.DELIVERY_ACK_SENT):
                row["qos"] = qos
    return rows


def _drop_seqs(rows, client, publisher, seqs):
    for seq in seqs:
        rows = s.drop_delivery(rows, client, publisher, seq)
    return rows


def _delivery(rows, client, publisher, seq):
    return s.find_delivery(rows, client, publisher, seq)


def _expiry_move(rows, offset_us):
    last = _delivery(rows, "sub-1", "pub-1", 12)
    invoke = s.publish_row(rows, "publish_invoke", "pub-1", 12)
    moved = s.move_delivery(rows, "sub-1", "pub-1", 12, invoke["t_mono_us"] + 2_000_000 + offset_us)
    return s.set_delivery_field(moved, "sub-1", "pub-1", 12, remaining_expiry_s=0) if last else moved


def _add_copy(rows, client, source_publisher, seq, t_slot, **fields):
    """A copy of one of ``client``'s deliveries, delivered again at slot ``t_slot`` with ``fields`` changed; it
    takes the next id of the subscriber's stored sequence (a message the broker stored and sent)."""
    template = _delivery(rows, client, source_publisher, seq)
    return s.add_delivery_in_sequence(rows, template, s.slot_time(BASE, t_slot) + 50_000, **fields)


def _foreign(rows):
    template = _delivery(rows, "sub-0", "pub-0", 3)
    return s.add_delivery_in_sequence(rows, template, s.slot_time(BASE, 3) + 50_000, client="sub-1")


EXPIRING = replace(BASE, protocol=5, messages=20, offline=(s.Offline(0, 5, 19),))


def _session_gone(rows, session_expiry_s):
    """sub-0 (offline 1.4 s) comes back to session present = 0 and an empty queue, and resubscribes."""
    rows = s.set_connect(rows, "sub-0", 0, session_expiry_s=session_expiry_s)
    for seq in range(5, 19):
        rows = s.drop_delivery(rows, "sub-0", "pub-0", seq)
    return s.lose_session(rows, "sub-0", 1)  # (last: the new session's ids start at 1 with what it got)


def _reconnect_to_empty_queue(rows, *, clean_start):
    """sub-0 comes back (v3.1.1) to session present = 0 with its backlog (pub-0 #5..#7) gone, and resubscribes."""
    rows = s.set_connect(rows, "sub-0", 1, clean_start=clean_start)
    for seq in range(5, 8):
        rows = s.drop_delivery(rows, "sub-0", "pub-0", seq)
    return s.lose_session(rows, "sub-0", 1)


def _resent_after_reconnect(rows):
    """#4 was sent while sub-0 was online but first seen after its reconnect (1.675 s), resent with DUP = 1."""
    rows = s.move_delivery(rows, "sub-0", "pub-0", 4, s.slot_time(BASE, 8) - BASE.interval_us // 4 + 1000)
    return s.set_delivery_field(rows, "sub-0", "pub-0", 4, dup=True)


def _inflight_before_offline(rows):
    """sub-0 never acks pub-0 #4 (delivered before its disconnect): #4 joins the backlog #4..#10 (limit 3), and
    as the oldest (lowest ZSET score) it is trimmed first; the broker keeps #8..#10."""
    return s.drop_ack(rows, "sub-0", "pub-0", 4)


def _inflight_kept_newest_trimmed(rows):
    """As above, but the broker resends the old in-flight #4 after the reconnect (DUP = 1, its packet id) and
    trims the newest #10 instead."""
    rows = _inflight_before_offline(rows)
    first = _delivery(rows, "sub-0", "pub-0", 4)
    rows = s.add_delivery(rows, first, _delivery(rows, "sub-0", "pub-0", 8)["t_mono_us"] - 30, dup=True)
    return s.drop_delivery(rows, "sub-0", "pub-0", 10)


TWO_WINDOWS = replace(LIMIT, messages=20, offline=(s.Offline(0, 5, 11), s.Offline(0, 12, 18)))


def _unsent_between_windows(rows, *seqs):
    """sub-0 gets none of pub-0 ``seqs`` in its 100 ms online between the two offline windows."""
    for seq in seqs:
        rows = s.drop_delivery(rows, "sub-0", "pub-0", seq)
    return rows


def _unsent_then_gone(rows, *seqs):
    """As above, and sub-0 never comes back from its second offline window."""
    rows = _unsent_between_windows(rows, *seqs)
    back = max(r["t_mono_us"] for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0")
    gone = (Kind.CONNECT, Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)
    return [r for r in rows if not (r.get("client") == "sub-0" and r["kind"] in gone and r["t_mono_us"] >= back)]


# A drop-oldest queue trims on every save, the subscriber online or not (docs/findings.md, p2p-limit-trim seeds
# 4 and 5): sub-0 stays online, limit 3; pub-0 #3 and #4 never arrive, #5.. are held back by a slow pipeline.
ONLINE = replace(LIMIT, offline=(), faults=(), messages=10)


def _held_back(rows, *seqs):
    """pub-0 #3 and #4 are never delivered; ``seqs`` arrive in one batch 10 ms after the last one's publish ack
    (their ids stay: #3 and #4 were stored, then trimmed)."""
    rows = _drop_seqs(rows, "sub-0", "pub-0", (3, 4))
    ack = s.publish_row(rows, Kind.PUBLISH_ACK, "pub-0", seqs[-1])
    return s.deliver_in_batch(rows, "sub-0", "pub-0", seqs, ack["t_mono_us"] + 10_000)


# sub-0 offline over slots 5..11, then again over 12..13 (one message, #12, arrives in the second window).
SHORT_SECOND = replace(LIMIT, messages=16, faults=(), offline=(s.Offline(0, 5, 11), s.Offline(0, 12, 13)))


def _carried_held_back(rows, *late):
    """Of the first backlog (#5..#10, limit 3: #8..#10 kept) only #8 arrives after the reconnect; #9 never; ``late``
    (of #10 and the live #11) come only after the second reconnect, before #12: at that save the queue held #9..#12
    and the oldest, #9, went."""
    rows = s.drop_delivery(rows, "sub-0", "pub-0", 9)
    back = max(r["t_mono_us"] for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0")
    return s.deliver_in_batch(rows, "sub-0", "pub-0", late, back + 1000)


# sub-0 offline over slots 5..14 (backlog #5..#13, limit 3); #11..#13 were acknowledged within the pipeline slack
# (300 ms) before the reconnect: they may arrive live, beside the kept newest settled ones.
PIPELINE = replace(LIMIT, faults=(), messages=16, offline=(s.Offline(0, 5, 14),), trim_mode="none",
                   pipeline_slack_ms=300)


V5_PLAIN = replace(BASE, protocol=5)
# No fault near the planted duplicates and skips (BASE's fault f1 is over by slot 7): nothing excuses them.
NO_FAULT = replace(BASE, faults=())
ALLOW_REDELIVERY = replace(NO_FAULT, allowed=("duplicates.redelivered_after_ack",))
NEAR_WRAP = replace(BASE, first_packet_id=65526)  # sub-1's #10 takes 65535, #11 takes 1


def _resent_on_reconnect(rows):
    """sub-0 never acked pub-0 #4 before going offline; the broker resends it (its id, DUP = 1) on the new
    connection right after the reconnect, where it is acked: the one resend MQTT 5 allows."""
    rows = s.drop_ack(rows, "sub-0", "pub-0", 4)
    first = _delivery(rows, "sub-0", "pub-0", 4)
    reconnect = max(r["t_mono_us"] for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0")
    return s.add_delivery(rows, first, reconnect + 1000, dup=True)


def _ids_outlive_the_session(rows):
    """As clean_start_discards_backlog_v5, but the new session's ids go on from the old session's counter."""
    rows = _session_gone(s.set_connect(rows, "sub-0", 1, clean_start=True), 3600)
    reconnect = max(r["t_mono_us"] for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0")
    last_old = [d["packet_id"] for d in s.deliveries(rows, "sub-0") if d["t_mono_us"] < reconnect][-1]
    return s.renumber(rows, "sub-0", reconnect, s.next_packet_id(last_old))


def _clean_session_live_ids(rows):
    """sub-0 comes back with a clean session (3.1.1 clean session = 1): its ids are per connection and never
    stored; the stored counter (4, its persistent session's last id) is lower than the live ids it got."""
    rows = _reconnect_to_empty_queue(rows, clean_start=True)
    assert max(d["packet_id"] for d in s.deliveries(rows, "sub-0")[-3:]) > 4
    return s.set_snapshot(rows, "sub-0", last_packet_id=4)


def _discarded_backlog_delivered(rows, *, clean_start=True, session_expiry_s=None, drop=()):
    """sub-0 comes back to a new session (session present 0; clean start, or its MQTT 5 session expired
    offline) and resubscribes, yet its old backlog (pub-0 #5.., queued while it was away) is still delivered:
    the old session's queue outlived it.  ``drop``: backlog messages that do not arrive."""
    if session_expiry_s is not None:
        rows = s.set_connect(rows, "sub-0", 0, session_expiry_s=session_expiry_s)
    rows = _drop_seqs(s.set_connect(rows, "sub-0", 1, clean_start=clean_start), "sub-0", "pub-0", drop)
    return s.lose_session(rows, "sub-0", 1)


# sub-0 goes persistent -> clean -> persistent: offline over slots 5..11, a 3.1.1 clean session (clean session
# = 1) online over slot 11 (it gets nothing), offline over 12..18, then a persistent session (clean session = 0).
THROUGH_CLEAN = replace(NO_FAULT, messages=20, offline=(s.Offline(0, 5, 11), s.Offline(0, 12, 18)))


def _through_clean_session(rows, *, old_backlog_arrives):
    """As THROUGH_CLEAN says; the clean session and the second window's messages reach no one.  With
    ``old_backlog_arrives`` the first session's backlog (pub-0 #5..#10) reaches the third session right after
    its connect (the defect: a discarded session's state delivered to the next clean-start-0 session)."""
    rows = s.set_connect(s.set_connect(rows, "sub-0", 1, clean_start=True), "sub-0", 2, clean_start=False)
    rows = _drop_seqs(rows, "sub-0", "pub-0", range(11, 18))
    connects = [r for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0"]
    sub = next(r for r in rows if r["kind"] == Kind.SUBSCRIBE_ACK and r.get("client") == "sub-0")
    for c in connects[1:]:
        c["session_present"] = False
        rows.append({**sub, "t_mono_us": c["t_mono_us"] + 1})  # each new session subscribes again
    t_new = connects[2]["t_mono_us"]
    for seq in range(5, 11):
        rows = (s.move_delivery(rows, "sub-0", "pub-0", seq, t_new + 2000 + (seq - 5) * 50) if old_backlog_arrives
                else s.drop_delivery(rows, "sub-0", "pub-0", seq))
    return s.renumber(s.sort_rows(rows), "sub-0", t_new, 1)  # a new persistent session's ids start at 1


# name -> (spec, mutation or None, failing invariants expected)
CASES = {
    "clean": (BASE, None, set()),
    "clean_wrap": (WRAP, None, set()),
    "clean_watcher": (replace(BASE, watcher=True, first_packet_id=65000), None, set()),
    "clean_external": (EXTERNAL, None, set()),
    "lost_middle": (BASE, lambda r: s.drop_delivery(r, "sub-1", "pub-1", 6), {"durability.lost"}),
    "lost_backlog": (BASE, lambda r: s.drop_delivery(r, "sub-0", "pub-0", 6), {"durability.lost"}),
    "lost_suffix": (BASE, lambda r: s.drop_delivery(r, "sub-1", "pub-1", 12), {"durability.lost"}),
    "indeterminate_unseen": (replace(BASE, indeterminate=((1, 6),)),
                             lambda r: s.drop_delivery(r, "sub-1", "pub-1", 6), set()),
    "indeterminate_seen_lost_elsewhere": (replace(BASE, indeterminate=((1, 6),), watcher=True),
                                          lambda r: s.drop_delivery(r, "sub-1", "pub-1", 6), {"durability.lost"}),
    "session_lost": (BASE, lambda r: s.lose_session(r, "sub-0", 1), {"durability.session_lost"}),
    "session_expired_legally": (EXPIRING, lambda r: _session_gone(r, 1), set()),
    "session_lost_with_its_queue": (EXPIRING, lambda r: _session_gone(r, 3600),
                                    {"durability.session_lost", "durability.lost"}),
    "phantom_never_published": (BASE, lambda r: _add_copy(r, "sub-1", "pub-1", 3, 3, publisher="pub-9", pub_seq=1), {"durability.phantom"}),
    "phantom_body_hash": (BASE, lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 4, body_hash="deadbeef00000000"),
                          {"durability.phantom"}),
    "unsubscribed": (BASE, _foreign, {"durability.unsubscribed_delivery"}),
    "delivered_after_fail": (BASE, lambda r: s.fail_publish(r, "pub-1", 4),
                             {"durability.delivered_after_failed_publish"}),
    "out_of_order": (BASE, lambda r: s.swap_deliveries(r, "sub-1", "pub-1", 4, 5), {"order.out_of_order"}),
    "out_of_order_wrap": (WRAP, lambda r: s.swap_deliveries(r, "sub-1", "pub-1", 6, 7), {"order.out_of_order"}),
    # Order holds per topic *and QoS* ([MQTT-4.6.0-6]): #4 at QoS 2 seen after #5 at QoS 1 is legal (near miss,
    # session-mix on the correct broker); both at QoS 2, the same inversion is not (planted twin).
    "out_of_order_across_qos": (BASE, lambda r: _swap_with_qos(r, {4: 2}), set()),
    "out_of_order_within_qos2": (BASE, lambda r: _swap_with_qos(r, {4: 2, 5: 2}), {"order.out_of_order"}),
    "packet_id_zero": (BASE, lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 4, packet_id=0),
                       {"order.packet_id_invalid"}),
    "packet_id_reused": (BASE, lambda r: s.reuse_packet_id(r, "sub-1", "pub-1", 4, 5), {"order.packet_id_reused"}),
    "dup_on_first": (BASE, lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 4, dup=True), {"order.dup_flag"}),
    "dup_on_first_after_reconnect": (BASE, lambda r: _resent_after_reconnect(r), set()),
    # sub-0 went away (client side) just before pub-0 #5 and reconnected after it: the broker may not have seen
    # the disconnect (a partition), sent #5 on the lost connection and resent it with DUP = 1 on the new one.
    "dup_on_first_after_unseen_disconnect": (BASE, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 5, dup=True),
                                             set()),
    # pub-0 #9 was invoked after sub-0's current connection was established: it was never sent before.
    "dup_on_first_on_connection_older_than_publish": (
        BASE, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 9, dup=True), {"order.dup_flag"}),
    "legal_resend_with_dup": (BASE, lambda r: s.resend_before_ack(r, "sub-1", "pub-1", 4, dup=True), set()),
    # MQTT 5 [MQTT-4.4.0-1]: a resend within the connection is forbidden (3.1.1, above, is not judged) ...
    "resend_within_connection_v5": (V5_PLAIN, lambda r: s.resend_before_ack(r, "sub-1", "pub-1", 4, dup=True),
                                    {"order.resend_within_connection"}),
    # ... the resend on the next connection, after a reconnect, is the one it allows.
    "resend_after_reconnect_v5": (V5_PLAIN, _resent_on_reconnect, set()),
    "resend_without_dup": (BASE, lambda r: s.resend_before_ack(r, "sub-1", "pub-1", 4, dup=False), {"order.dup_flag"}),
    "delivered_expired": (V5, lambda r: _expiry_move(r, 200_000 + 1_000), {"expiry.delivered_expired"}),
    "delivered_within_tolerance": (V5, lambda r: _expiry_move(r, 200_000 - 1_000), set()),
    "remaining_not_reduced": (V5_LONG, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 5, remaining_expiry_s=60),
                              {"expiry.remaining_not_reduced"}),
    "remaining_short_wait": (V5_LONG, lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 5, remaining_expiry_s=60),
                             set()),
    "dropped_early": (replace(V5_LONG, offline=(s.Offline(0, 5, 9),)),
                      lambda r: s.drop_delivery(r, "sub-0", "pub-0", 6), {"expiry.dropped_early"}),
    "expired_while_offline": (V5_SHORT, None, set()),
    # Expiry 0 needs no rule of its own: never owed (dropping all is right), and delivered it must be at once,
    # within the clock tolerance of the publish (near miss), not later (planted twin).
    "expiry_zero_all_dropped": (V5_ZERO, None, set()),
    "expiry_zero_delivered_at_once": (V5_ZERO, lambda r: _deliver_expiry_zero(r, 200_000 - 1_000), set()),
    "expiry_zero_delivered_late": (V5_ZERO, lambda r: _deliver_expiry_zero(r, 200_000 + 1_000),
                                   {"expiry.delivered_expired"}),
    # pub-0 #7 is acknowledged just before sub-0's reconnect, within the pipeline slack (2 s): it may reach the
    # queue only after the backlog is read.  With a 1 s expiry it may expire on the way (legal); with 5 s it
    # still had time after any pipeline delay the slack allows (dropped early).
    "expired_in_pipeline_after_reconnect": (replace(V5, expiry_s=1, pipeline_slack_ms=2000),
                                            lambda r: s.drop_delivery(r, "sub-0", "pub-0", 7), set()),
    "dropped_early_in_pipeline_after_reconnect": (replace(V5, expiry_s=5, pipeline_slack_ms=2000),
                                                  lambda r: s.drop_delivery(r, "sub-0", "pub-0", 7),
                                                  {"expiry.dropped_early"}),
    "trimmed_at_limit": (LIMIT, None, set()),
    # --- declared queue policies (external targets) ---
    "drop_newest_keeps_oldest": (replace(DROP_NEWEST, trim_mode="newest"), None, set()),
    "drop_newest_but_dropped_oldest": (DROP_NEWEST, None, {"limits.trim_not_newest"}),
    "drop_newest_dropped_one_extra": (replace(DROP_NEWEST, trim_mode="newest_one_extra"), None,
                                      {"limits.trimmed_under_limit"}),
    "drop_newest_over_limit": (replace(DROP_NEWEST, trim_mode="none"), None, {"limits.over_limit"}),
    # No limit declared: keeping every message is right, and a trim is a plain loss (no limit excuses it).
    "no_limit_keeps_all": (replace(DROP_NEWEST, queue_policy="none", trim_mode="none"), None, set()),
    "no_limit_but_trimmed": (replace(DROP_NEWEST, queue_policy="none", trim_mode="newest"), None,
                             {"durability.lost"}),
    # reject: once accepted nothing may be dropped; a trim is a loss.
    "reject_but_trimmed": (replace(DROP_NEWEST, queue_policy="reject", trim_mode="newest"), None,
                           {"durability.lost"}),
    # --- declared persistence: a loss to a kill the target never promised to survive is allowed ---
    "kill_loss_not_promised": (KILLED, lambda r: _drop_seqs(r, "sub-0", "pub-0", range(5, 7)), set()),
    "kill_loss_promised": (replace(KILLED, persistence="kill"), lambda r: _drop_seqs(r, "sub-0", "pub-0", range(5, 7)),
                           {"durability.lost"}),
    # queued while sub-0 was away across the kill (acked after it): the kill took the session, still allowed
    "kill_loses_backlog_queued_after_it": (KILLED, lambda r: _drop_seqs(r, "sub-0", "pub-0", range(7, 11)), set()),
    # published after sub-0 came back (slot 12, live): the kill cannot explain it, whatever the declaration
    "loss_after_the_kill": (KILLED, lambda r: _drop_seqs(r, "sub-0", "pub-0", (12,)), {"durability.lost"}),
    # the session itself lost across the kill: allowed under "graceful", a violation under "kill"
    "session_lost_to_kill_not_promised": (KILLED, lambda r: _session_gone_after_kill(r), set()),
    "session_lost_to_kill_promised": (replace(KILLED, persistence="kill"), lambda r: _session_gone_after_kill(r),
                                      {"durability.session_lost", "durability.lost"}),
    "over_limit_black_box": (replace(LIMIT, trim_mode="none"), None, {"limits.over_limit"}),
    "over_limit_white_box": (LIMIT, lambda r: s.set_snapshot(r, "sub-0", zset_size=4), {"limits.over_limit"}),
    "trimmed_under_limit": (replace(LIMIT, trim_mode="one_extra"), None, {"limits.trimmed_under_limit"}),
    "trim_not_oldest": (replace(LIMIT, trim_mode="newest"), None, {"limits.trim_not_oldest"}),
    # A backlog of 10 (#5..#14, limit 3) of which the broker keeps the oldest 3: #12..#14 are on the wrong side of
    # the policy (a correct queue keeps them); #8..#11 a correct queue trims as well.
    "trim_not_oldest_long_backlog": (replace(LIMIT, trim_mode="newest", messages=16, offline=(s.Offline(0, 5, 15),)),
                                     None, {"limits.trim_not_oldest"}),
    "redelivered_after_ack": (BASE, lambda r: _add_copy(r, "sub-1", "pub-1", 4, 6),
                              {"duplicates.redelivered_after_ack"}),
    "allowed_redelivery": (replace(BASE, allowed=("duplicates.redelivered_after_ack",)),
                           lambda r: _add_copy(r, "sub-1", "pub-1", 4, 6), set()),
    # A backlog message sent twice within the connection after the reconnect (a new id for the second copy, no
    # fault around): a violation even where redelivery after an ack is allowed ...
    "backlog_twice_in_connection": (ALLOW_REDELIVERY, lambda r: _add_copy(r, "sub-0", "pub-0", 6, 9),
                                    {"duplicates.backlog_twice_in_connection"}),
    # ... the same on an always-online subscriber, where redelivery after an ack is not allowed: both rules.
    "live_twice_in_connection": (BASE, lambda r: _add_copy(r, "sub-1", "pub-1", 8, 10),
                                 {"duplicates.backlog_twice_in_connection", "duplicates.redelivered_after_ack"}),
    # ... while a message acked before the disconnect and sent again after the reconnect is only that.
    "redelivered_after_reconnect": (ALLOW_REDELIVERY, lambda r: _add_copy(r, "sub-0", "pub-0", 3, 9), set()),
    # (allowed_redelivery below: twice within one connection, but the message's life crossed fault f1.)
    "qos2_duplicate": (QOS2, lambda r: _add_copy(r, "sub-1", "pub-1", 4, 6), {"duplicates.qos2"}),
    "orphan_payloads": (BASE, lambda r: s.set_snapshot(r, "sub-1", orphan_payloads=2), {"whitebox.orphan_payloads"}),
    "dangling_refs": (BASE, lambda r: s.set_snapshot(r, "sub-1", dangling_refs=1), {"whitebox.dangling_refs"}),
    "last_packet_id_behind": (BASE, lambda r: s.set_snapshot(r, "sub-1", last_packet_id=5),
                              {"whitebox.last_packet_id_behind"}),
    # Only stored ids count: a clean session's live ids above the stored counter are no sign of it lagging.
    "last_packet_id_clean_session_live_ids": (BASE, _clean_session_live_ids, set()),
    # --- white box: a persistent session's stored ids go 1..65535, then 1, without a skip ---
    "packet_id_skips_65535": (NEAR_WRAP, lambda r: s.skip_packet_ids(r, "sub-1", 65535), {"whitebox.packet_id_sequence"}),
    "packet_id_skips_one": (NO_FAULT, lambda r: s.skip_packet_ids(r, "sub-1", 10), {"whitebox.packet_id_sequence"}),
    # An APPLICATION client's ids are its Kafka topic's offsets, not save.lua's: offsets a failed produce took
    # leave a skip with nothing lost, not judged (the near miss); a DEVICE session beside it still is.
    "packet_id_skips_one_beside_application": (replace(NO_FAULT, application_clients=("sub-0",)), lambda r:
                                               s.skip_packet_ids(r, "sub-1", 10), {"whitebox.packet_id_sequence"}),
    "packet_id_skips_one_application": (replace(NO_FAULT, application_clients=("sub-?",)),
                                        lambda r: s.skip_packet_ids(r, "sub-1", 10), set()),
    "packet_id_wraps_in_order": (NEAR_WRAP, None, set()),
    # The harness's preset (wrap-backlog's preset_each_offline) starts a new run of ids: the jump to the preset
    # is no skip, but a skip of 65535 after it still is (a preset once hid it behind a lap counted backwards).
    "packet_ids_preset_then_wrap": (NO_FAULT, lambda r: s.preset_packet_ids(r, "sub-1", 5, 65533), set()),
    "packet_id_skips_65535_after_preset": (NO_FAULT, lambda r: s.skip_packet_ids(
        s.preset_packet_ids(r, "sub-1", 5, 65533), "sub-1", 65535), {"whitebox.packet_id_sequence"}),
    # sub-0's backlog #5..#10 (limit 3) loses #5..#7 to the trim: stored first, they took ids 5..7, so #8 gets 8.
    "packet_ids_taken_by_trimmed": (replace(LIMIT, faults=()), lambda r: s.skip_packet_ids(r, "sub-0", 5, 3), set()),
    "packet_ids_skipped_beyond_trimmed": (replace(LIMIT, faults=()), lambda r: s.skip_packet_ids(r, "sub-0", 5, 4),
                                          {"whitebox.packet_id_sequence"}),
    # A new session starts at 1 (clean_start_discards_backlog_v5 below); ids that go on from the old one do not.
    "packet_ids_outlive_the_session": (EXPIRING, _ids_outlive_the_session, {"whitebox.packet_id_sequence"}),
    # Clean start (3.1.1 clean session = 1 / MQTT 5 clean start = 1) legally discards the old session's queue.
    # DUP 1 on a QoS 0 delivery ([MQTT-3.3.1-2]); a QoS 0 run's clean twin is "clean_qos0".
    "dup_on_qos0": (replace(BASE, qos=0, offline=()), lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 4, dup=True),
                    {"order.dup_flag"}),
    "clean_qos0": (replace(BASE, qos=0, offline=()), None, set()),
    "clean_start_discards_backlog": (BASE, lambda r: _reconnect_to_empty_queue(r, clean_start=True), set()),
    # The same clean start answered session present 1 ([MQTT-3.2.2-2]); its near miss is the case above.
    "clean_start_answered_session_present": (BASE, lambda r: s.set_connect(
        _reconnect_to_empty_queue(r, clean_start=True), "sub-0", 1, session_present=True),
        {"durability.clean_start_session_present"}),
    "non_clean_reconnect_loses_backlog": (BASE, lambda r: _reconnect_to_empty_queue(r, clean_start=False),
                                          {"durability.session_lost", "durability.lost"}),
    "clean_start_discards_backlog_v5": (EXPIRING, lambda r: _session_gone(
        s.set_connect(r, "sub-0", 1, clean_start=True), 3600), set()),
    # A discarded session's queue reaching the next session ([MQTT-3.1.2-4]): pub-0 #5 was acknowledged 273 ms
    # before sub-0's clean start, more than the pipeline slack + clock tolerance (20 + 200 ms): routed to the old
    # session, never owed to the new one.  #6 and #7 (173 and 73 ms before) may have been routed after the new
    # subscription: the near miss delivers only them.
    "discarded_backlog_after_clean_start": (NO_FAULT, _discarded_backlog_delivered,
                                            {"durability.discarded_session_delivery"}),
    "pipeline_race_after_clean_start": (NO_FAULT, lambda r: _discarded_backlog_delivered(r, drop=(5,)), set()),
    # ... also through a clean session between: persistent -> clean -> persistent (the near miss: nothing old).
    "discarded_backlog_through_clean_session": (THROUGH_CLEAN, lambda r: _through_clean_session(
        r, old_backlog_arrives=True), {"durability.discarded_session_delivery"}),
    "clean_session_between_discards_all": (THROUGH_CLEAN, lambda r: _through_clean_session(
        r, old_backlog_arrives=False), set()),
    # A fault around the message's life may have held its pipeline up beyond the slack: not judged.
    "discarded_backlog_across_fault": (BASE, _discarded_backlog_delivered, set()),
    # MQTT 5: the session expired offline (1 s, offline 1.4 s) and the broker said session present 0, yet the
    # backlog came; the same with expiry 3600 is a lost session (session present 0 wrongly), not a discard.
    "expired_session_backlog_delivered": (replace(EXPIRING, faults=()), lambda r: _discarded_backlog_delivered(
        r, clean_start=False, session_expiry_s=1), {"durability.discarded_session_delivery"}),
    "lost_session_backlog_delivered": (replace(EXPIRING, faults=()), lambda r: _discarded_backlog_delivered(
        r, clean_start=False, session_expiry_s=3600), {"durability.session_lost"}),
    # Black-box limit: only the settled backlog (acked before reconnect - slack) counts against the limit.
    "in_pipeline_extras_arrive_live": (replace(LIMIT, trim_mode="none", pipeline_slack_ms=300), None, set()),
    "limit_plus_one_old_after_long_offline": (replace(LIMIT, trim_mode="none", pipeline_slack_ms=300,
                                                      offline=(s.Offline(0, 5, 12),)), None, {"limits.over_limit"}),
    # Black-box limit: "kept" is delivered after the reconnect; an in-flight message delivered only before the
    # disconnect and then trimmed (oldest first) was not kept.
    "inflight_before_offline_trimmed": (LIMIT, _inflight_before_offline, set()),
    "inflight_resent_newest_trimmed": (LIMIT, _inflight_kept_newest_trimmed, {"limits.trim_not_oldest"}),
    "immediate_drain_reconnect": (replace(LIMIT, trim_mode="none", pipeline_slack_ms=1000), None, set()),
    # Carried into the next backlog: pub-0 #10 (kept in the first backlog) and the live #11 were not yet sent
    # when sub-0 went offline again; the second backlog (#11..#17, limit 3) trims the oldest: both legally.
    "kept_unsent_then_trimmed_in_next_backlog": (TWO_WINDOWS, lambda r: _unsent_between_windows(r, 10, 11), set()),
    # ... but the broker did send the newer #11 in between: #10 was not waiting in the queue, it was lost.
    "kept_skipped_while_newer_sent": (TWO_WINDOWS, lambda r: _unsent_between_windows(r, 10), {"durability.lost"}),
    # Carried into a window that never closes and holds fewer than the limit (#11..#13, limit 5): nothing
    # trimmed #10, and the broker had the online period to send it: still lost.
    # Carried into the next backlog (limit 10: nothing trimmed) and never sent after that reconnect either: lost,
    # and blamed on the window it was dropped in (the second), not the one it was first queued in.
    "kept_unsent_then_lost_in_next_backlog": (replace(TWO_WINDOWS, limit=10),
                                              lambda r: _unsent_between_windows(r, 10, 11),
                                              {"durability.lost"}),
    # Order inverted across a lost session: the ids restarted with the new session, they did not wrap.
    "out_of_order_across_new_session": (BASE, lambda r: s.swap_deliveries(s.lose_session(r, "sub-0", 1), "sub-0",
                                                                          "pub-0", 4, 9),
                                        {"durability.session_lost", "order.out_of_order"}),
    "kept_unsent_then_subscriber_gone": (replace(TWO_WINDOWS, limit=5, messages=13),
                                         lambda r: _unsent_then_gone(r, 10, 11), {"durability.lost"}),
    # Trimmed while online: #5..#7 (3 = the limit, all newer than #3 and #4) were queued at once behind the slow
    # pipeline before #5 went out: the save trimmed the two oldest, legally ...
    "online_trim_after_slow_pipeline": (ONLINE, lambda r: _held_back(r, 5, 6, 7), set()),
    # ... but with only #5 and #6 queued at any moment (the batch goes out before #7 is published) nothing was
    # over the limit: #3 and #4 are lost.
    "online_gap_under_limit": (ONLINE, lambda r: _held_back(r, 5, 6), {"durability.lost"}),
    # Carried into the next window with the rest of its old backlog: #9 (kept in the first backlog, never sent)
    # was queued at the second disconnect with #10 and #11 (unsent) and #12 (arrived offline): 3 newer, the
    # limit: trimmed legally, though the second window's own arrivals (#11, #12) are fewer than the limit ...
    "carried_into_full_queue": (SHORT_SECOND, lambda r: _carried_held_back(r, 10, 11), set()),
    # ... while with #10, the rest of that backlog, sent before the second disconnect, only #11 and #12 were newer
    # and queued with #9 (2 < 3): lost.
    "carried_into_short_queue": (SHORT_SECOND, lambda r: _carried_held_back(r, 11), {"durability.lost"}),
    # The trim kept the oldest settled #5..#7 and dropped #8..#10; the newest, #11..#13, came from the pipeline
    # (p2p-limit-trim-3 with trim_newest): every dropped one is past the limit by rank, yet the wrong end was kept ...
    "kept_oldest_newest_from_pipeline": (PIPELINE, lambda r: _drop_seqs(r, "sub-0", "pub-0", (8, 9, 10)),
                                         {"limits.trim_not_oldest"}),
    # ... while keeping the newest settled #8..#10 beside the pipeline's #11..#13 is right.
    "kept_newest_settled_and_pipeline": (PIPELINE, lambda r: _drop_seqs(r, "sub-0", "pub-0", (5, 6, 7)), set()),
}
UNKNOWN_CASES = {
    # A fault that did not bite (or has no proof that it did): the run did not test what it claimed.
    "fault_did_not_bite": (replace(BASE, faults=(s.Fault("f1", "kill", "redis-7003", 4, 6, bit=False),)), None, {},
                           {"meta.fault_bit"}),
    # The apply evidence failed (the port still accepted after the kill); the heal's "node alive" proves nothing.
    "fault_bit_only_at_heal": (replace(BASE, faults=(s.Fault("f1", "kill", "redis-7003", 4, 6, bit=False),)),
                               lambda r: _heal_evidence(r, "f1", bit=True), {}, {"meta.fault_bit"}),
    "target_never_came_back": (replace(BASE, faults=(s.Fault("f1", "process_kill", "broker", 4, 6, error=True),)),
                               lambda r: _error_stage(r, "heal", "broker (127.0.0.2:1883) not ready after 240.0 s"),
                               {}, {"meta.fault_bit"}),
    "fault_without_evidence": (replace(BASE, faults=(s.Fault("f1", "kill", "redis-7003", 4, 6, bit=None),)), None,
                               {}, {"meta.fault_bit"}),
    "fault_error": (replace(BASE, faults=(s.Fault("f1", "kill", "redis-7003", 4, 6, error=True),)), None, {},
                    {"meta.fault_bit"}),
    "incomplete_manifest": (BASE, None, {"complete": False}, {"meta.history_complete", "durability.lost"}),
    "drain_timeout": (BASE, lambda r: s.set_phase_detail(r, Phase.DRAIN_END, reason="timeout"), {},
                      {"meta.history_complete", "durability.lost"}),
}


# The log oracle (spark_checkers/rules/logs.py, docs/invariants.md "Node logs"): a planted line and its near-miss twins.
# The same "giving up ... committing anyway" fails where the scenario's failure strategy may not lose records
# (retry_forever, the fault scenarios') and is only reported under TBMQ's skip; the correct broker's own
# retries under faults (library errors, a save script that found no master) never fail.
RETRY = replace(BASE, failure_strategy="retry_forever")
_LOG = "2026-09-21 12:26:45,000 broker-1"
GIVE_UP = (f"{_LOG} ERROR reference_broker.pipeline: tbmq.msg.persisted: giving up on 3 records after 4 attempts "
           "(ConnectionError('Connection refused')); committing anyway")
SURVIVED = (f"{_LOG} ERROR aiokafka: Unable connect to node with id 0: [Errno 111] Connect call failed",
            f"{_LOG} WARNING reference_broker.pipeline: tbmq.msg.persisted: processing failed (attempt 2): "
            "server:ResponseError: save script for sub-0_messages not run: no master took it after 3 attempts "
            "(redirected or script missing); retrying")
LUA = (f"{_LOG} WARNING reference_broker.session: sub-0: delivery read failed: server:ResponseError: user_script:9: "
       "attempt to perform arithmetic on local 'x' (a nil value) script: 104ac674, on @user_script:9.; retrying")


def _logs(spec, *lines):
    return replace(spec, log_lines=(*s.clean_log_lines(spec), *(("broker-1", "broker", line) for line in lines)))


CASES.update({
    "log_committing_anyway_must_not_lose": (_logs(RETRY, GIVE_UP), None, {"logs.error_lines"}),
    "log_committing_anyway_under_skip": (_logs(BASE, GIVE_UP), None, set()),
    "log_lua_script_error": (_logs(RETRY, LUA), None, {"logs.error_lines"}),
    "log_retries_the_broker_survives": (_logs(RETRY, *SURVIVED), None, set()),
})
UNKNOWN_CASES["log_of_a_node_unread"] = (replace(BASE, unread_logs=("redis-2",)), None, {},
                                         {"logs.error_lines", "logs.reported_lines"})


# Session loss and return (durability.session_returned): sub-0 is offline twice (slots 3..6 and 9..12).  At its
# reconnect at slot 6 the broker answers session present = 0 (the node holding the session is away) and its
# subscribe is refused; while it says so it delivers nothing of the session, and at the reconnect at slot 12
# it presents the session again and sends only the second window's backlog.  What was acknowledged from the
# first disconnect to the second (pub-0 #3..#8) is owed to that one session and lost.
RETURNING = replace(EXTERNAL, messages=14, offline=(s.Offline(0, 3, 6), s.Offline(0, 9, 12)))
RETURNING_EXPIRED = replace(RETURNING, protocol=5, messages=30, offline=(s.Offline(0, 3, 6), s.Offline(0, 9, 25)))


def _lost_then_returned(rows, *, resubscribed=False, expiry_s=None):
    """sub-0's session reported lost at its reconnect at slot 6 (connect 1) and its deliveries until its next
    disconnect gone; ``resubscribed``: the new session is granted its subscription at once and gets what is
    published from then on (the lost session's backlog stays gone).  ``expiry_s``: the lost session's own
    session expiry interval."""
    if expiry_s is not None:
        rows = s.set_connect(rows, "sub-0", 0, session_expiry_s=expiry_s)
    connects = [r for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0"]
    lost_at = connects[1]["t_mono_us"]
    gone_at = next(r["t_mono_us"] for r in rows if r["kind"] == Kind.DISCONNECT and r.get("client") == "sub-0"
                   and r["t_mono_us"] > lost_at)
    acked = {r["pub_seq"]: r["t_mono_us"] for r in rows if r["kind"] == Kind.PUBLISH_ACK and r["publisher"] == "pub-0"}
    for seq in sorted(acked):
        delivery = next((r for r in rows if r["kind"] == Kind.DELIVERY and r.get("client") == "sub-0"
                         and r.get("pub_seq") == seq), None)
        if delivery is None or not lost_at <= delivery["t_mono_us"] < gone_at:
            continue
        if resubscribed and acked[seq] > lost_at:
            continue  # published after the new session subscribed: it got it live
        rows = s.drop_delivery(rows, "sub-0", "pub-0", seq)
    rows = s.set_connect(rows, "sub-0", 1, session_present=False)
    sub = next(r for r in rows if r["kind"] == Kind.SUBSCRIBE_ACK and r.get("client") == "sub-0")
    rows.append({**sub, "t_mono_us": lost_at + 1, **({} if resubscribed else {"qos": None, "reason_code": 0x80})})
    rows.append({**sub, "t_mono_us": connects[2]["t_mono_us"] + 1})  # it subscribes on every connect
    return s.sort_rows(rows)


CASES.update({
    "session_lost_and_returned": (RETURNING, _lost_then_returned,
                                  {"durability.session_lost", "durability.session_returned", "durability.lost"}),
    # Near misses: a new session granted its subscription is what a later session present = 1 presents (only
    # the lost session's backlog is lost); a session that would have expired by then cannot come back.
    "session_lost_then_new_session_resumed": (RETURNING, lambda r: _lost_then_returned(r, resubscribed=True),
                                              {"durability.session_lost", "durability.lost"}),
    "session_lost_then_present_after_its_expiry": (RETURNING_EXPIRED, lambda r: _lost_then_returned(r, expiry_s=1),
                                                   {"durability.session_lost", "durability.lost"}),
})


# Wills (spark_checkers/wills.py): sub-0's CONNECTs carry a Will (its payload names the connection); sub-0 drops at
# slot 5 and resumes its session at slot 8 (BASE's offline window); a watcher receives what is published on the
# will topics.  MQTT 5 for the Will Delay.
WILLS_V5 = replace(BASE, protocol=5)


def _will(rows, *, delay_s=None, clean=False, arrives_after_us=None):
    """sub-0 connects with a Will (delay ``delay_s``); its drop is a normal DISCONNECT if ``clean``; the watcher gets
    the first connection's Will ``arrives_after_us`` after the drop (None: never)."""
    import json

    from contracts.history_schema import will_payload, will_topic

    rows = [dict(r) for r in rows]
    connects = [r for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0"]
    for n, row in enumerate(connects, 1):
        detail = json.loads(row.get("detail") or "{}")
        detail["will"] = {"topic": will_topic("sub-0"), "qos": 1, "delay_s": delay_s,
                          "payload": will_payload("sub-0", n)}
        row["detail"] = json.dumps(detail)
    drop = next(r for r in rows if r["kind"] == Kind.DISCONNECT and r.get("client") == "sub-0")
    if clean:
        drop.update(initiator="client", abrupt=False)
    if arrives_after_us is not None:
        rows.append({"t_mono_us": drop["t_mono_us"] + arrives_after_us, "kind": Kind.DELIVERY, "client": "watcher",
                     "node": "broker-1", "protocol": 5, "topic": will_topic("sub-0"), "qos": 1, "packet_id": 1,
                     "dup": False, "retain": False, "payload_size": 20, "body_hash": "0000000000000001",
                     "detail": json.dumps({"will": will_payload("sub-0", 1)})})
    return s.sort_rows(rows)


CASES.update({
    # An abrupt drop owes the Will: published (near miss) or not (planted).
    "will_published_after_abrupt_drop": (BASE, lambda r: _will(r, arrives_after_us=50_000), set()),
    "will_missing_after_abrupt_drop": (BASE, lambda r: _will(r), {"will.missing"}),
    # A normal DISCONNECT discards it: nothing (near miss) or a Will all the same (planted).
    "will_discarded_by_normal_disconnect": (BASE, lambda r: _will(r, clean=True), set()),
    "will_after_normal_disconnect": (BASE, lambda r: _will(r, clean=True, arrives_after_us=50_000),
                                     {"will.after_normal_disconnect"}),
    # A Will Delay of 2 s, the session resumed 0.3 s later: never due (near miss), so a Will at once is early.
    "will_cancelled_by_resumed_session": (WILLS_V5, lambda r: _will(r, delay_s=2), set()),
    "will_before_its_delay": (WILLS_V5, lambda r: _will(r, delay_s=2, arrives_after_us=50_000), {"will.early"}),
})


def _retained(rows, *, deliver=2, subscribe_slot=8, subscribe_after_us=0, retain=True, then_live=None,
              live_retain=False):
    """pub-r publishes #1 (slot 2) and #2 (slot 5) with RETAIN 1 on ordeal/retained/0 (no subscriber holds it);
    late-0 connects (clean start) at ``subscribe_slot`` (+ ``subscribe_after_us``), subscribes to ordeal/retained/+
    and receives #``deliver`` with RETAIN ``retain`` (None: nothing), then #``then_live`` forwarded live (RETAIN
    ``live_retain``, 0 by default: a message the broker's pipeline still held when the subscription began)."""
    from contracts.history_schema import RETAINED_FILTER, retained_topic

    spec, topic = BASE, retained_topic(0)
    rows = [dict(r) for r in rows]
    rows.append({"t_mono_us": s.T0_US - 60_000, "kind": Kind.CONNECT, "client": "pub-r", "node": "broker-1",
                 "protocol": 4, "clean_start": True, "session_present": False, "reason_code": 0})
    invoked = {}
    for seq, slot in ((1, 2), (2, 5)):
        t = s.slot_time(spec, slot) + 500
        invoked[seq] = t
        common = {"client": "pub-r", "node": "broker-1", "protocol": 4, "topic": topic, "qos": 1, "packet_id": seq,
                  "publisher": "pub-r", "pub_seq": seq}
        rows.append({**common, "t_mono_us": t, "kind": Kind.PUBLISH_INVOKE, "retain": True, "dup": False,
                     "payload_size": 62, "send_wall_us": s.START_WALL_US + t, "body_hash": s.body_hash("pub-r", seq)})
        rows.append({**common, "t_mono_us": t + 2000, "kind": Kind.PUBLISH_ACK, "reason_code": 0})
    t = s.slot_time(spec, subscribe_slot) + 700 + subscribe_after_us
    late = {"client": "late-0", "node": "broker-1", "protocol": 4}
    rows.append({**late, "t_mono_us": t, "kind": Kind.CONNECT, "clean_start": True, "session_present": False,
                 "reason_code": 0})
    rows.append({**late, "t_mono_us": t + 1000, "kind": Kind.SUBSCRIBE_ACK, "topic": RETAINED_FILTER, "qos": 1,
                 "packet_id": 1, "detail": '{"requested_qos": 1, "rap": false, "no_local": false}'})
    for n, (seq, flag) in enumerate(((deliver, retain), (then_live, live_retain)), 1):
        if seq is None:
            continue
        at = t + 3000 * n
        rows.append({**late, "t_mono_us": at, "kind": Kind.DELIVERY, "topic": topic, "qos": 1, "packet_id": n,
                     "dup": False, "retain": flag, "payload_size": 62, "publisher": "pub-r", "pub_seq": seq,
                     "send_wall_us": s.START_WALL_US + invoked[seq], "body_hash": s.body_hash("pub-r", seq)})
        rows.append({**late, "t_mono_us": at + 300, "kind": Kind.DELIVERY_ACK_SENT, "topic": topic, "qos": 1,
                     "packet_id": n, "publisher": "pub-r", "pub_seq": seq})
    return s.sort_rows(rows)


CASES.update({
    # A subscription after #2 was acknowledged gets #2 (near miss), #1 (replaced by #2: planted) or nothing (planted).
    "retained_newest_to_late_subscriber": (BASE, _retained, set()),
    "retained_older_to_late_subscriber": (BASE, lambda r: _retained(r, deliver=1), {"retained.not_last"}),
    "retained_none_to_late_subscriber": (BASE, lambda r: _retained(r, deliver=None), {"retained.not_last"}),
    # Near miss: subscribed while #2 was in flight (before its ack): #1 is still a right answer.
    "retained_older_while_newer_in_flight": (BASE, lambda r: _retained(r, deliver=1, subscribe_slot=5,
                                                                       subscribe_after_us=600), set()),
    # The retained copy is outside the stream's order: an older message forwarded live after it is no reordering
    # (near miss); the same two both forwarded live are (planted: and no retained copy at all).
    "retained_copy_then_older_live_forward": (BASE, lambda r: _retained(r, then_live=1), set()),
    "live_forwards_out_of_order": (BASE, lambda r: _retained(r, retain=False, then_live=1),
                                   {"order.out_of_order", "retained.not_last"}),
    # One message as the retained copy (RETAIN 1, at the SUBSCRIBE) and as the normal forward (RETAIN 0) on the
    # same connection: MQTT allows both copies, no message twice (near miss; the second copy follows an ack,
    # so it is a redelivery after ack, allowed here as in will-retained).  Planted: both copies with RETAIN 1.
    "retained_copy_and_live_forward_of_one_message": (ALLOW_REDELIVERY, lambda r: _retained(r, then_live=2), set()),
    "retained_copy_twice_in_connection": (ALLOW_REDELIVERY, lambda r: _retained(r, then_live=2, live_retain=True),
                                          {"duplicates.backlog_twice_in_connection"}),
})



# A shared group of 3 APPLICATION members on $share/g/europe/ua/kyiv/+/0 beside BASE's subscribers, no fault
# (a fault would excuse a redelivery): message k of the run goes to member k mod 3, so share-0 gets pub-0 #1, #4,
# #7, #10 and share-1 pub-0 #3, #6, #9, #12.
SHARED = replace(NO_FAULT, shared_members=3, application_clients=("share-*",))


def _to_member(rows, client, publisher, seq, after_us, packet_id, *, dup=False, acked=True):
    """Another copy of ``publisher``#``seq`` to member ``client``, ``after_us`` after its first delivery."""
    first = next(r for r in s.deliveries(rows) if r.get("publisher") == publisher and r.get("pub_seq") == seq
                 and str(r.get("client")).startswith("share-"))
    return s.sort_rows(s.add_delivery(rows, first, first["t_mono_us"] + after_us, ack=acked, client=client,
                                      packet_id=packet_id, dup=dup))


def _member_drops(rows, client, t_mono_us, back_after_us=50_000):
    """``client`` loses its connection at ``t_mono_us`` and resumes its session ``back_after_us`` later."""
    common = {"client": client, "node": "broker-1", "protocol": 4}
    rows = [*rows, {**common, "t_mono_us": t_mono_us, "kind": Kind.DISCONNECT, "initiator": "harness", "abrupt": True},
            {**common, "t_mono_us": t_mono_us + back_after_us, "kind": Kind.CONNECT, "clean_start": False,
             "session_present": True, "reason_code": 0}]
    return s.sort_rows(rows)


def _handed_over(rows):
    """share-0 gets pub-0 #7 and drops before acknowledging it; the group hands it to share-1 (DUP 1)."""
    t = s.find_delivery(rows, "share-0", "pub-0", 7)["t_mono_us"]
    rows = _member_drops(s.drop_ack(rows, "share-0", "pub-0", 7), "share-0", t + 20_000)  # back before its next
    return _to_member(rows, "share-1", "pub-0", 7, 300_000, 60000, dup=True)


def _left_unacked(rows):
    """share-0 gets pub-0 #7, drops before acknowledging it, and no member ever gets it again."""
    t = s.find_delivery(rows, "share-0", "pub-0", 7)["t_mono_us"]
    return _member_drops(s.drop_ack(rows, "share-0", "pub-0", 7), "share-0", t + 20_000)


def _late_group(rows):
    """The members subscribe only at slot 4: what was published before owes the group nothing."""
    rows = [dict(r) for r in rows]
    for r in rows:
        if r["kind"] == Kind.SUBSCRIBE_ACK and str(r.get("client")).startswith("share-"):
            r["t_mono_us"] = s.slot_time(SHARED, 4) - 20_000
    for seq in (1, 2, 3):
        for publisher in ("pub-0", "pub-1"):
            member = next(str(r["client"]) for r in s.deliveries(rows) if str(r.get("client")).startswith("share-")
                          and r.get("publisher") == publisher and r.get("pub_seq") == seq)
            rows = s.drop_delivery(rows, member, publisher, seq)
    return s.sort_rows(rows)


def _acked_then_elsewhere(rows, *, ack_lost=False):
    """share-0 acknowledges pub-0 #10 and share-1 gets it 0.3 s later; ``ack_lost``: share-0's connection ended
    0.1 s after its ack (within the clock tolerance: the PUBACK may never have left)."""
    if ack_lost:
        t = s.find_delivery(rows, "share-0", "pub-0", 10)["t_mono_us"]
        rows = _member_drops(rows, "share-0", t + 100_000)
    return _to_member(rows, "share-1", "pub-0", 10, 300_000, 60001, dup=True)


def _member_takes_id(rows, client, publisher, seq, packet_id):
    """``client``'s delivery of ``publisher``#``seq`` (and its ack) carry ``packet_id`` instead."""
    rows = s.sort_rows(rows)
    delivery = s.find_delivery(rows, client, publisher, seq)
    ack = s._ack_after(rows, delivery)
    delivery["packet_id"] = packet_id
    if ack is not None:
        ack["packet_id"] = packet_id
    return rows


def _id_of_unacked(rows, *, handed_over):
    """share-0 leaves pub-0 #7 (packet id 5) unacknowledged; its next message, pub-1 #8, takes id 5 again: after a
    reconnect that let the group hand #7 to share-1 (``handed_over``), or on the same connection."""
    rows = _handed_over(rows) if handed_over else s.drop_ack(rows, "share-0", "pub-0", 7)
    return _member_takes_id(rows, "share-0", "pub-1", 8, 5)


CASES.update({
    "shared_clean": (SHARED, None, set()),
    # A message owed to the group that no member got (planted); the same message handed over to another member
    # after the first dropped it unacknowledged (near miss: DUP 1 on the other member's first copy, legal there).
    "shared_lost": (SHARED, lambda r: s.drop_delivery(r, "share-0", "pub-0", 7), {"shared.lost"}),
    "shared_unacked_handed_over": (SHARED, _handed_over, set()),
    # ... and the same member drop with the message handed to no one: delivered once, never acknowledged (planted).
    "shared_unacked_and_dropped": (SHARED, _left_unacked, {"shared.lost"}),
    # Nothing is owed before the group exists (near miss of shared_lost).
    "shared_nothing_owed_before_the_group": (SHARED, _late_group, set()),
    # Acknowledged by share-0, then sent to share-1 (planted); the ack's connection ended within the tolerance
    # (near miss: the broker may never have had the PUBACK).
    "shared_redelivered_after_ack": (SHARED, _acked_then_elsewhere, {"shared.redelivered_after_ack"}),
    "shared_redelivered_after_a_lost_ack": (SHARED, lambda r: _acked_then_elsewhere(r, ack_lost=True), set()),
    # A member's share keeps no order (near miss: the same swap on a plain subscriber is out_of_order).
    "shared_member_out_of_order": (SHARED, lambda r: s.swap_deliveries(r, "share-0", "pub-0", 4, 7), set()),
    # The id of a message the group handed to another member is free on the member's next connection (near miss);
    # on the same connection it is still in use (planted).
    "shared_id_free_after_hand_over": (SHARED, lambda r: _id_of_unacked(r, handed_over=True), set()),
    "shared_id_reused_in_connection": (SHARED, lambda r: _id_of_unacked(r, handed_over=False),
                                       {"order.packet_id_reused"}),
})

def write_runs(root: Path) -> dict[str, Path]:
    """Every case of the catalog written as a run directory under ``root`` (name -> directory), in catalog
    order: ``CASES`` first, then ``UNKNOWN_CASES``."""
    out = {}
    for name, (spec, mutate, *rest) in {**CASES, **UNKNOWN_CASES}.items():
        rows = s.generate(spec)
        rows = mutate(rows) if mutate else rows
        write_kwargs = rest[0] if name in UNKNOWN_CASES else {}
        out[name] = s.write_run(root / name, rows, spec, **write_kwargs)
    return out
