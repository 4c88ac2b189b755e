"""The reference broker keeps the MQTT 5 rules docs/reference-broker.md claims, and declares what it does not
do.  Each test is named after the normative statement it pins (section number where the
statement has no id) and appears in the conformance table of docs/reference-broker.md.

Real broker processes on the shared topology (Redis Cluster, Tansu), driven by paho clients (Probe) or by a
raw client on the broker's own codec where a test must send what paho would not."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid

import pytest
import test_broker_flow
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_broker_flow import FILTER, TOPIC, RawClient, payloads

from reference_broker import codec

pytestmark = pytest.mark.integration

brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests


def props(packet_type: int, **values) -> Properties:
    out = Properties(packet_type)
    for name, value in values.items():
        setattr(out, name, value)
    return out


def raw(cluster, node: int = 0, version: int = codec.MQTT5) -> RawClient:
    target = cluster.nodes[node]
    return RawClient(target.host, target.port, version)


def raw_connect(client: RawClient, client_id: str | None = None, clean: bool = True, **connect_props):
    properties = props(PacketTypes.CONNECT, **connect_props) if client.version == codec.MQTT5 else None
    client.send(codec.Connect(client.version, client_id or f"raw-{uuid.uuid4().hex[:8]}", clean, 30, properties))
    return client.receive()


def expect_disconnect(client: RawClient, reason: int) -> codec.Disconnect:
    """The next packet is a DISCONNECT with ``reason`` (and no Session Expiry Interval, [MQTT-3.14.2-2]); then
    the broker closes the connection."""
    packet = client.receive()
    while isinstance(packet, codec.Ack):  # acknowledgements of what went before may come first
        packet = client.receive()
    assert isinstance(packet, codec.Disconnect), f"expected DISCONNECT {reason:#x}, got {packet!r}"
    assert packet.reason_code == reason, f"DISCONNECT {packet.reason_code:#x}, expected {reason:#x}"
    assert packet.prop("SessionExpiryInterval") is None
    with pytest.raises((ConnectionError, socket.timeout, TimeoutError)):
        client.receive(timeout=3.0)
    return packet


def wait_until(condition, timeout: float = 10.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def session_keys(cluster, client_id: str) -> list[str]:
    node = cluster.redis.get_node_from_key(cluster.key(client_id, "messages"))
    return sorted(k.decode() for k in cluster.redis.keys(f"{cluster.prefix}{{{client_id}}}_*", target_nodes=node))


# ------------------------------------------------------------------ session expiry (§3.1.2.11.2, §3.14.2.2.2)
def test_mqtt_3_14_2_2_2_disconnect_session_expiry_replaces_connects(brokers):
    """CONNECT with 1 s, DISCONNECT with 5 s: back after 3 s the session (and its backlog) is there."""
    cluster = brokers()
    sub = cluster.probe(version=5)
    sub.connect(clean=True, session_expiry=1)
    sub.subscribe(FILTER, 1)
    sub.client.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=5))
    sub._disconnected.wait(5)
    sub.client.loop_stop()
    sub.client = None
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"kept", 1)
    time.sleep(3.0)
    assert sub.connect(clean=False, session_expiry=1) is True
    assert payloads(sub.wait_for(1)) == [b"kept"]


def test_mqtt_3_14_2_2_2_disconnect_session_expiry_zero_ends_the_session(brokers):
    """CONNECT with 30 s, DISCONNECT with 0: the session ends with the connection (not 30 s later)."""
    cluster = brokers()
    sub = cluster.probe(version=5)
    sub.connect(clean=True, session_expiry=30)
    sub.subscribe(FILTER, 1)
    sub.client.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    sub._disconnected.wait(5)
    sub.client.loop_stop()
    sub.client = None
    assert wait_until(lambda: session_keys(cluster, sub.client_id) == [], 5), session_keys(cluster, sub.client_id)
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"nobody-home", 1)
    time.sleep(1.0)
    assert sub.connect(clean=False, session_expiry=30) is False
    assert sub.settle(0.7) == []


def test_mqtt_3_14_2_2_2_disconnect_nonzero_expiry_after_connect_zero_is_protocol_error(brokers):
    """CONNECT with Session Expiry 0, DISCONNECT with 10: not a valid DISCONNECT; the server answers
    DISCONNECT 0x82 and the session still ends at the close (CONNECT's 0).  Near miss: DISCONNECT with 0."""
    cluster = brokers()
    client_id = f"raw-{uuid.uuid4().hex[:8]}"
    bad = raw(cluster)
    assert raw_connect(bad, client_id, clean=True).reason_code == 0
    bad.send(codec.Disconnect(codec.RC_SUCCESS, props(PacketTypes.DISCONNECT, SessionExpiryInterval=10)))
    expect_disconnect(bad, codec.RC_PROTOCOL_ERROR)
    again = raw(cluster)
    ack = raw_connect(again, client_id, clean=False, SessionExpiryInterval=10)
    assert ack.reason_code == 0 and ack.session_present is False
    again.send(codec.Disconnect(codec.RC_SUCCESS, props(PacketTypes.DISCONNECT, SessionExpiryInterval=0)))
    with pytest.raises(ConnectionError):  # the near miss: a plain close, no DISCONNECT from the server
        again.receive(timeout=3.0)


@pytest.mark.parametrize("expiry, wait_s, present", [(0, 0.5, False), (5, 1.0, True), (1, 2.5, False)],
                         ids=["expiry-0", "expiry-5-back-in-1s", "expiry-1-back-in-2.5s"])
def test_mqtt_3_1_2_23_session_kept_only_while_expiry_positive(brokers, expiry, wait_s, present):
    """Clean start 1 with Session Expiry 0: the session ends at the close; > 0: it is kept for that long
    ([MQTT-3.1.2-23]), with its subscription and the messages stored meanwhile."""
    cluster = brokers()
    sub = cluster.probe(version=5)
    sub.connect(clean=True, session_expiry=expiry)
    sub.subscribe(FILTER, 1)
    sub.disconnect()
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"offline", 1)
    time.sleep(wait_s)
    assert sub.connect(clean=False, session_expiry=expiry) is present
    assert payloads(sub.settle(0.8)) == ([b"offline"] if present else [])


