"""Shared subscriptions of persistent APPLICATION clients end to end: real broker nodes on the shared topology
(Redis Cluster, Tansu), real paho clients.

A group ``$share/{ShareName}/{filter}`` reads the filter's Kafka topic (``tbmq.msg.app.shared.<filter>``) from one
committed offset and gives each message to one connected member; a member that goes away hands its unacknowledged
messages to another member (docs/reference-broker.md "Shared subscriptions")."""

from __future__ import annotations

import asyncio
import time

import pytest
import test_broker_application
import test_broker_flow
from aiokafka import AIOKafkaConsumer, TopicPartition
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from reference_broker import codec
from reference_broker.shared_subs import parse_shared, shared_consumer_group, shared_topic

pytestmark = pytest.mark.integration

brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests
FILTER = test_broker_flow.FILTER
APP_RULES = test_broker_application.APP_RULES
app_id, connect_app = test_broker_application.app_id, test_broker_application.connect_app


def topic_and_filter() -> tuple[str, str]:
    """A filter of its own per test: the shared topic is named after the filter, and outlives a test's broker."""
    level = app_id()
    return f"shared/{level}/1/0", f"shared/{level}/1/+"


def members(cluster, share: str, count: int, **kwargs):
    subs = []
    for _ in range(count):
        sub = connect_app(cluster, app_id(), 5, clean=True, **kwargs)
        assert sub.subscribe(share, 1) == [1]
        subs.append(sub)
    return subs


def plain_subscriber(cluster, topic_filter: str):
    """A DEVICE client on the plain filter: not a member, so it gets every message itself."""
    sub = cluster.probe(version=5)
    sub.connect(clean=True)
    assert sub.subscribe(topic_filter, 1) == [1]
    return sub


def publish_many(cluster, topic: str, count: int) -> list[bytes]:
    """``count`` QoS 1 messages, pipelined, all acknowledged by the broker before this returns."""
    pub = cluster.probe(version=4)
    pub.connect(clean=True)
    payloads = [b"m%05d" % i for i in range(count)]
    infos = [pub.publish(topic, payload, 1, timeout=0) for payload in payloads]
    deadline = time.monotonic() + 60
    for info in infos:
        info.wait_for_publish(max(0.1, deadline - time.monotonic()))
        assert info.is_published(), "a publish was not acknowledged"
    pub.disconnect()
    return payloads


