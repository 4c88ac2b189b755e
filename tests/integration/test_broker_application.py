"""The reference broker's APPLICATION clients end to end: real broker nodes on the shared topology (Redis Cluster,
Tansu), real paho clients of both MQTT versions.

A client the broker's ``application_clients`` rules name is an APPLICATION client (TBMQ's client type); with a
persistent session its messages go to a Kafka topic of its own (``tbmq.msg.app.<client id>``), read from the
committed offset when it connects, the offset committed only after its PUBACKs (docs/reference-broker.md
"APPLICATION clients")."""

from __future__ import annotations

import time
import uuid

import pytest
import test_broker_flow
from aiokafka import AIOKafkaConsumer, TopicPartition

from reference_broker.application import app_consumer_group, app_topic

pytestmark = pytest.mark.integration

brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests
TOPIC, FILTER = test_broker_flow.TOPIC, test_broker_flow.FILTER
APP_RULES = [{"client_id": "app*"}]


def app_id() -> str:
    return f"app{uuid.uuid4().hex[:10]}"   # alphanumeric: the topic is tbmq.msg.app.<id>


def connect_app(cluster, client_id: str, version: int, clean: bool, node: int = 0, **kwargs):
    """A persistent session (MQTT 5: session expiry 3600 s; MQTT 3.1.1: CleanSession = 0 also for the first
    connection); ``clean`` = clean start, which for MQTT 3.1.1 means a non-persistent session."""
    sub = cluster.probe(client_id, node=node, version=version, **kwargs)
    sub.connect(clean=clean if version == 5 else False, session_expiry=3600 if version == 5 else None)
    return sub


def publish_many(cluster, count: int, prefix: bytes = b"m", node: int = 0) -> None:
    """``count`` QoS 1 messages, pipelined (an MQTT 3.1.1 publisher: no Receive Maximum to respect), all
    acknowledged by the broker before this returns."""
    pub = cluster.probe(version=4, node=node)
    pub.connect(clean=True)
    infos = [pub.publish(TOPIC, b"%s%05d" % (prefix, i), 1, timeout=0) for i in range(count)]
    deadline = time.monotonic() + 60
    for info in infos:
        info.wait_for_publish(max(0.1, deadline - time.monotonic()))
        assert info.is_published(), "a publish was not acknowledged"
    pub.disconnect()


def committed_offset(cluster, client_id: str) -> int | None:
    import asyncio

    async def read() -> int | None:
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.topology.kafka_bootstrap(),
                                    group_id=app_consumer_group(client_id), enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(app_topic(client_id), 0)
            consumer.assign([tp])
            return await consumer.committed(tp)
        finally:
            await consumer.stop()

    return asyncio.run(read())


@pytest.mark.parametrize("version", [4, 5])
def test_offline_application_client_gets_its_whole_backlog_in_order(brokers, version):
    cluster = brokers(application_clients=APP_RULES)
    client_id = app_id()
    sub = connect_app(cluster, client_id, version, clean=True)
    if version == 5:  # the CONNACK names the client type
        assert ("client_type", "APPLICATION") in sub.connack_properties.UserProperty
    sub.subscribe(FILTER, 1)
    sub.disconnect()
    assert cluster.stored_ids(client_id) == []
    count = 2000
    publish_many(cluster, count)
    # nothing in Redis: the messages wait in the client's own topic
    assert cluster.stored_ids(client_id) == [] and not cluster.payload_keys(client_id)
    sub.clear()
    assert test_broker_flow.reconnect(sub) is True
    got = sub.wait_for(count, timeout=60)
    assert [d.payload for d in got] == [b"m%05d" % i for i in range(count)], f"{len(got)} of {count}"
    assert not any(d.dup for d in got)
    assert len({d.packet_id for d in got}) == count
    sub.settle(0.5)
    deadline = time.monotonic() + 10
    while committed_offset(cluster, client_id) != count and time.monotonic() < deadline:
        time.sleep(0.3)
    assert committed_offset(cluster, client_id) == count   # every PUBACK committed, nothing past them
    assert "giving up" not in cluster.log(0)