def test_mqtt_3_14_2_1_server_disconnect_reason_codes(brokers):
    """Every DISCONNECT the server sends uses a DISCONNECT reason code naming the cause, and none carries a
    Session Expiry Interval ([MQTT-3.14.2-2]): malformed 0x81, second CONNECT 0x82, topic alias 0x94,
    takeover 0x8E."""
    cluster = brokers()
    cases = [
        (bytes([0x32, 0x03, 0x00, 0x05, 0x61]), codec.RC_MALFORMED_PACKET),
        (codec.encode(codec.Connect(5, "again", True, 30, Properties(PacketTypes.CONNECT)), 5), codec.RC_PROTOCOL_ERROR),
        (codec.encode(codec.Publish("", b"x", 0, properties=props(PacketTypes.PUBLISH, TopicAlias=1)), 5),
         codec.RC_TOPIC_ALIAS_INVALID),
    ]
    for data, reason in cases:
        client = raw(cluster)
        assert raw_connect(client).reason_code == 0
        client.sock.sendall(data)
        expect_disconnect(client, reason)
    client_id = f"raw-{uuid.uuid4().hex[:8]}"
    first = raw(cluster)
    assert raw_connect(first, client_id).reason_code == 0
    second = raw(cluster)
    assert raw_connect(second, client_id).reason_code == 0
    expect_disconnect(first, codec.RC_SESSION_TAKEN_OVER)


# ------------------------------------------------------------------ No Local (§3.8.3.1)
@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
def test_mqtt_3_8_3_3_no_local(brokers, persistent):
    """A client subscribed with No Local = 1 does not get its own publishes ([MQTT-3.8.3-3]); it still gets
    everyone else's, and a second subscriber without No Local gets both (the near miss)."""
    cluster = brokers()
    me = cluster.probe(version=5)
    me.connect(clean=not persistent, session_expiry=600 if persistent else 0)
    me.subscribe(FILTER, 1, no_local=True)
    other_sub = cluster.probe(version=5)
    other_sub.connect(clean=True)
    other_sub.subscribe(FILTER, 1)
    other_pub = cluster.probe(version=5)
    other_pub.connect(clean=True)
    me.publish(TOPIC, b"mine", 1)
    other_pub.publish(TOPIC, b"theirs", 1)
    assert payloads(other_sub.wait_for(2)) == [b"mine", b"theirs"]
    assert payloads(me.settle(0.8)) == [b"theirs"]