def wait_union(subs, count: int, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [d for s in subs for d in s.deliveries]
        if len({d.payload for d in got}) >= count:
            break
        time.sleep(0.1)
    for sub in subs:
        sub.settle(0.5)
    return [d for s in subs for d in s.deliveries]


def committed(cluster, share: str) -> int | None:
    shared = parse_shared(share)

    async def read() -> int | None:
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.topology.kafka_bootstrap(),
                                    group_id=shared_consumer_group(shared), enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(shared_topic(shared.topic_filter), 0)
            consumer.assign([tp])
            return await consumer.committed(tp)
        finally:
            await consumer.stop()

    return asyncio.run(read())


def test_three_members_get_every_message_exactly_once_and_a_plain_subscriber_all(brokers):
    cluster = brokers(application_clients=APP_RULES)
    topic, topic_filter = topic_and_filter()
    share = f"$share/g{app_id()}/{topic_filter}"
    group = members(cluster, share, 3)
    plain = plain_subscriber(cluster, topic_filter)
    start = committed(cluster, share)
    count = 90
    expected = publish_many(cluster, topic, count)
    got = wait_union(group, count)
    assert sorted(d.payload for d in got) == expected, "every message exactly once across the members"
    assert all(len(s.deliveries) > 0 for s in group), [len(s.deliveries) for s in group]
    assert not any(d.dup for d in got)
    for sub in group:  # one member's share in publish order
        assert [d.payload for d in sub.deliveries] == sorted(d.payload for d in sub.deliveries)
    assert sorted(d.payload for d in plain.wait_for(count)) == expected
    deadline = time.monotonic() + 10
    while committed(cluster, share) != (start or 0) + count and time.monotonic() < deadline:
        time.sleep(0.3)
    assert committed(cluster, share) == (start or 0) + count   # the acked prefix of the group's one offset


def test_a_killed_member_s_unacknowledged_messages_go_to_another_member(brokers):
    cluster = brokers(application_clients=APP_RULES)
    topic, topic_filter = topic_and_filter()
    share = f"$share/g{app_id()}/{topic_filter}"
    victim = members(cluster, share, 1, auto_ack=False)[0]
    survivors = members(cluster, share, 2)
    plain = plain_subscriber(cluster, topic_filter)
    count = 60
    expected = publish_many(cluster, topic, count)
    wait_union([victim, *survivors], count)
    held = {d.payload for d in victim.deliveries}
    assert held, "the victim got its share (round-robin)"
    victim.drop()   # socket closed without DISCONNECT, nothing acknowledged
    got = wait_union(survivors, count)
    assert sorted({d.payload for d in got}) == expected, "every acknowledged message reaches the group"
    resent = [d for d in got if d.payload in held]
    assert {d.payload for d in resent} == held and all(d.dup for d in resent), "resent to another member, DUP = 1"
    assert sorted(d.payload for d in plain.wait_for(count)) == expected   # the plain subscription is independent


def raw_app(cluster, version: int):
    """A persistent APPLICATION session on a hand-driven client (paho refuses some of the bad filters itself)."""
    target = cluster.nodes[0]
    client = test_broker_flow.RawClient(target.host, target.port, version)
    properties = None
    if version == codec.MQTT5:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
    client.send(codec.Connect(version, app_id(), version == codec.MQTT5, 30, properties))
    assert client.receive().reason_code == 0
    return client


def suback(client, filters: list[tuple[str, int]]) -> list[int]:
    properties = Properties(PacketTypes.SUBSCRIBE) if client.version == codec.MQTT5 else None
    client.send(codec.Subscribe(1, filters, properties))
    return client.receive().reason_codes


def test_shared_subscriptions_refused_for_device_clients_and_bad_share_names(brokers):
    cluster = brokers(application_clients=APP_RULES)
    device = cluster.probe(version=5)
    device.connect(clean=True)
    assert device.subscribe(f"$share/g/{FILTER}", 1) == [codec.RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED]
    old_device = cluster.probe(version=4)
    old_device.connect(clean=False)
    assert old_device.subscribe(f"$share/g/{FILTER}", 1) == [0x80]
    bad = ["$share//a", "$share/g+/a", "$share/#/a", "$share/g", "$share/g/", "$share/g/a/#/b"]
    app = raw_app(cluster, codec.MQTT5)
    assert suback(app, [(f, 1) for f in bad] + [(f"$share/g/{FILTER}", 2)]) == \
        [codec.RC_TOPIC_FILTER_INVALID] * len(bad) + [1]   # a good one beside them, granted at most QoS 1
    old_app = raw_app(cluster, codec.MQTT311)
    assert suback(old_app, [(f, 1) for f in bad] + [(f"$share/g/{FILTER}", 1)]) == [0x80] * len(bad) + [1]


def test_the_group_keeps_its_messages_while_every_member_is_away(brokers):
    """Persistent members: the group's backlog waits in its topic and goes to the first member back, resumed."""
    cluster = brokers(application_clients=APP_RULES)
    topic, topic_filter = topic_and_filter()
    share = f"$share/g{app_id()}/{topic_filter}"
    group = members(cluster, share, 2)
    for sub in group:
        sub.disconnect()
    expected = publish_many(cluster, topic, 40)
    back = group[0]
    back.clear()
    assert test_broker_flow.reconnect(back) is True   # session present: its shared subscription with it
    got = back.wait_for(40, timeout=30)
    assert [d.payload for d in got] == expected
