"""What Mosquitto (Debian's 2.0.x) does with the MQTT 5 delivery rules, recorded by the harness's own clients
(harness/clients.py ClientSession on one selector loop, as in a run) into a history and read back from its
Parquet rows: forwarded properties, subscription identifiers, Retain As Published, the client's Receive Maximum
and Maximum Packet Size, and the PUBREL of a QoS 2 flow on a resumed session.  docs/findings.md ("Mosquitto and
MQTT 5") states the facts these tests pin; a test that fails after a Mosquitto upgrade means the finding
changed, not that the harness broke."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.capabilities import missing_capability
from support.dirs import searchable_tmp
from support.mosquitto import free_port, running_mosquitto

from contracts.history_schema import Kind
from harness.clients import ClientSession, Counters, SelectorLoop
from harness.history import HistoryRecorder, read_history
from properties.plan import PUBLISHER, SUBSCRIBER, ClientPlan, PublishPlan, Subscription

pytestmark = pytest.mark.integration

TOPIC = "europe/ua/kyiv/0/0"
FILTER = "europe/ua/kyiv/0/+"


@pytest.fixture
def mosquitto():
    """A Mosquitto of the test's own (persistence on, as mosquitto-smoke runs it) on 127.0.0.1: its port."""
    if shutil.which("mosquitto") is None:
        missing_capability("mosquitto not installed: run scripts/bootstrap.sh")
    with searchable_tmp("ordeal-mosquitto-mqtt5-") as base:
        if os.geteuid() == 0:  # Mosquitto drops root to its own user, which must write its data directory
            try:
                os.chown(base, pwd.getpwnam("mosquitto").pw_uid, -1)
            except KeyError:
                pass
        port = free_port()
        (base / "mosquitto.conf").write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {base}/\n"
            "max_queued_messages 1000\nmax_inflight_messages 100\nlog_dest stdout\nlog_type all\n")
        with running_mosquitto(base / "mosquitto.conf", port):
            yield port