# ------------------------------------------------------------------ Maximum Packet Size (§3.1.2.11.4, §3.2.2.3.6)
@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
def test_mqtt_3_1_2_24_server_never_sends_more_than_clients_maximum_packet_size(brokers, persistent):
    """A client that set Maximum Packet Size 64 never receives the 225-byte PUBLISH ([MQTT-3.1.2-24]); the
    broker discards it as if delivered ([MQTT-3.1.2-25]: nothing stays stored or in flight), and the small
    message after it (the near miss) is delivered."""
    cluster = brokers()
    sub = cluster.probe(version=5, maximum_packet_size=64)
    sub.connect(clean=not persistent, session_expiry=600 if persistent else 0)
    sub.subscribe(FILTER, 1)
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"L" * 200, 1)
    pub.publish(TOPIC, b"small", 1)
    assert payloads(sub.settle(1.0)) == [b"small"]
    if persistent:
        assert wait_until(lambda: cluster.stored_ids(sub.client_id) == [], 5), cluster.stored_ids(sub.client_id)
        sub.drop()
        sub.clear()
        assert sub.connect(clean=False, session_expiry=600) is True
        assert sub.settle(0.8) == []  # not resent after a reconnect: it counts as delivered


def test_mqtt_3_2_2_15_server_maximum_packet_size_declared_and_enforced(brokers):
    """CONNACK carries the server's Maximum Packet Size; a larger packet gets DISCONNECT 0x95 (§3.2.2.3.6),
    one of exactly that size is accepted (the near miss)."""
    cluster = brokers(max_packet_size=1024)
    client = raw(cluster)
    ack = raw_connect(client)
    assert getattr(ack.properties, "MaximumPacketSize", None) == 1024
    fits = codec.Publish(TOPIC, b"", 1, packet_id=1, properties=Properties(PacketTypes.PUBLISH))
    while len(codec.encode(fits, 5)) < 1024:  # (the remaining length's own size grows on the way)
        fits.payload += b"f"
    assert len(codec.encode(fits, 5)) == 1024
    client.send(fits)
    assert client.receive() == codec.Ack(codec.PUBACK, 1)
    client.send(codec.Publish(TOPIC, b"x" * 1100, 1, packet_id=2, properties=Properties(PacketTypes.PUBLISH)))
    expect_disconnect(client, codec.RC_PACKET_TOO_LARGE)


# ------------------------------------------------------------------ Receive Maximum (§3.1.2.11.3, §3.2.2.3.3, §4.9)
@pytest.mark.parametrize("persistent", [False, True], ids=["clean-start-expiry-0", "persistent"])
def test_mqtt_3_3_4_9_server_respects_clients_receive_maximum(brokers, persistent):
    """Receive Maximum 2: at most 2 unacknowledged QoS 1 PUBLISHes at once, for a clean-start session with
    expiry 0 as for a persistent one; each acknowledgement lets the next one go ([MQTT-3.3.4-9])."""
    cluster = brokers()
    sub = cluster.probe(version=5, auto_ack=False, receive_maximum=2)
    sub.connect(clean=not persistent, session_expiry=600 if persistent else 0)
    sub.subscribe(FILTER, 1)
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    for i in range(5):
        pub.publish(TOPIC, b"r%d" % i, 1)
    got = sub.settle(0.8)
    assert payloads(got) == [b"r0", b"r1"]
    sub.ack(got[0])
    got = sub.wait_for(3)
    assert payloads(sub.settle(0.8)) == [b"r0", b"r1", b"r2"]
    for delivery in got[1:]:
        sub.ack(delivery)
    assert payloads(sub.wait_for(5)) == [b"r%d" % i for i in range(5)]


