"""The reference broker's Will Messages and retained messages, end to end: real broker processes on the shared
topology (Redis Cluster, Tansu), real paho clients of both MQTT versions.

Wills: published when the network connection ends without a normal DISCONNECT (keep-alive timeout, socket
closed, MQTT 5 DISCONNECT 0x04, a node kill -- also when the client reconnects to another node before the kill
is noticed), never after a normal one; the MQTT 5 Will Delay Interval holds it back and a reconnect to the
session cancels it.  Retained messages: stored in Redis, delivered to new subscriptions with
RETAIN = 1, replaced, deleted by an empty payload, kept across a broker node kill; MQTT 5 Retain Handling."""

from __future__ import annotations

import time
import uuid

import paho.mqtt.client as mqtt
import pytest
import test_broker_flow
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

pytestmark = pytest.mark.integration

brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests


class WillClient:
    """A paho client with a Will, which a test ends in one of the ways that do or do not publish it."""

    def __init__(self, cluster, version: int, topic: str, payload: bytes, *, node: int = 0, keepalive: int = 30,
                 qos: int = 1, retain: bool = False, will_properties: Properties | None = None,
                 client_id: str | None = None) -> None:
        self.target = cluster.nodes[node]
        self.version = version
        self.client_id = client_id or f"will-{uuid.uuid4().hex[:8]}"
        self.keepalive = keepalive
        self.will = (topic, payload, qos, retain, will_properties)
        self.client: mqtt.Client | None = None

    def connect(self, clean: bool = True, session_expiry: int | None = None) -> bool:
        v5 = self.version == 5
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, clean_session=None if v5 else clean)
        topic, payload, qos, retain, will_properties = self.will
        client.will_set(topic, payload, qos, retain, properties=will_properties if v5 else None)
        connected: dict = {}
        client.on_connect = lambda c, u, flags, rc, p=None: connected.update(rc=rc, present=flags.session_present)
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                props.SessionExpiryInterval = session_expiry
            client.connect(self.target.host, self.target.port, keepalive=self.keepalive, clean_start=clean,
                           properties=props)
        else:
            client.connect(self.target.host, self.target.port, keepalive=self.keepalive)
        client.loop_start()
        deadline = time.monotonic() + 10
        while "rc" not in connected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert connected.get("rc") == 0, f"{self.client_id}: CONNACK {connected}"
        self.client = client
        return bool(connected["present"])

    def go_silent(self) -> None:
        """Stop the network loop: the socket stays open, no PINGREQ goes out (a hung device)."""
        self.client.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT (a crashed device)."""
        sock = self.client.socket()
        self.client.loop_stop()
        if sock is not None:
            sock.close()

    def disconnect(self, reason: int | None = None) -> None:
        if reason is None:
            self.client.disconnect()
        else:
            self.client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=reason))
        time.sleep(0.2)
        self.client.loop_stop()

    def close(self) -> None:
        if self.client is not None:
            self.client.loop_stop()
            sock = self.client.socket()
            if sock is not None:
                sock.close()


@pytest.fixture
def will_clients():
    made: list[WillClient] = []

    def make(*args, **kwargs) -> WillClient:
        client = WillClient(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def subscriber(cluster, topic_filter: str, version: int = 5, node: int = 0, qos: int = 1, retain_handling: int = 0):
    sub = cluster.probe(version=version, node=node)
    sub.connect(clean=True)
    if retain_handling:
        done = []
        sub.client.on_subscribe = lambda *a, **k: done.append(1)
        sub.client.subscribe(topic_filter, options=mqtt.SubscribeOptions(qos=qos, retainHandling=retain_handling))
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            time.sleep(0.02)
        assert done, "no SUBACK"
    else:
        sub.subscribe(topic_filter, qos)
    return sub


def retained(sub, count: int = 1, timeout: float = 5.0, quiet: float = 0.0) -> list:
    """The deliveries with RETAIN = 1 once ``count`` arrived (then ``quiet`` s more).  A message published just
    before a SUBSCRIBE may also arrive as an ordinary forward (RETAIN 0): MQTT allows both copies."""
    deadline = time.monotonic() + timeout
    while len([d for d in sub.deliveries if d.retain]) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(quiet)
    return [d for d in sub.deliveries if d.retain]


def will_topic() -> str:
    return f"wills/{uuid.uuid4().hex[:8]}"


def dropped_with_delayed_will(will_clients, cluster, topic: str, payload: bytes, delay_s: int):
    """An MQTT 5 client with a Will of ``delay_s`` Will Delay, on a session of 60 s expiry, connected (clean start)
    and dropped without DISCONNECT: (the monotonic time of the drop, a function making the same client again)."""
    props = Properties(PacketTypes.WILLMESSAGE)
    props.WillDelayInterval = delay_s
    device = will_clients(cluster, 5, topic, payload, will_properties=props)
    device.connect(clean=True, session_expiry=60)
    device.drop()
    dropped = time.monotonic()
    return dropped, lambda: will_clients(cluster, 5, topic, payload, will_properties=props, client_id=device.client_id)


# ------------------------------------------------------------------ Will Messages
@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_3_1_2_22_will_published_after_keep_alive_timeout(brokers, will_clients, version):
    """Keep-alive 1 s, then silence (socket open, no PINGREQ): after 1.5 s the broker closes the connection and
    publishes the Will ([MQTT-3.1.2-22], [MQTT-3.1.2-8])."""
    cluster = brokers()
    topic = will_topic()
    sub = subscriber(cluster, topic, version)
    device = will_clients(cluster, version, topic, b"gone-silent", keepalive=1)
    device.connect()
    device.go_silent()
    started = time.monotonic()
    got = sub.wait_for(1, timeout=10)
    assert [d.payload for d in got] == [b"gone-silent"]
    assert 1.4 <= got[0].at - started, "published before the keep-alive ran out (1.5 x 1 s)"


def test_mqtt_3_1_2_8_will_after_socket_close_with_properties_qos_and_retain(brokers, will_clients):
    """MQTT 5, socket closed without DISCONNECT: the Will arrives at its QoS with its properties, and Will Retain
    1 makes it the topic's retained message (a later subscriber gets it with RETAIN = 1)."""
    cluster = brokers()
    topic = will_topic()
    sub = subscriber(cluster, topic, 5)
    props = Properties(PacketTypes.WILLMESSAGE)
    props.ContentType = "text/plain"
    props.UserProperty = ("site", "kyiv")
    props.MessageExpiryInterval = 120
    device = will_clients(cluster, 5, topic, b"crashed", qos=1, retain=True, will_properties=props)
    device.connect()
    device.drop()
    [got] = sub.wait_for(1, timeout=10)
    assert (got.payload, got.qos, got.retain) == (b"crashed", 1, False)  # a forward: Retain As Published 0
    assert got.props == '{"content_type":"text/plain","user_properties":[["site","kyiv"]]}'
    assert got.expiry is not None and 100 < got.expiry <= 120
    late = subscriber(cluster, topic, 4)
    [kept] = late.wait_for(1, timeout=5)
    assert (kept.payload, kept.retain) == (b"crashed", True)


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_3_1_2_10_no_will_after_normal_disconnect_but_after_0x04(brokers, will_clients, version):
    """A normal DISCONNECT discards the Will ([MQTT-3.1.2-10]).  Near miss (MQTT 5): DISCONNECT with reason 0x04
    "Disconnect with Will Message" publishes it."""
    cluster = brokers()
    topic = will_topic()
    sub = subscriber(cluster, topic, version)
    polite = will_clients(cluster, version, topic, b"polite")
    polite.connect()
    polite.disconnect()
    if version == 5:
        asking = will_clients(cluster, version, topic, b"asked-for")
        asking.connect()
        asking.disconnect(reason=0x04)
        assert [d.payload for d in sub.wait_for(1, timeout=10)] == [b"asked-for"]
    assert [d.payload for d in sub.settle(1.5)] == ([b"asked-for"] if version == 5 else [])


