"""A PUBACK followed at once by an abrupt close (docs/findings.md, "session-mix seed 2: an ack the history
claimed before it left").  Two sides of one race, each against the real reference broker:

- the broker: PUBACKs that reached it before the client cut the connection (shutdown + close, as
  harness/clients.py ``_cut`` does) must end those flows; a redelivery of them after the reconnect would be a
  broker bug (MQTT 5 §4.4 resends only unacknowledged PUBLISH packets);
- the harness: a ``delivery_ack_sent`` row must mean the PUBACK left the client, not that paho queued it;
  otherwise a loop stall between queueing and the planned cut makes the history claim an ack that was never
  sent (what the detection matrix saw under load)."""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
import test_broker_flow
from test_broker_flow import FILTER, TOPIC, RawClient

from contracts.history_schema import Kind
from harness.clients import ClientSession, Counters, SelectorLoop
from harness.history import HistoryRecorder, read_history
from properties.plan import SUBSCRIBER, ClientPlan, Subscription
from reference_broker import codec

brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests

pytestmark = pytest.mark.integration


def _reset(sock: socket.socket) -> None:
    """An abrupt close that ends in a reset (SO_LINGER 0), as a client crash with unread data does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_pubacks_sent_right_before_an_abrupt_close_end_their_flows(brokers):
    """Many rounds: receive a batch, send every PUBACK in one write and reset the connection at once.  The
    broker read the acks before the reset (before the fix asyncio dropped them from the reader's buffer when
    the reset came while the first was being processed).  No acknowledged message may come back."""
    cluster = brokers()
    node = cluster.nodes[0]
    client_id = f"race-{uuid.uuid4().hex[:8]}"
    raw = RawClient(node.host, node.port)
    raw.connect(client_id, clean=True)
    raw.send(codec.Subscribe(1, [(FILTER, 1)]))
    assert isinstance(raw.receive(), codec.SubAck)
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    acked: set[bytes] = set()
    redelivered: list[bytes] = []
    serial = 0
    for _round in range(15):
        batch = []
        for _ in range(8):
            pub.publish(TOPIC, b"m%05d" % serial, 1)
            serial += 1
        while len(batch) < 8:
            packet = raw.receive()
            if isinstance(packet, codec.Publish):
                if packet.dup and packet.payload in acked:
                    redelivered.append(packet.payload)
                batch.append(packet)
        raw.sock.sendall(b"".join(codec.encode(codec.Ack(codec.PUBACK, p.packet_id), codec.MQTT5)
                                  for p in batch))
        acked.update(p.payload for p in batch)
        _reset(raw.sock)  # right behind the acks: they reach the broker, the reset a moment later
        time.sleep(0.05)
        raw = RawClient(node.host, node.port)
        assert raw.connect(client_id, clean=False).session_present is True
    # what is still owed comes now; none of it may be a message acknowledged before a cut
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            packet = raw.receive(timeout=0.5)
        except TimeoutError:
            break
        if isinstance(packet, codec.Publish):
            if packet.payload in acked:
                redelivered.append(packet.payload)
            raw.send(codec.Ack(codec.PUBACK, packet.packet_id))
    raw.close()
    assert redelivered == [], (f"{len(redelivered)} deliveries of messages acknowledged before the reset, "
                               f"first: {redelivered[:8]}")


def test_an_ack_row_means_the_puback_left_the_client(brokers, tmp_path):
    """The matrix case replayed without load: a delivery is read, the loop stalls before its next select, the
    planned abrupt cut comes.  Every delivery_ack_sent row before the cut must be an ack the broker got: none
    of those messages may be redelivered after the reconnect (before the fix the row was written when paho
    queued the PUBACK, and the cut dropped it from the queue)."""
    cluster = brokers()
    node = cluster.nodes[0]
    loop = SelectorLoop()
    recorder = HistoryRecorder(tmp_path / "history", run_id="ackrace")
    plan = ClientPlan(client_id=f"sub-{uuid.uuid4().hex[:8]}", role=SUBSCRIBER, protocol=5, node=0,
                      subscriptions=(Subscription(FILTER, 1),), persistent=True, session_expiry_s=3600)
    counters = Counters()
    session = ClientSession(plan=plan, recorder=recorder, loop=loop, counters=counters,
                            address_of=lambda _i: (node.host, node.port, "broker-1"), publisher_names={})

    def pump(until, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "timed out"
            loop.poll(0.05)

    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    try:
        session.connect(clean_start=False, node=0, session_expiry_s=3600, why="test")
        pump(lambda: session.subscribed)
        for round_no in range(5):
            delivered = counters.delivered
            pub.publish(TOPIC, b"r%d" % round_no, 1)
            pump(lambda d=delivered: counters.delivered > d)  # stop right after the turn that read it
            time.sleep(0.2)  # the stall (1.14 s on the loaded matrix machine)
            session.disconnect(abrupt=True, why="plan")
            loop.poll(0)
            session.connect(clean_start=False, node=0, session_expiry_s=3600, why="test")
            pump(lambda: session.subscribed)
        deadline = time.monotonic() + 1.5  # what is still owed comes now
        while time.monotonic() < deadline:
            loop.poll(0.05)
        session.disconnect(abrupt=False, why="end")
        for _ in range(5):
            loop.poll(0.05)
    finally:
        loop.close()
        recorder.close()
    rows = read_history(tmp_path / "history").to_pylist()
    acked: set[int] = set()  # packet ids whose ack row came before a cut of the same connection
    claimed_then_redelivered = []
    for row in rows:
        if row["kind"] == Kind.DELIVERY_ACK_SENT:
            acked.add(row["packet_id"])
        elif row["kind"] == Kind.DELIVERY and row["dup"] and row["packet_id"] in acked:
            claimed_then_redelivered.append(row["packet_id"])
        elif row["kind"] == Kind.DELIVERY:
            acked.discard(row["packet_id"])
    assert counters.delivered >= 5
    assert claimed_then_redelivered == [], (
        f"history says acked, broker redelivered (the ack never left): {claimed_then_redelivered}")