def test_mqtt_3_2_2_3_3_server_receive_maximum_declared_and_enforced_0x93(brokers):
    """CONNACK declares the server's Receive Maximum (5 here); a client with 5 QoS 2 flows open (no PUBREL)
    may send no 6th: DISCONNECT 0x93.  Near miss: completing one flow (PUBREL/PUBCOMP) makes room for one."""
    cluster = brokers(receive_maximum=5)
    client = raw(cluster)
    ack = raw_connect(client)
    assert getattr(ack.properties, "ReceiveMaximum", None) == 5
    for pid in range(1, 6):
        client.send(codec.Publish(TOPIC, b"q2", 2, packet_id=pid, properties=Properties(PacketTypes.PUBLISH)))
    assert [client.receive() for _ in range(5)] == [codec.Ack(codec.PUBREC, pid) for pid in range(1, 6)]
    client.send(codec.Ack(codec.PUBREL, 1))
    assert client.receive() == codec.Ack(codec.PUBCOMP, 1)
    client.send(codec.Publish(TOPIC, b"q2", 2, packet_id=6, properties=Properties(PacketTypes.PUBLISH)))
    assert client.receive() == codec.Ack(codec.PUBREC, 6)
    client.send(codec.Publish(TOPIC, b"q2", 2, packet_id=7, properties=Properties(PacketTypes.PUBLISH)))
    expect_disconnect(client, codec.RC_RECEIVE_MAXIMUM_EXCEEDED)


# ------------------------------------------------------------------ what the broker does not do (§3.2.2.3)
def test_mqtt_3_2_2_3_connack_declares_what_the_broker_does_not_support(brokers):
    """Retain and shared subscriptions are declared available, topic aliases unavailable; wildcards, subscription
    identifiers and QoS 2 are supported, so neither Wildcard Subscription Available, Subscription Identifiers
    Available nor Maximum QoS is sent; Receive Maximum and Maximum Packet Size are the configured limits."""
    cluster = brokers()
    client = cluster.probe(version=5)
    client.connect(clean=True)
    p = client.connack_properties
    assert (p.RetainAvailable, p.SharedSubscriptionAvailable, p.TopicAliasMaximum) == (1, 1, 0)
    assert (p.ReceiveMaximum, p.MaximumPacketSize) == (100, 1048576)
    assert not any(hasattr(p, name) for name in ("WildcardSubscriptionAvailable", "MaximumQoS",
                                                 "SubscriptionIdentifierAvailable"))


def test_mqtt_3_2_2_14_publish_with_retain_accepted_when_available(brokers):
    """Retain Available = 1: PUBLISH with RETAIN = 1 (MQTT 5 and 3.1.1) is acknowledged, not refused with 0x9A,
    and a later subscriber gets it retained (tests/integration/test_broker_will_retained.py has the rest)."""
    cluster = brokers()
    for version in (codec.MQTT5, codec.MQTT311):
        client = raw(cluster, version=version)
        assert raw_connect(client).reason_code == 0
        properties = Properties(PacketTypes.PUBLISH) if version == codec.MQTT5 else None
        client.send(codec.Publish(TOPIC, b"keep-me-%d" % version, 1, retain=True, packet_id=1, properties=properties))
        assert client.receive() == codec.Ack(codec.PUBACK, 1)
        late = cluster.probe(version=4)
        late.connect(clean=True)
        late.subscribe(FILTER, 1)
        [got] = late.wait_for(1)
        assert (got.payload, got.retain) == (b"keep-me-%d" % version, True)


def test_mqtt_3_2_2_13_will_retain_accepted_when_available(brokers):
    """Retain Available = 1: a CONNECT whose Will has Will Retain = 1 is accepted (CONNACK 0)."""
    cluster = brokers()
    client = raw(cluster)
    client.send(codec.Connect(5, f"will-{uuid.uuid4().hex[:6]}", True, 30, Properties(PacketTypes.CONNECT),
                              will_topic="wills/x", will_payload=b"bye", will_qos=1, will_retain=True))
    ack = client.receive()
    assert isinstance(ack, codec.ConnAck) and ack.reason_code == codec.RC_SUCCESS
    client.send(codec.Disconnect())
    client.close()