def test_mqtt_3_1_3_9_will_delay_respected_and_cancelled_by_reconnect(brokers, will_clients):
    """Will Delay 2 s, session expiry 60 s: the Will arrives about 2 s after the socket closed, not before.
    The same client coming back to its session within the delay: no Will at all ([MQTT-3.1.3-9])."""
    cluster = brokers()
    topic = will_topic()
    sub = subscriber(cluster, topic, 5)
    dropped, _ = dropped_with_delayed_will(will_clients, cluster, topic, b"delayed", 2)
    [got] = sub.wait_for(1, timeout=10)
    assert got.payload == b"delayed"
    assert 1.9 <= got.at - dropped <= 5.0, f"Will after {got.at - dropped:.1f} s, delay 2 s"
    sub.clear()
    _, same_client = dropped_with_delayed_will(will_clients, cluster, topic, b"cancelled", 2)
    time.sleep(0.5)
    again = same_client()
    assert again.connect(clean=False, session_expiry=60) is True  # the session resumed within the delay
    assert sub.settle(1.0, timeout=4.0) == [] and sub.wait_for(1, timeout=1.5) == []
    again.disconnect()


@pytest.mark.parametrize("overdue", [True, False], ids=["resumed_after_the_delay", "resumed_within_the_delay"])
def test_mqtt_3_1_3_9_resume_after_the_delay_ran_out_before_any_sweep_publishes_the_will(brokers, will_clients,
                                                                                          overdue):
    """Will Delay 1 s, sweeps 30 s apart (none runs during the test).  The session resumed 1.5 s after the drop:
    the delay ran out before that CONNECT, so the Will is published at the resume ([MQTT-3.1.3-9] cancels it
    only for a connection made before the delay has passed).  Resumed 0.3 s after the drop: no Will."""
    cluster = brokers(session_expiry_check_s=30.0)
    topic = will_topic()
    sub = subscriber(cluster, topic, 5)
    _, same_client = dropped_with_delayed_will(will_clients, cluster, topic, b"overdue", 1)
    time.sleep(1.5 if overdue else 0.3)
    again = same_client()
    assert again.connect(clean=False, session_expiry=60) is True  # the session resumed
    if overdue:
        assert [d.payload for d in sub.wait_for(1, timeout=5)] == [b"overdue"]
        assert [d.payload for d in sub.settle(1.0, timeout=3.0)] == [b"overdue"]  # once
    else:
        assert sub.settle(1.0, timeout=3.0) == []
    again.disconnect()


