"""The reference broker's MQTT 5 delivery rules, each pinned by the normative statement it keeps, and the defect
switch that breaks it (``test_defect_<name>``, counted by test_broker_defects.test_every_defect_has_a_focused_test):
forwarded properties, subscription identifiers, Retain As Published, the delivered QoS, the Message Expiry
Interval on a delivery, the client's Receive Maximum and the PUBREL of a QoS 2 flow resumed on a new connection.

Real broker processes on the shared topology (Redis Cluster, Tansu), driven by paho clients (Probe); live
deliveries and deliveries from the stored backlog (Redis) are both checked where they take different paths."""

from __future__ import annotations

import time

import pytest
import test_broker_flow
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_broker_flow import FILTER, TOPIC, payloads, reconnect

from contracts.mqtt_properties import forwarded_json, workload_properties

pytestmark = pytest.mark.integration
brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests


def forwarded(seq: int, expiry: int | None = None) -> Properties:
    """The workload's forwarded properties of message ``seq`` (and an expiry interval)."""
    properties = Properties(PacketTypes.PUBLISH)
    for name, value in workload_properties("pub", seq).attributes():
        setattr(properties, name, value)
    if expiry is not None:
        properties.MessageExpiryInterval = expiry
    return properties


def subscriber(cluster, *, qos: int = 1, version: int = 5, **options):
    """A persistent subscriber on FILTER (MQTT 5 options: sub_id, rap, no_local; CONNECT: receive_maximum)."""
    connect = {k: options.pop(k) for k in ("receive_maximum", "maximum_packet_size", "auto_ack") if k in options}
    sub = cluster.probe(version=version, **connect)
    if version == 5:
        sub.connect(clean=True, session_expiry=3600)  # a fresh session that outlives its connections
    else:
        sub.connect(clean=True)  # 3.1.1: CleanSession = 1 discards any old state, 0 keeps the new one
        sub.disconnect()
        sub.connect(clean=False)
    sub.subscribe(FILTER, qos, **options)
    return sub


def publisher(cluster, version: int = 5):
    pub = cluster.probe(version=version)
    pub.connect(clean=True)
    return pub


def backlog_after_offline(cluster, sub, pub, send) -> list:
    """``sub`` goes away, ``send(pub)`` publishes, the stored messages come back on the resumed session."""
    sub.disconnect()
    sub.clear()
    count = send(pub)
    cluster.wait_stored(sub.client_id, count)
    assert reconnect(sub) is True
    return sub.wait_for(count)


# ------------------------------------------------------------------ forwarded properties ([MQTT-3.3.2-4], -15..-20)
def test_mqtt_3_3_2_17_properties_forwarded_unchanged_live_and_from_the_backlog(brokers):
    """Payload Format Indicator, Content Type, Response Topic, Correlation Data and the User Properties (one key
    twice, their order kept) reach the subscriber unchanged, live and after waiting in Redis."""
    cluster = brokers()
    sub, pub = subscriber(cluster), publisher(cluster)
    pub.publish(TOPIC, b"live", 1, properties=forwarded(1))
    [live] = sub.wait_for(1)
    assert live.props == forwarded_json(forwarded(1))
    assert '"user_properties":[["ordeal-order","first"],["ordeal-order","second-1"]]' in live.props
    [stored] = backlog_after_offline(cluster, sub, pub, lambda p: p.publish(TOPIC, b"stored", 1,
                                                                             properties=forwarded(2)) and 1)
    assert stored.payload == b"stored" and stored.props == forwarded_json(forwarded(2))


def test_mqtt_3_3_2_17_no_properties_to_an_mqtt_3_1_1_subscriber_and_none_invented(brokers):
    """An MQTT 3.1.1 subscriber gets the payload only; a PUBLISH without properties arrives without them."""
    cluster = brokers()
    old, new, pub = subscriber(cluster, version=4), subscriber(cluster), publisher(cluster)
    pub.publish(TOPIC, b"with", 1, properties=forwarded(1))
    pub.publish(TOPIC, b"without", 1)
    assert [(d.payload, d.props) for d in old.wait_for(2)] == [(b"with", None), (b"without", None)]
    assert [d.props for d in new.wait_for(2)] == [forwarded_json(forwarded(1)), None]


