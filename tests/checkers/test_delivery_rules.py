"""The delivery rules of MQTT 3.1.1 and 5 a client's history can show (spark_checkers/rules/qos.py, props.py, flow.py,
the expiry rules and durability.expired_session_present): each anomaly planted alone is counted exactly once, with
words that name it; each near-miss twin is counted not at all; a clean history passes every one of them.  Every
case is checked in one Spark batch; a version 1 history carrying the same anomalies shows none of the rules that
need version 2."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from contracts.history_schema import Kind
from contracts.invariants import BY_ID
from contracts.mqtt_properties import forwarded_json
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # one Spark batch; slow when the machine is loaded

# The invariants these rules decide; every case is judged on all of them.
RULES = ("qos.upgraded", "qos.above_grant", "qos.downgraded", "qos2.pubrel_not_resent", "expiry.property_missing",
         "expiry.remaining_not_reduced", "props.forwarded_changed", "props.subscription_ids",
         "props.retain_as_published", "flow.receive_maximum", "flow.packet_too_large",
         "durability.expired_session_present")

PROPS = forwarded_json(SimpleNamespace(ContentType="text/plain", UserProperty=[("a", "1"), ("b", "2")]))
REORDERED = forwarded_json(SimpleNamespace(ContentType="text/plain", UserProperty=[("b", "2"), ("a", "1")]))
# Two MQTT 5 publishers and subscribers, every message with a Message Expiry Interval, forwarded properties and
# sub-i's subscription identifier 7; an external target (no white-box rules: QoS 0 plants take no stored id).
V5 = s.Spec(pairs=2, messages=12, protocol=5, expiry_s=60, target_kind="external", props=PROPS, sub_id=7)
SLOW = replace(V5, interval_us=3_000_000, messages=4)  # 3 s between messages: a delivery may move 2 s in order
QOS2 = replace(V5, qos=2, qos2_flow=True, offline=(s.Offline(0, 5, 8),))  # sub-0 offline over slots 5..7
V311 = s.Spec(pairs=2, messages=12, target_kind="external")
OVERLAP = "europe/ua/kyiv/0/#"  # a second filter of sub-0's, matching what its own (europe/ua/kyiv/0/+) matches
SIZE = s.publish_packet_size(V5, "europe/ua/kyiv/0/0")  # every synthetic delivery's PUBLISH packet size


def t_invoke(rows, publisher, pub_seq):
    return s.publish_row(rows, Kind.PUBLISH_INVOKE, publisher, pub_seq)["t_mono_us"]


def delivered_at(rows, client, publisher, pub_seq):
    return s.find_delivery(rows, client, publisher, pub_seq)["t_mono_us"]


def at_qos0(rows, client="sub-0", publisher="pub-0", pub_seq=4):
    """That delivery at QoS 0: no packet id, no ack."""
    return s.set_delivery_field(s.drop_ack(rows, client, publisher, pub_seq), client, publisher, pub_seq, qos=0,
                                packet_id=None)


def overlap(rows, qos=1, **options):
    """sub-0 also subscribes to OVERLAP before the workload (granted ``qos``)."""
    return s.subscribe(rows, "sub-0", OVERLAP, s.T0_US - 30_000, qos, **options)


def sub_ids_of(rows, client, value, from_seq=1):
    """Every delivery of ``client`` (of a message from ``from_seq`` on) carries the subscription identifiers ``value``."""
    rows = s._copy(rows)
    for row in s.deliveries(rows, client):
        if row["pub_seq"] >= from_seq:
            row["sub_ids"] = value
    return rows


def second_copy(rows, client="sub-0", publisher="pub-0", pub_seq=4, after_us=100, **fields):
    """A second copy of that delivery ``after_us`` later (its own packet id, acknowledged), as one copy per
    overlapping subscription."""
    template = s.find_delivery(rows, client, publisher, pub_seq)
    return s.add_delivery(rows, template, template["t_mono_us"] + after_us, **{"packet_id": 200, **fields})


def resubscribe_around(rows, qos_during, qos_after=1, **options):
    """sub-0 re-subscribes its filter 1 ms after pub-0#4 is published (granted ``qos_during``) and again right after
    its delivery (granted ``qos_after``)."""
    start, end = t_invoke(rows, "pub-0", 4) + 1_000, delivered_at(rows, "sub-0", "pub-0", 4) + 1_000
    rows = s.subscribe(rows, "sub-0", "europe/ua/kyiv/0/+", start, qos_during, **options)
    return s.subscribe(rows, "sub-0", "europe/ua/kyiv/0/+", end, qos_after, **options)


def move_with_remaining(rows, after_us, remaining):
    """pub-1#2 reaches sub-1 ``after_us`` after its publish, carrying ``remaining`` s of its expiry."""
    rows = s.move_delivery(rows, "sub-1", "pub-1", 2, t_invoke(rows, "pub-1", 2) + after_us)
    return s.set_delivery_field(rows, "sub-1", "pub-1", 2, remaining_expiry_s=remaining)