def test_will_of_a_client_on_a_killed_node_is_published_by_the_survivor(brokers, will_clients):
    """The device's node is SIGKILLed while the device is connected: its network connection ended without
    DISCONNECT, so the node that releases the dead node's sessions (3 leases of 2 s later) publishes the Will,
    which reaches a subscriber on that node."""
    cluster = brokers(count=2)
    topic = will_topic()
    sub = subscriber(cluster, topic, 5, node=1)
    device = will_clients(cluster, 4, topic, b"node-died", node=0)
    device.connect(clean=False)
    cluster.nodes[0].kill()
    got = sub.wait_for(1, timeout=20)
    assert [d.payload for d in got] == [b"node-died"]
    assert "Will published on" in cluster.log(1)


@pytest.mark.parametrize("delay, resume, published", [(0, True, True), (30, True, False), (30, False, True)],
                         ids=["no-delay", "delayed-resumed", "delayed-new-session"])
def test_mqtt_3_1_3_9_will_of_a_taken_over_connection_published_once_or_cancelled(brokers, will_clients, delay,
                                                                                  resume, published):
    """A second connection of the same client id takes the session over while the first is still open (the
    first, silent, does not reconnect): the first's Will, without delay, is published once -- by whichever of the
    old connection's end and the new CONNECT takes its record.  With a Will Delay the new CONNECT decides:
    cancelled when the session resumes, published at once when a clean start ends it ([MQTT-3.1.3-9])."""
    cluster = brokers()
    topic = will_topic()
    sub = subscriber(cluster, topic, 5)
    props = Properties(PacketTypes.WILLMESSAGE)
    props.WillDelayInterval = delay
    device = will_clients(cluster, 5, topic, b"taken-over", will_properties=props)
    device.connect(clean=True, session_expiry=60)
    device.go_silent()
    again = will_clients(cluster, 5, topic, b"second-connection", will_properties=props, client_id=device.client_id)
    assert again.connect(clean=not resume, session_expiry=60) is resume
    if published:
        assert [d.payload for d in sub.wait_for(1, timeout=5)] == [b"taken-over"]
    assert [d.payload for d in sub.settle(1.5)] == ([b"taken-over"] if published else [])
    again.disconnect()