class Clients:
    """Harness clients on one loop, recording into one history (as the executor's)."""

    def __init__(self, tmp_path: Path, port: int) -> None:
        self.path = tmp_path / "history"
        self.recorder = HistoryRecorder(self.path, run_id="mosquitto-mqtt5", meta={})
        self.loop = SelectorLoop()
        self.port = port
        self.sessions: list[ClientSession] = []

    def session(self, plan: ClientPlan) -> ClientSession:
        session = ClientSession(plan=plan, recorder=self.recorder, loop=self.loop, counters=Counters(),
                                address_of=lambda _node: ("127.0.0.1", self.port, "mosquitto"),
                                publisher_names={0: "test_pub_client_0_0", 1: "test_pub_client_1_0"})
        self.sessions.append(session)
        return session

    def subscriber(self, *subscriptions: Subscription, protocol: int = 5, **plan) -> ClientSession:
        session = self.session(ClientPlan(client_id=f"test_sub_client_{len(self.sessions)}_0", role=SUBSCRIBER,
                                          protocol=protocol, node=0, subscriptions=subscriptions or
                                          (Subscription(FILTER, 1),), persistent=True,
                                          session_expiry_s=600 if protocol == 5 else None, **plan))
        self.connect(session, clean_start=True)
        return session

    def publisher(self, index: int = 0, protocol: int = 5) -> ClientSession:
        session = self.session(ClientPlan(client_id=f"test_pub_client_{index}_0", role=PUBLISHER,
                                          protocol=protocol, node=0, publisher_index=index))
        self.connect(session, clean_start=True)
        return session

    def connect(self, session: ClientSession, clean_start: bool = False) -> None:
        session.connect(clean_start=clean_start, node=0, session_expiry_s=session.plan.session_expiry_s,
                        why="test")
        assert self.pump(lambda: session.connected and session.subscribed), f"{session.client_id} not connected"

    def pump(self, until, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            self.loop.poll(0.02)
        return until()

    def settle(self, quiet: float = 0.7) -> None:
        end = time.monotonic() + quiet
        while time.monotonic() < end:
            self.loop.poll(0.02)

    def publish(self, session: ClientSession, seq: int, qos: int = 1, **plan) -> None:
        session.publish(PublishPlan(0.0, session.client_id, seq, TOPIC, qos, 62, **plan))

    def rows(self) -> list[dict]:
        for session in self.sessions:
            if session.paho is not None:
                session.disconnect(abrupt=False, why="end of test")
        self.settle(0.3)
        self.loop.close()
        self.recorder.close()
        return read_history(self.path).to_pylist()


def _of(rows: list[dict], kind: str, client: str | None = None) -> list[dict]:
    return [r for r in rows if r["kind"] == kind and (client is None or r["client"] == client)]


def test_mosquitto_forwards_the_properties_unchanged_and_each_subscriptions_identifier(mosquitto, tmp_path):
    """Forwarded properties equal as sent, live and queued, with the expiry reduced; with two overlapping
    subscriptions Mosquitto sends one copy per subscription, each with its own identifier."""
    clients = Clients(tmp_path, mosquitto)
    sub = clients.subscriber(Subscription(FILTER, 1, sub_id=1), Subscription("europe/ua/kyiv/#", 2, sub_id=5))
    pub = clients.publisher()
    clients.publish(pub, 1, properties=True, expiry_s=600)
    assert clients.pump(lambda: sub.counters.delivered >= 2)
    sub.disconnect(abrupt=False, why="offline")
    clients.settle(0.5)  # gone before the next publish (else Mosquitto may write to a closing socket: a resend)
    clients.publish(pub, 2, properties=True, expiry_s=600)
    clients.settle(1.2)
    clients.connect(sub)
    assert clients.pump(lambda: sub.counters.delivered >= 4)
    clients.settle(0.5)
    rows = clients.rows()
    sent = {r["pub_seq"]: r["props"] for r in _of(rows, Kind.PUBLISH_INVOKE)}
    got = _of(rows, Kind.DELIVERY, sub.client_id)
    assert sorted({(r["pub_seq"], r["sub_ids"], r["qos"]) for r in got}) == [(1, "1", 1), (1, "5", 1), (2, "1", 1),
                                                                            (2, "5", 1)]
    assert all(r["props"] == sent[r["pub_seq"]] and sent[r["pub_seq"]] is not None for r in got)
    assert all(r["remaining_expiry_s"] is not None and r["remaining_expiry_s"] <= 600 for r in got)
    assert min(r["remaining_expiry_s"] for r in got if r["pub_seq"] == 2) < 600  # waited: reduced
    subacks = {r["topic"]: json.loads(r["detail"])["sub_id"] for r in _of(rows, Kind.SUBSCRIBE_ACK, sub.client_id)}
    assert subacks == {FILTER: 1, "europe/ua/kyiv/#": 5}


def test_mosquitto_sets_retain_as_published(mosquitto, tmp_path):
    clients = Clients(tmp_path, mosquitto)
    rap = clients.subscriber(Subscription(FILTER, 1, retain_as_published=True))
    plain = clients.subscriber(Subscription(FILTER, 1))
    retained = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="retainer", protocol=mqtt.MQTTv5)
    retained.connect("127.0.0.1", mosquitto)
    retained.loop_start()
    try:
        from contracts import payload as identity_codec

        body = identity_codec.encode(identity_codec.Identity(0, 1, time.time_ns() // 1000), 62)
        retained.publish(TOPIC, body, qos=1, retain=True).wait_for_publish(5)
        assert clients.pump(lambda: rap.counters.delivered and plain.counters.delivered)
        retained.publish(TOPIC, b"", qos=1, retain=True).wait_for_publish(5)  # clear the retained message
    finally:
        retained.loop_stop()
        retained.disconnect()
    rows = clients.rows()
    assert [r["retain"] for r in _of(rows, Kind.DELIVERY, rap.client_id) if r["pub_seq"] == 1] == [True]
    assert [r["retain"] for r in _of(rows, Kind.DELIVERY, plain.client_id) if r["pub_seq"] == 1] == [False]


def test_mosquitto_2_0_11_exceeds_receive_maximum_after_an_ack_with_a_backlog(mosquitto, tmp_path):
    """Receive Maximum 2, a backlog of 10: the subscriber acknowledges the first message, then withholds.  2.0.11
    answers the one PUBACK with two more PUBLISHes while the second is still unacknowledged: three in flight
    (db__message_delete_outgoing counts only the in-flight messages before the acknowledged one; fixed in
    2.0.13, "Various fixes around inflight quota management", eclipse/mosquitto#2306)."""
    clients = Clients(tmp_path, mosquitto)
    sub = clients.subscriber(receive_maximum=2)
    pub = clients.publisher()
    sub.disconnect(abrupt=False, why="offline")
    clients.settle(0.5)
    for seq in range(1, 11):
        clients.publish(pub, seq)
    clients.settle(1.0)
    def withhold_after_the_first(*_delivery) -> None:
        if sub.counters.delivered >= 2:  # the first one is acknowledged, from the second on nothing
            sub.withhold_acks()

    sub.on_delivered = withhold_after_the_first
    clients.connect(sub)
    clients.settle(1.5)
    rows = clients.rows()
    [connect] = [r for r in _of(rows, Kind.CONNECT, sub.client_id)][-1:]
    assert json.loads(connect["detail"])["receive_maximum"] == 2
    after = [r for r in rows if r["client"] == sub.client_id and r["seq"] > connect["seq"]]
    delivered = [r["pub_seq"] for r in after if r["kind"] == Kind.DELIVERY]
    acked = [r["pub_seq"] for r in after if r["kind"] == Kind.DELIVERY_ACK_SENT]
    assert acked == [1] and len(delivered) - len(acked) == 3, (delivered, acked)  # 3 unacknowledged > 2


def test_mosquitto_keeps_receive_maximum_while_nothing_is_acknowledged(mosquitto, tmp_path):
    """The near miss of the test before: without any PUBACK, Mosquitto keeps to the client's Receive Maximum."""
    clients = Clients(tmp_path, mosquitto)
    sub = clients.subscriber(receive_maximum=2)
    pub = clients.publisher()
    sub.withhold_acks()
    for seq in range(1, 11):
        clients.publish(pub, seq)
    clients.settle(1.5)
    rows = clients.rows()
    assert len(_of(rows, Kind.DELIVERY, sub.client_id)) == 2


def test_mosquitto_honours_maximum_packet_size(mosquitto, tmp_path):
    """A message larger than the subscriber's Maximum Packet Size is never sent, live or queued, and not later
    either (discarded as if delivered, [MQTT-3.1.2-25]); the smaller ones arrive."""
    clients = Clients(tmp_path, mosquitto)
    sub = clients.subscriber(maximum_packet_size=160)
    big, small = clients.publisher(0, protocol=5), clients.publisher(1, protocol=4)
    clients.publish(big, 1, properties=True)  # ~230 bytes with the forwarded properties
    clients.publish(small, 1)
    assert clients.pump(lambda: sub.counters.delivered >= 1)
    sub.disconnect(abrupt=False, why="offline")
    clients.settle(0.5)
    clients.publish(big, 2, properties=True)
    clients.publish(small, 2)
    clients.settle(1.0)
    clients.connect(sub)
    clients.settle(1.0)
    sub.disconnect(abrupt=False, why="again")
    clients.connect(sub)
    clients.settle(1.0)
    rows = clients.rows()
    got = _of(rows, Kind.DELIVERY, sub.client_id)
    assert sorted((r["publisher"], r["pub_seq"]) for r in got) == [("test_pub_client_1_0", 1),
                                                                   ("test_pub_client_1_0", 2)]
    assert all(r["packet_size"] <= 160 for r in got)


@pytest.mark.parametrize("protocol", [4, 5])
def test_mosquitto_resends_pubrel_on_the_resumed_session(mosquitto, tmp_path, protocol):
    clients = Clients(tmp_path, mosquitto)
    sub = clients.subscriber(Subscription(FILTER, 2), protocol=protocol)
    if protocol == 4:  # 3.1.1: CleanSession = 1, then = 0, a session that outlives the connection
        sub.disconnect(abrupt=False, why="persistent from here")
        clients.connect(sub)
    pub = clients.publisher()
    # Withholding before a planned drop, the client reads nothing after its next PUBREC (harness/clients.py): the
    # broker's PUBREL is lost with the socket, and the resumed session must bring it again.
    sub.withhold_acks()
    received: list[int] = []
    record = sub.paho.on_qos2_received
    sub.paho.on_qos2_received = lambda *args: (received.append(1), record(*args))
    clients.publish(pub, 1, qos=2)
    assert clients.pump(lambda: received)
    sub.disconnect(abrupt=True, why="drop with the PUBREL unread")
    clients.connect(sub)
    clients.settle(1.0)
    rows = clients.rows()
    mine = [r for r in rows if r["client"] == sub.client_id]
    resumed = [r for r in mine if r["kind"] == Kind.CONNECT][-1]
    assert resumed["session_present"] is True
    after = [r for r in mine if r["seq"] > resumed["seq"]]
    assert [json.loads(r["detail"])["known"] for r in after if r["kind"] == Kind.PUBREL_RECEIVED] == [True]
    assert [r["pub_seq"] for r in after if r["kind"] == Kind.DELIVERY] == [1]
    assert not [r for r in after if r["kind"] == Kind.QOS2_RECEIVED]  # the PUBLISH is not sent again