def late_ack(rows, receive_maximum):
    """sub-0's CONNECT declares ``receive_maximum``; it acknowledges pub-0#4 only after #5 has arrived."""
    rows = s.set_connect_detail(rows, "sub-0", 0, receive_maximum=receive_maximum)
    return s.delay_ack(rows, "sub-0", "pub-0", 4, delivered_at(rows, "sub-0", "pub-0", 5) + 100)


def retained(rows, rap, delivered_retain):
    """pub-0#4 is published with RETAIN 1 and forwarded to sub-0 (Retain As Published ``rap``) with
    ``delivered_retain``."""
    rows = s.set_subscription(s.set_publish(rows, "pub-0", 4, retain=True), "sub-0", 0, rap=rap)
    return s.set_delivery_field(rows, "sub-0", "pub-0", 4, retain=delivered_retain)


def retained_on_subscribe(rows):
    """pub-0#4 is published with RETAIN 1 and forwarded with RETAIN 0; sub-0 then subscribes to its topic as well and
    is sent the retained message (RETAIN 1)."""
    rows = s.set_publish(rows, "pub-0", 4, retain=True)
    t = delivered_at(rows, "sub-0", "pub-0", 4)
    rows = s.subscribe(rows, "sub-0", "europe/ua/kyiv/0/0", t + 1_000, 1)
    return second_copy(rows, after_us=2_000, retain=True)


def session_expiry(offline_to_slot, expiry_s, faults=()):
    """(spec, mutation): sub-0's session (Session Expiry Interval ``expiry_s``) offline from slot 3 to
    ``offline_to_slot`` (0.1 s a slot), back with session present 1."""
    spec = replace(V5, messages=24, offline=(s.Offline(0, 3, offline_to_slot),), faults=faults)
    return spec, lambda rows: s.set_connect(rows, "sub-0", 0, session_expiry_s=expiry_s)

# name -> (spec, mutation, {invariant: count} among RULES (every other one 0), words its witness says)
def _never_sent(rows, publish_size):
    """sub-0 (Maximum Packet Size SIZE) never gets pub-0 #4, published as a PUBLISH of ``publish_size`` bytes."""
    rows = s.drop_delivery(s.set_connect_detail(rows, "sub-0", 0, maximum_packet_size=SIZE), "sub-0", "pub-0", 4)
    s.publish_row(rows, Kind.PUBLISH_INVOKE, "pub-0", 4)["packet_size"] = publish_size
    return rows