def wait_released(cluster, node: int, dead: str, timeout: float = 30.0) -> None:
    """Wait until node ``node`` logged the release of the dead node ``dead``'s sessions."""
    deadline = time.monotonic() + timeout
    while f"node {dead} is dead: released" not in cluster.log(node) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"node {dead} is dead: released" in cluster.log(node), f"{dead}'s sessions never released"


@pytest.mark.parametrize("disconnect_first", [False, True], ids=["connected", "disconnected-first"])
def test_will_of_a_killed_node_client_reconnecting_elsewhere_at_once_is_published_once(brokers, will_clients,
                                                                                       disconnect_first):
    """The device's node is SIGKILLed while the device is connected, and the device reconnects to the other node
    at once, before that node releases the dead one's sessions (3 leases of 2 s): the new CONNECT claims the old
    connection's Will record and publishes its Will -- once: the release later finds nothing, and the new
    connection's own Will stays with it (findings: will-retained seed 2).  Near miss: a normal DISCONNECT
    before the kill -- no Will at all ([MQTT-3.1.2-10])."""
    cluster = brokers(count=2)
    topic = will_topic()
    sub = subscriber(cluster, topic, 5, node=1)
    device = will_clients(cluster, 4, topic, b"first-connection", node=0)
    device.connect(clean=False)
    if disconnect_first:
        device.disconnect()
    cluster.nodes[0].kill()
    killed = time.monotonic()
    again = will_clients(cluster, 4, topic, b"second-connection", node=1, client_id=device.client_id)
    again.connect(clean=False)
    if not disconnect_first:
        got = sub.wait_for(1, timeout=5)
        assert [d.payload for d in got] == [b"first-connection"], "the Will of the killed node's connection is lost"
        assert "Will published on" in cluster.log(1) and "is dead: released" not in cluster.log(1), \
            "published by the release, not by the new CONNECT"
        assert got[0].at - killed < 6.0
    wait_released(cluster, 1, cluster.nodes[0].name)
    assert [d.payload for d in sub.settle(1.0)] == ([] if disconnect_first else [b"first-connection"])
    again.disconnect()


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "new-session"])
def test_mqtt_3_1_3_9_delayed_will_of_a_killed_node_client_reconnecting_elsewhere(brokers, will_clients, resume):
    """MQTT 5, Will Delay 30 s, session expiry 60 s; the device's node is SIGKILLed and the device reconnects to
    the other node at once, before the release of the dead node's sessions.  Resuming its session within the
    delay cancels the Will: none arrives, neither then nor after the release ([MQTT-3.1.3-9]).  Near miss: a
    clean start ends that session, so its Will is due then -- published at once, once."""
    cluster = brokers(count=2)
    topic = will_topic()
    sub = subscriber(cluster, topic, 5, node=1)
    props = Properties(PacketTypes.WILLMESSAGE)
    props.WillDelayInterval = 30
    device = will_clients(cluster, 5, topic, b"delayed", node=0, will_properties=props)
    device.connect(clean=True, session_expiry=60)
    cluster.nodes[0].kill()
    killed = time.monotonic()
    again = will_clients(cluster, 5, topic, b"second-connection", node=1, client_id=device.client_id,
                         will_properties=props)
    assert again.connect(clean=not resume, session_expiry=60) is resume
    if not resume:
        got = sub.wait_for(1, timeout=5)
        assert [d.payload for d in got] == [b"delayed"], "not published when its session ended"
        assert got[0].at - killed < 6.0
    wait_released(cluster, 1, cluster.nodes[0].name)
    assert [d.payload for d in sub.settle(1.0)] == ([] if resume else [b"delayed"])
    again.disconnect()