def test_defect_user_properties_dropped(brokers):
    cluster = brokers(defects=["user_properties_dropped"])
    sub, pub = subscriber(cluster), publisher(cluster)
    pub.publish(TOPIC, b"live", 1, properties=forwarded(1))
    [live] = sub.wait_for(1)
    assert "user_properties" not in live.props and '"content_type"' in live.props  # the others are kept


# ------------------------------------------------------------------ subscription identifiers ([MQTT-3.3.4-3], -4)
def test_mqtt_3_3_4_3_subscription_identifiers_on_deliveries(brokers):
    """The delivery carries the identifier of the matching subscription, live and from the backlog; with two
    overlapping subscriptions one copy carries both (ascending); a re-SUBSCRIBE without one removes it."""
    cluster = brokers()
    sub, pub = subscriber(cluster, sub_id=7), publisher(cluster)
    pub.publish(TOPIC, b"one", 1)
    assert [d.sub_ids for d in sub.wait_for(1)] == [(7,)]
    sub.subscribe("europe/ua/kyiv/#", 1, sub_id=3)
    sub.clear()
    pub.publish(TOPIC, b"two", 1)
    assert [(d.payload, d.sub_ids) for d in sub.settle(0.7)] == [(b"two", (3, 7))]
    stored = backlog_after_offline(cluster, sub, pub, lambda p: p.publish(TOPIC, b"three", 1) and 1)
    assert [(d.payload, d.sub_ids) for d in stored] == [(b"three", (3, 7))]
    sub.subscribe(FILTER, 1)  # the same filter again, without an identifier
    sub.clear()
    pub.publish(TOPIC, b"four", 1)
    assert [(d.payload, d.sub_ids) for d in sub.settle(0.7)] == [(b"four", (3,))]


# ------------------------------------------------------------------ Retain As Published ([MQTT-3.3.1-12], -13)
def test_mqtt_3_3_1_12_retain_as_published(brokers):
    """A retained publish (MQTT 3.1.1: the MQTT 5 connections of this broker cannot send one, Retain Available =
    0) is forwarded with RETAIN 1 only to a subscription with Retain As Published; RETAIN 0 to the others and to
    MQTT 3.1.1 subscribers ([MQTT-3.3.1-9])."""
    cluster = brokers()
    rap, plain, old = subscriber(cluster, rap=True), subscriber(cluster), subscriber(cluster, version=4)
    pub = publisher(cluster, version=4)
    pub.publish(TOPIC, b"kept", 1, retain=True)
    pub.publish(TOPIC, b"plain", 1)
    assert [(d.payload, d.retain) for d in rap.wait_for(2)] == [(b"kept", True), (b"plain", False)]
    assert [d.retain for d in plain.wait_for(2)] == [False, False]
    assert [d.retain for d in old.wait_for(2)] == [False, False]


# ------------------------------------------------------------------ the delivered QoS ([MQTT-3.8.4-8]; 3.1.1 §3.8.4)
@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_3_8_4_8_delivered_qos_is_the_minimum_of_published_and_granted(brokers, version):
    cluster = brokers()
    low, high, pub = subscriber(cluster, qos=1, version=version), subscriber(cluster, qos=2, version=version), \
        publisher(cluster, version)
    for qos in (0, 1, 2):
        pub.publish(TOPIC, b"q%d" % qos, qos)
    assert sorted((d.payload, d.qos) for d in low.wait_for(3)) == [(b"q0", 0), (b"q1", 1), (b"q2", 1)]
    assert sorted((d.payload, d.qos) for d in high.wait_for(3)) == [(b"q0", 0), (b"q1", 1), (b"q2", 2)]


def test_defect_qos_upgrade(brokers):
    cluster = brokers(defects=["qos_upgrade"])
    sub, pub = subscriber(cluster, qos=2), publisher(cluster)
    pub.publish(TOPIC, b"q1", 1)
    assert [(d.payload, d.qos) for d in sub.wait_for(1)] == [(b"q1", 2)]  # published at QoS 1