CASES = {
    "clean_v5": (V5, None, {}, ()),
    "clean_v5_qos2": (QOS2, None, {}, ()),
    "clean_311": (V311, None, {}, ()),
    # --- qos.upgraded / qos.above_grant / qos.downgraded ---
    "upgraded": (V5, lambda r: s.set_delivery_field(s.set_subscription(r, "sub-0", 0, qos=2), "sub-0", "pub-0", 4, qos=2),
                 {"qos.upgraded": 1}, ("at QoS 2, but it was published at QoS 1",)),
    "delivered_as_published_at_qos2": (
        V5, lambda r: s.set_delivery_field(s.set_publish(s.set_subscription(r, "sub-0", 0, qos=2), "pub-0", 4, qos=2),
                                           "sub-0", "pub-0", 4, qos=2), {}, ()),
    "above_grant": (V5, lambda r: s.set_delivery_field(s.set_publish(r, "pub-0", 4, qos=2), "sub-0", "pub-0", 4, qos=2),
                    {"qos.above_grant": 1}, ("above QoS 1, the highest",)),
    "within_an_overlapping_grant": (
        V5, lambda r: s.set_delivery_field(s.set_publish(overlap(r, 2, sub_id=7), "pub-0", 4, qos=2), "sub-0", "pub-0",
                                           4, qos=2), {}, ()),
    "downgraded": (V5, at_qos0, {"qos.downgraded": 1}, ("at most QoS 0", "it is owed QoS 1")),
    "downgraded_while_resubscribed_at_qos0": (V5, lambda r: at_qos0(resubscribe_around(r, 0, sub_id=7)), {}, ()),
    "overlap_one_copy_at_the_lower_grant": (V5, lambda r: at_qos0(overlap(r, 0, sub_id=7)), {"qos.downgraded": 1},
                                            ("it is owed QoS 1",)),
    "overlap_one_copy_per_subscription": (
        V5, lambda r: second_copy(overlap(r, 0, sub_id=7), qos=0, packet_id=None), {}, ()),
    # --- qos2.pubrel_not_resent ---
    "pubrel_not_resent": (QOS2, lambda r: s.cut_qos2_flow(r, "sub-0", "pub-0", 2), {"qos2.pubrel_not_resent": 1},
                          ("with PUBREC at 1.107 s", "never sent that PUBREL again")),
    "pubrel_resent_on_the_resumed_connection": (
        QOS2, lambda r: s.release_qos2(s.cut_qos2_flow(r, "sub-0", "pub-0", 2), "sub-0", "pub-0", 2,
                                       s.slot_time(QOS2, 8) - QOS2.interval_us // 4 + 500, remaining_expiry_s=60),
        {}, ()),
    "pubrel_owed_to_no_new_session": (
        QOS2, lambda r: s.set_connect(s.cut_qos2_flow(r, "sub-0", "pub-0", 2), "sub-0", 1, session_present=False,
                                      clean_start=True), {}, ()),
    "pubrec_may_not_have_left": (QOS2, lambda r: s.cut_qos2_flow(r, "sub-0", "pub-0", 4), {}, ()),
    # --- expiry.property_missing / expiry.remaining_not_reduced ---
    "expiry_property_missing": (V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, remaining_expiry_s=None),
                                {"expiry.property_missing": 1}, ("over MQTT 5 without one",)),
    "expiry_property_absent_on_a_311_delivery": (
        V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, remaining_expiry_s=None, protocol=4), {}, ()),
    "remaining_one_second_long_at_a_whole_second": (
        SLOW, lambda r: move_with_remaining(r, 200_000 + 2_000_000, 59), {"expiry.remaining_not_reduced": 1},
        ("ends 1.200 s after the message's own expiry",)),
    "remaining_just_before_the_whole_second": (SLOW, lambda r: move_with_remaining(r, 200_000 + 2_000_000 - 1, 59),
                                               {}, ()),
    "remaining_above_the_published": (SLOW, lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 2, remaining_expiry_s=61),
                                      {"expiry.remaining_not_reduced": 1}, ("more than the 60 s it was published with",)),
    "remaining_as_published_at_once": (SLOW, lambda r: s.set_delivery_field(r, "sub-1", "pub-1", 2, remaining_expiry_s=60),
                                       {}, ()),
    # --- props.forwarded_changed ---
    "props_reordered": (V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, props=REORDERED),
                        {"props.forwarded_changed": 1}, (REORDERED, f"published with {PROPS}")),
    "props_not_carried_to_a_311_subscriber": (
        V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, props=None, protocol=4), {}, ()),
    "props_on_a_message_of_a_311_publisher": (
        V5, lambda r: s.set_publish(r, "pub-0", 4, protocol=4, props=None, expiry_s=None), {}, ()),
    # --- props.subscription_ids ---
    "sub_id_wrong": (V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, sub_ids="8"),
                     {"props.subscription_ids": 1}, ("with subscription identifier 8", "carry identifier(s) 7")),
    "sub_id_missing": (V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, sub_ids=None),
                       {"props.subscription_ids": 1}, ("with no subscription identifier",)),
    "sub_id_never_asked_for": (replace(V5, sub_id=None), lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, sub_ids="7"),
                               {"props.subscription_ids": 1}, ("carry no identifier",)),
    "sub_ids_of_overlapping_subscriptions_in_any_order": (
        V5, lambda r: sub_ids_of(overlap(r, sub_id=9), "sub-0", "9,7"), {}, ()),
    "sub_ids_one_copy_per_subscription": (
        V5, lambda r: second_copy(s.set_delivery_field(sub_ids_of(overlap(r, sub_id=9), "sub-0", "9,7"),
                                                       "sub-0", "pub-0", 4, sub_ids="7"), sub_ids="9"), {}, ()),
    "sub_ids_one_copy_missing_one": (
        V5, lambda r: s.set_delivery_field(sub_ids_of(overlap(r, sub_id=9), "sub-0", "9,7"), "sub-0", "pub-0", 4,
                                           sub_ids="7"), {"props.subscription_ids": 1}, ("identifier(s) 7, 9",)),
    "sub_id_changed_by_a_resubscribe": (
        V5, lambda r: sub_ids_of(resubscribe_around(r, 1, sub_id=8), "sub-0", "8", from_seq=4), {}, ()),
    # --- props.retain_as_published ---
    "retain_set_on_a_forward": (V5, lambda r: s.set_delivery_field(r, "sub-0", "pub-0", 4, retain=True),
                                {"props.retain_as_published": 1}, ("though it was published with RETAIN 0",)),
    "retain_as_published_kept": (V5, lambda r: retained(r, True, True), {}, ()),
    "retain_as_published_cleared": (V5, lambda r: retained(r, True, False), {"props.retain_as_published": 1},
                                    ("Retain As Published 1",)),
    "retain_cleared_without_rap": (V5, lambda r: retained(r, False, False), {}, ()),
    "retain_kept_without_rap": (V5, lambda r: retained(r, False, True), {"props.retain_as_published": 1},
                                ("as a live forward",)),
    "retained_sent_to_a_new_subscription": (V5, retained_on_subscribe, {}, ()),
    # --- flow.receive_maximum / flow.packet_too_large ---
    "receive_maximum_exceeded": (V5, lambda r: late_ack(r, 1), {"flow.receive_maximum": 1},
                                 ("2 in flight, more than the Receive Maximum 1",)),
    "receive_maximum_reached": (V5, lambda r: late_ack(r, 2), {}, ()),
    "receive_maximum_resend_of_the_same_packet": (
        V5, lambda r: s.resend_before_ack(s.set_connect_detail(r, "sub-0", 0, receive_maximum=1), "sub-0", "pub-0", 4),
        {}, ()),
    "packet_too_large": (V5, lambda r: s.set_delivery_field(s.set_connect_detail(r, "sub-0", 0, maximum_packet_size=SIZE),
                                                            "sub-0", "pub-0", 4, packet_size=SIZE + 1),
                         {"flow.packet_too_large": 1}, (f"{SIZE + 1} bytes", f"Maximum Packet Size {SIZE}")),
    "packet_of_the_maximum_size": (V5, lambda r: s.set_connect_detail(r, "sub-0", 0, maximum_packet_size=SIZE), {}, ()),
    # A message too large for the subscriber's Maximum Packet Size is discarded unsent ([MQTT-3.1.2-25]): not owed
    # (durability.lost 0, test_a_message_too_large_for_the_subscriber_is_not_owed); one that fits is.
    "too_large_discarded": (V5, lambda r: _never_sent(r, SIZE + 20), {}, ()),
    "fits_but_never_sent": (V5, lambda r: _never_sent(r, SIZE - 5), {}, ()),
    # --- durability.expired_session_present ---
    # 1.3 s offline with an expiry of 1 s (+ the 0.2 s tolerance); 1.1 s; 1.3 s with 2 s; 1.3 s across a kill
    "expired_session_present": (*session_expiry(16, 1), {"durability.expired_session_present": 1},
                                ("1.300 s after its disconnect", "session present = 1")),
    "session_present_within_the_tolerance": (*session_expiry(14, 1), {}, ()),
    "session_present_before_expiry": (*session_expiry(16, 2), {}, ()),
    "session_present_across_a_fault": (*session_expiry(16, 1, (s.Fault("f1", "kill", "broker-1", 5, 7),)), {}, ()),
}