# ------------------------------------------------------------------ retained messages
def test_mqtt_3_3_1_retained_delivered_replaced_deleted_and_matched_by_wildcards(brokers):
    """A retained message reaches each new subscriber with RETAIN = 1 (3.1.1 and 5; a wildcard filter too, a
    '#' filter not for a $-topic), a second one replaces it, an empty payload deletes it ([MQTT-3.3.1-5],
    -8, -10, -11); MQTT 5 Retain Handling 2 sends nothing, 1 only on a new subscription."""
    cluster = brokers()
    base = f"retained/{uuid.uuid4().hex[:8]}"
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    pub.publish(f"{base}/a", b"first", 1, retain=True)
    pub.publish(f"$SYS/{base}", b"dollar", 1, retain=True)
    for version in (4, 5):
        [got] = retained(subscriber(cluster, f"{base}/a", version))
        assert (got.payload, got.retain, got.qos) == (b"first", True, 1)
    pub.publish(f"{base}/a", b"second", 1, retain=True)
    pub.publish(f"{base}/b", b"other", 1, retain=True)
    wild = subscriber(cluster, f"{base}/+", 5, qos=2)
    assert sorted((d.payload, d.qos) for d in retained(wild, 2, quiet=0.5)) == [(b"other", 1), (b"second", 1)]
    every = subscriber(cluster, "#", 4, qos=0)
    seen = {d.topic for d in retained(every, 2, quiet=0.5)}
    assert f"{base}/a" in seen and f"$SYS/{base}" not in seen  # [MQTT-4.7.2-1]
    dollar = subscriber(cluster, "$SYS/#", 4)
    assert [d.payload for d in retained(dollar) if d.topic == f"$SYS/{base}"] == [b"dollar"]
    time.sleep(1.0)  # the publishes above have reached every subscriber: from here on only retained copies
    assert subscriber(cluster, f"{base}/a", 5, retain_handling=2).settle(1.0) == []
    once = subscriber(cluster, f"{base}/a", 5, retain_handling=1)
    assert [d.payload for d in retained(once)] == [b"second"]
    once.client.subscribe(f"{base}/a", options=mqtt.SubscribeOptions(qos=1, retainHandling=1))  # not new
    assert len(once.settle(1.0)) == 1
    pub.publish(f"{base}/a", b"", 1, retain=True)
    assert [d.payload for d in retained(subscriber(cluster, f"{base}/+", 4), 2, timeout=1.5)] == [b"other"]
    quick = cluster.probe(version=5)  # a QoS 0 delete and DISCONNECT at once: the connection's end must not undo it
    quick.connect(clean=True)
    quick.publish(f"{base}/b", b"", 0, retain=True)
    quick.disconnect()
    time.sleep(0.5)
    assert retained(subscriber(cluster, f"{base}/#", 5), 1, timeout=1.0) == []


def test_retained_message_survives_a_broker_node_kill(brokers):
    """Retained through node 1, node 1 SIGKILLed and restarted: a new subscriber on node 2 (and one on the
    restarted node 1) gets it -- it is in Redis, not in a node's memory."""
    cluster = brokers(count=2)
    topic = f"retained/{uuid.uuid4().hex[:8]}"
    pub = cluster.probe(version=4, node=0)
    pub.connect(clean=True)
    pub.publish(topic, b"durable", 1, retain=True)
    pub.drop()
    cluster.nodes[0].kill()
    cluster.nodes[0].start()
    cluster.nodes[0].wait_ready(30)
    for node in (1, 0):
        [got] = subscriber(cluster, topic, 5, node=node).wait_for(1, timeout=5)
        assert (got.payload, got.retain) == (b"durable", True)