@pytest.mark.parametrize("version", [4, 5])
def test_unacknowledged_messages_come_again_with_dup_and_the_same_packet_ids(brokers, version):
    cluster = brokers(application_clients=APP_RULES)
    client_id = app_id()
    sub = connect_app(cluster, client_id, version, clean=True, auto_ack=False)
    sub.subscribe(FILTER, 1)
    publish_many(cluster, 30)
    first = sub.wait_for(30)
    assert [d.payload for d in first] == [b"m%05d" % i for i in range(30)]
    assert not any(d.dup for d in first)
    for delivery in first[:10]:   # a contiguous prefix acknowledged, the rest left open
        sub.ack(delivery)
    sub.ack(first[20])            # acknowledged, but after a gap: its offset cannot be committed yet
    time.sleep(1.0)
    sub.drop()
    assert committed_offset(cluster, client_id) == 10
    sub.clear()
    sub.auto_ack = True
    assert test_broker_flow.reconnect(sub) is True
    again = sub.wait_for(20)
    assert [d.payload for d in again] == [b"m%05d" % i for i in range(10, 30)]
    assert all(d.dup for d in again), "a resend after the reconnect carries DUP = 1"
    assert [d.packet_id for d in again] == [d.packet_id for d in first[10:]]
    publish_many(cluster, 3, prefix=b"n")
    fresh = sub.wait_for(23)[20:]
    assert [d.payload for d in fresh] == [b"n00000", b"n00001", b"n00002"]
    assert not any(d.dup for d in fresh)


@pytest.mark.parametrize("version", [4, 5])
def test_what_the_client_acknowledged_right_before_a_normal_disconnect_is_committed(brokers, version):
    """The PUBACKs of a whole pack and the DISCONNECT at once: the ending connection commits them before it
    releases the session, so the resumed session gets none of them again (docs/findings.md, "an APPLICATION
    client's last acknowledged pack read again")."""
    cluster = brokers(application_clients=APP_RULES)
    client_id = app_id()
    sub = connect_app(cluster, client_id, version, clean=True, auto_ack=False)
    sub.subscribe(FILTER, 1)
    publish_many(cluster, 30)
    first = sub.wait_for(30)
    for delivery in first:
        sub.ack(delivery)
    sub.disconnect()
    deadline = time.monotonic() + 5
    while committed_offset(cluster, client_id) != 30 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert committed_offset(cluster, client_id) == 30
    sub.clear()
    sub.auto_ack = True
    assert test_broker_flow.reconnect(sub) is True
    publish_many(cluster, 3, prefix=b"n")
    assert [d.payload for d in sub.settle(1.0)] == [b"n00000", b"n00001", b"n00002"]


def test_node_kill_loses_nothing_acknowledged(brokers):
    """The client's node is killed with part of its backlog delivered and not acknowledged; the client moves to
    the other node: everything the publisher had acknowledged arrives, what was delivered before comes with DUP = 1
    and its packet id.  (Records the killed node had fanned out but not committed are fanned out again by the
    survivor: duplicates under new offsets, which QoS 1 allows.)"""
    cluster = brokers(2, application_clients=APP_RULES)
    client_id = app_id()
    sub = connect_app(cluster, client_id, 5, clean=True, node=0, auto_ack=False)
    sub.subscribe(FILTER, 1)
    sub.disconnect()
    publish_many(cluster, 300, prefix=b"k", node=1)
    sub.clear()
    assert test_broker_flow.reconnect(sub) is True
    first = sub.wait_for(200, timeout=30)   # one pack (application_poll_max_records): the next waits for its acks
    assert len(first) == 200
    for delivery in first[:100]:
        sub.ack(delivery)
    time.sleep(0.5)
    cluster.nodes[0].kill()
    sub.drop()
    sub2 = cluster.probe(client_id, node=1, version=5)
    assert sub2.connect(clean=False, session_expiry=3600) is True
    sub2.wait_for(200, timeout=30)
    sub2.settle(1.0)
    later = list(sub2.deliveries)
    seen = [d.payload for d in first[:100]] + [d.payload for d in later]
    expected = [b"k%05d" % i for i in range(300)]
    assert set(expected) <= set(seen), f"lost: {sorted(set(expected) - set(seen))[:5]}"
    firsts = list(dict.fromkeys(seen))
    assert [p for p in firsts if p in set(expected)] == expected          # in order, counting first copies
    pids = {d.payload: d.packet_id for d in first}
    resent = [d for d in later if d.payload in pids and d.payload not in {x.payload for x in first[:100]}]
    assert resent and all(d.dup and d.packet_id == pids[d.payload] for d in resent[:200])