@pytest.mark.parametrize("connect_props, zeroed, reason", [
    ({"AuthenticationMethod": "SCRAM-SHA-1"}, None, codec.RC_BAD_AUTHENTICATION_METHOD),
    ({"ReceiveMaximum": 1}, b"\x21\x00\x01", codec.RC_PROTOCOL_ERROR),
    ({"MaximumPacketSize": 1}, b"\x27\x00\x00\x00\x01", codec.RC_PROTOCOL_ERROR),
    ({"ReceiveMaximum": 1, "MaximumPacketSize": 128}, None, codec.RC_SUCCESS),
], ids=["enhanced-auth-0x8c", "receive-maximum-0", "maximum-packet-size-0", "near-miss-1-and-128"])
def test_mqtt_3_1_2_11_connect_properties_the_broker_refuses(brokers, connect_props, zeroed, reason):
    """No enhanced authentication (§4.12): CONNACK 0x8C; Receive Maximum 0 or Maximum Packet Size 0 are
    protocol errors (§3.1.2.11.3, §3.1.2.11.4): CONNACK 0x82; then the connection is closed.  (paho will not
    encode a 0, so the test writes the property's bytes itself.)"""
    cluster = brokers()
    client = raw(cluster)
    data = codec.encode(codec.Connect(5, f"p-{uuid.uuid4().hex[:6]}", True, 30,
                                      props(PacketTypes.CONNECT, **connect_props)), 5)
    if zeroed is not None:
        assert zeroed in data
        data = data.replace(zeroed, zeroed[:1] + bytes(len(zeroed) - 1))
    client.sock.sendall(data)
    ack = client.receive()
    assert isinstance(ack, codec.ConnAck) and ack.reason_code == reason
    if reason:
        with pytest.raises(ConnectionError):
            client.receive(timeout=3.0)
    client.close()


def test_mqtt_3_3_4_6_publish_from_client_with_subscription_identifier_is_protocol_error(brokers):
    cluster = brokers()
    client = raw(cluster)
    assert raw_connect(client).reason_code == 0
    client.send(codec.Publish(TOPIC, b"x", 1, packet_id=1,
                              properties=props(PacketTypes.PUBLISH, SubscriptionIdentifier=7)))
    expect_disconnect(client, codec.RC_PROTOCOL_ERROR)


def test_mqtt_3_8_2_1_2_subscription_identifier_given_twice_is_a_protocol_error(brokers):
    """A SUBSCRIBE with one Subscription Identifier gets SUBACK (the near miss); one with two is a Protocol
    Error, DISCONNECT 0x82 (§3.8.2.1.2).  (0 is refused the same way: paho will not encode it.)"""
    cluster = brokers()
    client = raw(cluster)
    assert raw_connect(client).reason_code == 0
    client.send(codec.Subscribe(1, [(FILTER, 1)], props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=3)))
    assert client.receive().reason_codes == [1]
    twice = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=3)
    twice.SubscriptionIdentifier = 4  # paho appends: the property appears twice on the wire
    client.send(codec.Subscribe(2, [(FILTER, 1)], twice))
    expect_disconnect(client, codec.RC_PROTOCOL_ERROR)


def test_mqtt_3_2_2_3_13_shared_subscription_available_device_refused_0x9e(brokers):
    """Shared Subscription Available = 1, for persistent APPLICATION clients only: a DEVICE client's MQTT 5
    SUBSCRIBE to $share/... gets SUBACK 0x9E for that filter and stays connected; MQTT 3.1.1 gets SUBACK 0x80
    (tests/integration/test_broker_shared.py has the APPLICATION side)."""
    cluster = brokers()
    client = raw(cluster)
    assert raw_connect(client).reason_code == 0
    client.send(codec.Subscribe(1, [("$share/g/" + FILTER, 1), (FILTER, 1)], Properties(PacketTypes.SUBSCRIBE)))
    assert client.receive().reason_codes == [codec.RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, 1]
    client.send(codec.Simple(codec.PINGREQ))
    assert client.receive() == codec.Simple(codec.PINGRESP)   # not disconnected
    old = raw(cluster, version=codec.MQTT311)
    assert raw_connect(old).reason_code == 0
    old.send(codec.Subscribe(1, [("$share/g/" + FILTER, 1), (FILTER, 1)]))
    assert old.receive().reason_codes == [0x80, 1]