# ------------------------------------------------------------------ message expiry on a delivery ([MQTT-3.3.2-6])
def test_defect_expiry_property_dropped(brokers):
    cluster = brokers(defects=["expiry_property_dropped"])
    sub, pub = subscriber(cluster), publisher(cluster)
    pub.publish(TOPIC, b"live", 1, expiry=60)
    assert [(d.payload, d.expiry) for d in sub.wait_for(1)] == [(b"live", None)]
    # the broker still expires it: an offline backlog past its interval is not delivered
    sub.disconnect()
    sub.clear()
    pub.publish(TOPIC, b"expires", 1, expiry=1)
    cluster.wait_stored(sub.client_id, 1)
    time.sleep(2.2)
    assert reconnect(sub) is True and sub.settle(0.7) == []


def test_correct_broker_forwards_the_remaining_expiry(brokers):
    """The control of test_defect_expiry_property_dropped: live and from the backlog, reduced by the wait."""
    cluster = brokers()
    sub, pub = subscriber(cluster), publisher(cluster)
    pub.publish(TOPIC, b"live", 1, expiry=60)
    [live] = sub.wait_for(1)
    assert live.expiry is not None and 59 <= live.expiry <= 60

    def wait_then_publish(p):
        p.publish(TOPIC, b"stored", 1, expiry=60)
        return 1

    sub.disconnect()
    sub.clear()
    wait_then_publish(pub)
    cluster.wait_stored(sub.client_id, 1)
    time.sleep(2.2)
    assert reconnect(sub) is True
    [stored] = sub.wait_for(1)
    assert stored.expiry is not None and stored.expiry <= 58


# ------------------------------------------------------------------ the client's Receive Maximum ([MQTT-3.3.4-9])
def _unacknowledged_after_a_burst(cluster) -> list:
    sub = subscriber(cluster, receive_maximum=2, auto_ack=False)
    pub = publisher(cluster)
    for n in range(10):
        pub.publish(TOPIC, b"m%d" % n, 1)
    return sub.settle(0.7)


def test_defect_receive_maximum_ignored(brokers):
    got = _unacknowledged_after_a_burst(brokers(defects=["receive_maximum_ignored"]))
    assert len(got) == 10  # all of them unacknowledged at once, Receive Maximum 2


def test_correct_broker_keeps_receive_maximum_without_acks(brokers):
    got = _unacknowledged_after_a_burst(brokers())
    assert payloads(got) == [b"m0", b"m1"]


# ------------------------------------------------------------------ PUBREL after a resumed session ([MQTT-4.4.0-1])
def _qos2_flow_left_at_pubrel(cluster, version: int):
    """A QoS 2 message answered with PUBREC whose PUBREL the subscriber leaves unanswered, then an abrupt drop
    and a resume: what the resumed connection receives."""
    sub = subscriber(cluster, qos=2, version=version)
    pub = publisher(cluster, version)
    sub.hold(True)
    pub.publish(TOPIC, b"flow", 2)
    deadline = time.monotonic() + 10
    while not sub.pubrels and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [d.payload for d in sub.qos2_received] == [b"flow"] and sub.pubrels and not sub.deliveries
    sub.drop()
    sub.clear()
    sub.hold(False)
    assert reconnect(sub) is True
    time.sleep(1.5)
    return sub


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_4_4_0_1_pubrel_resent_on_the_resumed_session(brokers, version):
    sub = _qos2_flow_left_at_pubrel(brokers(), version)
    assert [known for _, known in sub.pubrels] == [True]  # the message PUBREC'ed on the connection before
    assert payloads(sub.deliveries) == [b"flow"] and sub.qos2_received == []  # released, not sent again


def test_defect_pubrel_not_resent(brokers):
    sub = _qos2_flow_left_at_pubrel(brokers(defects=["pubrel_not_resent"]), 5)
    assert sub.pubrels == [] and sub.deliveries == []  # never released