def test_device_and_application_clients_side_by_side(brokers):
    """A DEVICE client is untouched: its backlog is in Redis; the APPLICATION client's is not."""
    cluster = brokers(application_clients=APP_RULES)
    device_id, application_id = f"dev-{uuid.uuid4().hex[:8]}", app_id()
    device = connect_app(cluster, device_id, 5, clean=True)
    application = connect_app(cluster, application_id, 5, clean=True)
    assert ("client_type", "DEVICE") in device.connack_properties.UserProperty
    for probe in (device, application):
        probe.subscribe(FILTER, 1)
        probe.disconnect()
    publish_many(cluster, 20)
    assert len(cluster.wait_stored(device_id, 20)) == 20
    assert cluster.stored_ids(application_id) == []
    for probe in (device, application):
        probe.clear()
        assert test_broker_flow.reconnect(probe) is True
        assert [d.payload for d in probe.wait_for(20)] == [b"m%05d" % i for i in range(20)]


def test_clean_start_discards_the_application_backlog(brokers):
    cluster = brokers(application_clients=APP_RULES)
    client_id = app_id()
    sub = connect_app(cluster, client_id, 4, clean=False)
    sub.subscribe(FILTER, 1)
    sub.disconnect()
    publish_many(cluster, 5)
    sub.clear()
    assert test_broker_flow.reconnect(sub, clean=True) is False
    assert sub.settle(1.0) == []


def test_skip_strategy_gives_up_loudly_after_the_pack_timeout(brokers):
    cluster = brokers(application_clients=APP_RULES, application_ack_strategy="skip",
                      application_pack_timeout_s=1.0)
    client_id = app_id()
    sub = connect_app(cluster, client_id, 5, clean=True, auto_ack=False)
    sub.subscribe(FILTER, 1)
    publish_many(cluster, 5)
    assert len(sub.wait_for(5)) == 5
    deadline = time.monotonic() + 10
    while "giving up on 5 unacknowledged" not in cluster.log(0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "ERROR" in cluster.log(0) and "giving up on 5 unacknowledged" in cluster.log(0)
    assert committed_offset(cluster, client_id) == 5   # skip: committed over them, as configured


def test_retry_strategy_waits_up_to_its_cap_then_gives_up_loudly(brokers):
    retry = brokers(application_clients=APP_RULES, application_ack_strategy="retry", application_retries=2,
                    application_pack_timeout_s=0.5)
    client_id = app_id()
    sub = connect_app(retry, client_id, 5, clean=True, auto_ack=False)
    sub.subscribe(FILTER, 1)
    publish_many(retry, 5)
    assert len(sub.wait_for(5)) == 5
    deadline = time.monotonic() + 10
    while "giving up" not in retry.log(0) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = retry.log(0)
    assert "retry 1 of 2" in log and "retry 2 of 2" in log and "retry 3 of" not in log   # the cap holds
    assert "giving up on 5 unacknowledged" in log and "after 2 retries" in log


@pytest.mark.parametrize("version", [4, 5])
def test_qos2_pubrel_resent_on_the_resumed_session_and_the_offset_waits_for_pubcomp(brokers, version):
    """A QoS 2 message the client answered with PUBREC, its PUBREL left unanswered, then a drop and a resume on
    another node: the PUBREL comes again (not the PUBLISH, [MQTT-4.4.0-1]); its offset is committed only after the
    PUBCOMP."""
    cluster = brokers(2, application_clients=APP_RULES)
    client_id = app_id()
    sub = connect_app(cluster, client_id, version, clean=True)
    sub.subscribe(FILTER, 2)
    sub.hold(True)
    pub = cluster.probe(version=version, node=1)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"flow", 2)
    deadline = time.monotonic() + 10
    while not sub.pubrels and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [d.payload for d in sub.qos2_received] == [b"flow"] and sub.pubrels and not sub.deliveries
    time.sleep(0.5)
    assert committed_offset(cluster, client_id) == 0      # PUBREC is not the end of the flow
    sub.drop()
    sub.clear()
    sub.hold(False)
    sub2 = cluster.probe(client_id, node=1, version=version)
    sub2.dropped = sub.dropped   # the same client: it still holds the message it answered with PUBREC
    assert sub2.connect(clean=False, session_expiry=3600 if version == 5 else None) is True
    time.sleep(1.5)
    assert [known for _, known in sub2.pubrels] == [True]
    assert [d.payload for d in sub2.deliveries] == [b"flow"] and sub2.qos2_received == []
    assert committed_offset(cluster, client_id) == 1