def test_mqtt_2_2_2_1_property_length_not_matching_the_properties_is_malformed(brokers):
    """A CONNECT whose property length says 1 but holds a 3-byte property (Receive Maximum) is not accepted;
    a PUBLISH whose property length runs past its property gets DISCONNECT 0x81.  The well-formed twins are
    accepted."""
    cluster = brokers()
    body = codec.encode(codec.Connect(5, "prop-len", True, 30, props(PacketTypes.CONNECT, ReceiveMaximum=10)), 5)
    # fixed header (2 bytes), "MQTT" (6), level, flags, keep-alive (4): the property length is byte 12
    assert body[12] == 3
    bad = bytearray(body)
    bad[12] = 1
    client = raw(cluster)
    client.sock.sendall(bytes(bad))
    with pytest.raises((ConnectionError, socket.timeout)):
        packet = client.receive(timeout=3.0)
        assert isinstance(packet, codec.ConnAck) and packet.reason_code >= 0x80  # never a success
        raise ConnectionError
    good = raw(cluster)
    good.sock.sendall(body)
    assert good.receive().reason_code == 0
    publish = bytearray(codec.encode(codec.Publish("t/1", b"", 0, properties=props(
        PacketTypes.PUBLISH, MessageExpiryInterval=60)), 5))
    assert publish[7] == 5  # property length after fixed header (2), topic (5)
    publish[7] = 3
    good.sock.sendall(bytes(publish))
    expect_disconnect(good, codec.RC_MALFORMED_PACKET)


# ------------------------------------------------------------------ limits under abuse
def test_topic_longer_than_max_topic_length_is_refused(brokers):
    """Topics and filters are capped at max_topic_length bytes: a longer PUBLISH topic gets DISCONNECT 0x90,
    a longer filter SUBACK 0x8F; exactly max_topic_length is accepted (the near miss)."""
    cluster = brokers(max_topic_length=32)
    client = raw(cluster)
    assert raw_connect(client).reason_code == 0
    client.send(codec.Subscribe(1, [("a" * 32, 1), ("b" * 33, 1)], Properties(PacketTypes.SUBSCRIBE)))
    assert client.receive().reason_codes == [1, codec.RC_TOPIC_FILTER_INVALID]
    client.send(codec.Publish("a" * 32, b"ok", 1, packet_id=1, properties=Properties(PacketTypes.PUBLISH)))
    assert client.receive() == codec.Ack(codec.PUBACK, 1)
    client.send(codec.Publish("a" * 33, b"no", 1, packet_id=2, properties=Properties(PacketTypes.PUBLISH)))
    expect_disconnect(client, codec.RC_TOPIC_NAME_INVALID)


# ------------------------------------------------------------------ discarded session
def produce_persisted(cluster, client_id: str, message: dict) -> None:
    """Write one record to the persisted topic as the fan-out would (a message still in the pipeline)."""
    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.topology.kafka_bootstrap())
        await producer.start()
        try:
            await producer.send_and_wait(cluster.settings["persisted_topic"], json.dumps(message).encode(),
                                         key=client_id.encode())
        finally:
            await producer.stop()

    asyncio.run(send())


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_3_1_2_4_discarded_session_state_is_not_reused(brokers, version):
    """A persistent session goes offline with messages for it still in the pipeline; the client comes back
    with a clean start, leaves, and comes back persistent (clean start 0).  The messages of the discarded
    session must not be saved into a new queue and must not reach the new session -- before its SUBACK or
    ever ([MQTT-3.1.2-4]; the defect pinned: they were saved after the clean start's cleanup and delivered to the
    next clean-start-0 session).  The late record is written to the persisted topic by the test (deterministic),
    and a burst published just before the clean start races it the natural way."""
    cluster = brokers()
    client_id = f"disc-{uuid.uuid4().hex[:6]}"
    sub = cluster.probe(client_id, version=version)
    sub.connect(clean=False, session_expiry=600 if version == 5 else None)
    sub.subscribe(FILTER, 1)
    old_gen = (cluster.redis.hget(cluster.key(client_id, "session"), "gen") or b"").decode()
    sub.disconnect()
    pub = cluster.probe(version=version)
    pub.connect(clean=True)
    for i in range(20):
        pub.publish(TOPIC, b"burst-%02d" % i, 1, timeout=0)
    assert sub.connect(clean=True) is False  # the persistent session is discarded
    produce_persisted(cluster, client_id, {
        "topic": TOPIC, "qos": 1, "payload": "bGF0ZQ==", "retain": False, "props": "", "time": 0,
        "expiresAt": None, "expiryInterval": None, "publisher": "x", "gen": old_gen})
    time.sleep(2.0)  # the pipeline (fan-out, persist) drains meanwhile
    assert cluster.stored_ids(client_id) == []
    assert sub.settle(0.5) == []
    sub.disconnect()
    assert sub.connect(clean=False, session_expiry=600 if version == 5 else None) is False
    assert sub.settle(1.0) == []  # nothing before (or without) a SUBSCRIBE
    assert cluster.stored_ids(client_id) == []