def v1_anomalies(rows):
    """What only a version 2 history shows, planted at once: changed properties, a wrong subscription identifier,
    a packet too large, a Receive Maximum exceeded."""
    rows = s.set_delivery_field(rows, "sub-0", "pub-0", 4, props=REORDERED, sub_ids="8")
    rows = s.set_delivery_field(s.set_connect_detail(rows, "sub-1", 0, maximum_packet_size=SIZE), "sub-1", "pub-1", 4,
                                packet_size=SIZE + 1)
    return late_ack(rows, 1)


V1_CASES = {"v1_v5_anomalies": (V5, v1_anomalies), "v1_qos2_cut": (QOS2, lambda r: s.cut_qos2_flow(r, "sub-0", "pub-0", 2))}


@pytest.fixture(scope="module")
def reports(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("delivery-rules")
    runs = {}
    for name, (spec, mutation, _, _) in CASES.items():
        rows = s.generate(spec)
        runs[name] = s.write_run(root / name, mutation(rows) if mutation else rows, spec)
    for name, (spec, mutation) in V1_CASES.items():
        runs[name] = s.write_run(root / name, mutation(s.generate(spec)), spec, schema_version=1)
    return dict(zip(runs, check_runs(list(runs.values()), spark=spark), strict=True))


def _items(report):
    return {i["id"]: i for i in report["invariants"]}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_counts_its_plant_once_and_no_near_miss(reports, name):
    expected, words = CASES[name][2], CASES[name][3]
    items = _items(reports[name])
    counts = {invariant: items[invariant]["count"] for invariant in RULES}
    assert counts == {invariant: expected.get(invariant, 0) for invariant in RULES}, [
        (i, items[i]["verdict"], items[i].get("reason"), [w["text"] for w in items[i]["witnesses"]])
        for i in RULES if items[i]["count"] or items[i]["verdict"] == "unknown"]
    for invariant in expected:
        assert items[invariant]["verdict"] == "fail"
        [witness] = items[invariant]["witnesses"]
        for phrase in words:
            assert phrase in witness["text"], witness["text"]


def test_a_clean_history_passes_every_rule(reports):
    for name in ("clean_v5", "clean_v5_qos2"):
        items = _items(reports[name])
        assert {i: items[i]["verdict"] for i in RULES} == {i: "pass" for i in RULES}, name
    assert reports["clean_v5"]["exit_code"] == reports["clean_v5_qos2"]["exit_code"] == 0
    # MQTT 3.1.1 only: what only MQTT 5 packets carry is not applicable; the rest passes.
    items = _items(reports["clean_311"])
    assert {i: items[i]["verdict"] for i in RULES} == {
        i: "not_applicable" if BY_ID[i].mqtt5_only else "pass" for i in RULES}


def test_a_witness_names_the_message_its_times_and_the_values(reports):
    """A witness carries the client, the message, when, its packet id and the values that disagree."""
    [w] = _items(reports["above_grant"])["qos.above_grant"]["witnesses"]
    assert (w["data"]["client"], w["data"]["publisher"], w["data"]["pub_seq"], w["data"]["packet_id"]) == (
        "sub-0", "pub-0", 4, 4)
    assert (w["data"]["delivered_qos"], w["data"]["pub_qos"], w["data"]["max_granted"]) == (2, 2, 1)
    [w] = _items(reports["props_reordered"])["props.forwarded_changed"]["witnesses"]
    assert (w["data"]["published"], w["data"]["received"]) == (PROPS, REORDERED)
    [w] = _items(reports["receive_maximum_exceeded"])["flow.receive_maximum"]["witnesses"]
    assert (w["data"]["pub_seq"], w["data"]["in_flight"], w["data"]["receive_maximum"]) == (5, 2, 1)
    [w] = _items(reports["pubrel_not_resent"])["qos2.pubrel_not_resent"]["witnesses"]
    assert (w["data"]["packet_id"], w["data"]["t_resumed"]) == (2, s.slot_time(QOS2, 8) - QOS2.interval_us // 4)
    [w] = _items(reports["expired_session_present"])["durability.expired_session_present"]["witnesses"]
    assert (w["data"]["session_expiry_s"], w["data"]["offline_us"]) == (1, 1_300_000)


@pytest.mark.parametrize("name", list(V1_CASES))
def test_a_version_1_history_shows_nothing_of_version_2(reports, name):
    """The same anomalies in a version 1 history (no props, sub_ids, packet_size columns, no QoS 2 flow rows, no
    CONNECT / SUBSCRIBE options): nothing counted, and what needs version 2 is unknown, never a pass."""
    items = _items(reports[name])
    assert {i: items[i]["count"] for i in RULES} == {i: 0 for i in RULES}
    assert {i for i in RULES if BY_ID[i].needs_v2} <= {i for i in RULES if items[i]["verdict"] == "unknown"}


def test_a_message_too_large_for_the_subscriber_is_not_owed(reports):
    """Its copy (the publish + a subscription identifier) is larger than the Maximum Packet Size: the broker
    discards it as if sent; the near miss, 5 bytes under the limit, is owed and lost."""
    assert _items(reports["too_large_discarded"])["durability.lost"]["count"] == 0
    lost = _items(reports["fits_but_never_sent"])["durability.lost"]
    assert (lost["verdict"], lost["count"]) == ("fail", 1)
