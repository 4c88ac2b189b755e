"""What the harness's client records of MQTT 5 deliveries and of the QoS 2 flow (history schema version 2):
the packet size of a PUBLISH it did not build, its forwarded properties and subscription identifiers, the
qos2_received and pubrel_received rows, the CONNECT and SUBSCRIBE options.  Real paho clients, no socket: the
packets are built here byte by byte and fed to paho's own packet handlers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from contracts import payload as identity_codec
from contracts.history_schema import Kind
from harness.clients import ClientSession, Counters, NonBlockingConnectClient, SelectorLoop, packet_size
from harness.history import HistoryRecorder, read_history
from properties.plan import PUBLISHER, SUBSCRIBER, ClientPlan, PublishPlan, Subscription

TOPIC = "europe/ua/kyiv/0/0"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _utf8(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def publish_packet(qos: int, mid: int, payload: bytes, *, v5: bool, sub_ids: tuple[int, ...] = (),
                   user: tuple[tuple[str, str], ...] = (), content_type: str | None = None,
                   dup: bool = False) -> bytes:
    """A whole PUBLISH packet, encoded by hand (MQTT 5 §3.3): fixed header, topic, packet id, properties, payload."""
    body = _utf8(TOPIC) + (struct.pack("!H", mid) if qos else b"")
    if v5:
        props = b""
        if content_type is not None:
            props += b"\x03" + _utf8(content_type)
        for key, value in user:
            props += b"\x26" + _utf8(key) + _utf8(value)
        for sub_id in sub_ids:
            props += b"\x0b" + _varint(sub_id)
        body += _varint(len(props)) + props
    body += payload
    return bytes([0x30 | (0x08 if dup else 0) | (qos << 1)]) + _varint(len(body)) + body


def _fixed_header_length(packet: bytes) -> int:
    at = 1
    while packet[at] & 0x80:
        at += 1
    return at + 1


@pytest.mark.parametrize("remaining", [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152])
def test_packet_size_counts_the_remaining_length_bytes(remaining):
    # a Variable Byte Integer takes 1 byte up to 127, 2 up to 16383, 3 up to 2097151, then 4 (MQTT 5 §1.5.5)
    assert packet_size(remaining) == 1 + len(_varint(remaining)) + remaining


class _Harness:
    """A ClientSession whose paho client reads packets handed to it (no socket)."""

    def __init__(self, tmp_path: Path, protocol: int = 5, **plan) -> None:
        self.path = tmp_path / "history"
        self.recorder = HistoryRecorder(self.path, run_id="rows", meta={})
        self.plan = ClientPlan(client_id="test_sub_client_0_0", role=SUBSCRIBER, protocol=protocol, node=0,
                               subscriptions=(Subscription("europe/ua/kyiv/0/+", 2, sub_id=1,
                                                           retain_as_published=True),),
                               persistent=True, session_expiry_s=60 if protocol == 5 else None, **plan)
        self.session = ClientSession(plan=self.plan, recorder=self.recorder, loop=SelectorLoop(),
                                     counters=Counters(), address_of=lambda _n: ("127.0.0.1", 1, "broker-1"),
                                     publisher_names={0: "test_pub_client_0_0"})
        self.client = self.new_client()

    def new_client(self) -> NonBlockingConnectClient:
        protocol = mqtt.MQTTv5 if self.plan.protocol == 5 else mqtt.MQTTv311
        client = NonBlockingConnectClient(CallbackAPIVersion.VERSION2, client_id=self.plan.client_id,
                                          protocol=protocol, **({} if protocol == mqtt.MQTTv5 else
                                                                {"clean_session": False}))
        client.manual_ack_set(True)
        self.session.loop.attach(client)  # PUBREC / PUBCOMP are queued for the (absent) loop, not written
        client.on_message = self.session._on_message
        client.on_qos2_received = self.session._on_qos2_received
        client.on_pubrel_received = self.session._on_pubrel_received
        self.session.paho, self.session.node_name = client, "broker-1"
        return client

    def feed(self, packet: bytes) -> None:
        header = _fixed_header_length(packet)
        self.client._in_packet = {"command": packet[0], "packet": packet[header:], "remaining_length":
                                  len(packet) - header}
        if packet[0] >> 4 == 3:
            assert self.client._handle_publish() == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
        else:
            assert self.client._handle_pubrel() == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS

    def rows(self) -> list[dict]:
        self.recorder.close()
        return [r for r in read_history(self.path).to_pylist() if r["client"] == self.plan.client_id]


def _payload(seq: int) -> bytes:
    return identity_codec.encode(identity_codec.Identity(0, seq, 1_700_000_000_000_000), 62)


def test_a_delivery_row_has_the_size_properties_and_identifiers_of_the_packet(tmp_path):
    h = _Harness(tmp_path)
    packet = publish_packet(1, 9, _payload(1), v5=True, sub_ids=(3, 1), content_type="c",
                            user=(("k", "1"), ("k", "2")))
    h.feed(packet)
    [row] = h.rows()
    assert row["kind"] == Kind.DELIVERY and row["packet_size"] == len(packet)
    assert row["sub_ids"] == "3,1"  # in the order received
    assert row["props"] == '{"content_type":"c","user_properties":[["k","1"],["k","2"]]}'
    assert (row["publisher"], row["pub_seq"], row["packet_id"], row["qos"]) == ("test_pub_client_0_0", 1, 9, 1)


def test_a_3_1_1_delivery_has_its_size_and_no_properties(tmp_path):
    h = _Harness(tmp_path, protocol=4)
    packet = publish_packet(1, 3, _payload(2), v5=False)
    h.feed(packet)
    [row] = h.rows()
    assert (row["packet_size"], row["props"], row["sub_ids"]) == (len(packet), None, None) == (86, None, None)


def test_qos2_received_then_the_release_at_pubrel_with_the_publish_packets_size(tmp_path):
    h = _Harness(tmp_path)
    packet = publish_packet(2, 5, _payload(3), v5=True, sub_ids=(1,))
    h.feed(packet)
    h.feed(bytes([0x62, 0x02, 0x00, 0x05]))  # PUBREL 5
    h.feed(bytes([0x62, 0x02, 0x00, 0x06]))  # PUBREL 6: no message for it (answered with PUBCOMP)
    received, known, delivery, unknown = h.rows()
    assert received["kind"] == Kind.QOS2_RECEIVED and received["packet_size"] == len(packet)
    assert (received["qos"], received["packet_id"], received["pub_seq"], received["sub_ids"]) == (2, 5, 3, "1")
    assert (known["kind"], known["packet_id"], json.loads(known["detail"])) == (Kind.PUBREL_RECEIVED, 5,
                                                                                 {"known": True})
    assert delivery["kind"] == Kind.DELIVERY and delivery["packet_size"] == len(packet)  # the PUBLISH's, at PUBREL
    assert (unknown["kind"], json.loads(unknown["detail"])) == (Kind.PUBREL_RECEIVED, {"known": False})


def test_withholding_stalls_reading_after_a_qos2_pubrec_and_the_next_connection_releases_it(tmp_path):
    """Before a planned abrupt drop the client answers the next QoS 2 PUBLISH with PUBREC and then reads nothing
    more: its PUBREL is never read (no pubrel_received row), the next connection's PUBREL releases it."""
    from harness.clients import carry_unreleased_qos2, take_unreleased_qos2

    h = _Harness(tmp_path)
    h.feed(publish_packet(2, 4, _payload(4), v5=True))  # before withholding: no stall
    assert not h.client.reading_stalled
    h.session.withhold_acks()
    packet = publish_packet(2, 5, _payload(5), v5=True)
    h.feed(packet)
    assert h.client.reading_stalled and h.client.loop_read() == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
    assert [p["command"] & 0xF0 for p in h.client._out_packet] == [0x50, 0x50]  # both PUBRECs still leave
    old = h.client
    h.client = h.new_client()  # the resumed session's connection
    carry_unreleased_qos2(old, h.client, take_unreleased_qos2(old))
    h.feed(bytes([0x62, 0x02, 0x00, 0x05]))  # the broker resends the PUBREL
    rows = h.rows()
    assert [(r["kind"], r["packet_id"]) for r in rows] == [
        (Kind.QOS2_RECEIVED, 4), (Kind.QOS2_RECEIVED, 5), (Kind.PUBREL_RECEIVED, 5), (Kind.DELIVERY, 5)]
    assert json.loads(rows[2]["detail"]) == {"known": True} and rows[3]["packet_size"] == len(packet)


def test_a_stalled_client_is_not_watched_for_reads_but_still_writes(tmp_path):
    import selectors
    import socket

    h = _Harness(tmp_path)
    left, right = socket.socketpair()
    try:
        h.session.loop.selector.register(left, selectors.EVENT_READ, h.client)
        h.client.reading_stalled = True
        h.session.loop._watch(h.client, left, write=True)
        assert h.session.loop.selector.get_key(left).events == selectors.EVENT_WRITE
        h.session.loop._watch(h.client, left, write=False)
        with pytest.raises(KeyError):
            h.session.loop.selector.get_key(left)
        h.session.loop._watch(h.client, left, write=True)  # wants to write again: registered for that only
        assert h.session.loop.selector.get_key(left).events == selectors.EVENT_WRITE
    finally:
        left.close()
        right.close()
        h.rows()


class _Subscribing:
    """Stands in for paho's subscribe: what the session asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def subscribe(self, topics, properties=None):
        self.calls.append((topics, properties))
        return mqtt.MQTT_ERR_SUCCESS, len(self.calls)


def test_subscribe_sends_the_plans_options_and_the_suback_row_names_them(tmp_path):
    h = _Harness(tmp_path)
    fake = _Subscribing()
    h.session._subscribe(fake)
    [(topics, properties)] = fake.calls
    [(topic_filter, options)] = topics
    assert topic_filter == "europe/ua/kyiv/0/+" and (options.QoS, options.retainAsPublished) == (2, True)
    assert properties.SubscriptionIdentifier == [1]

    class Code:
        value = 2

    h.session._on_subscribe(h.client, None, 1, [Code()], None)
    [row] = h.rows()
    assert row["kind"] == Kind.SUBSCRIBE_ACK and row["qos"] == 2
    assert json.loads(row["detail"]) == {"requested_qos": 2, "sub_id": 1, "rap": True, "no_local": False}


def test_a_3_1_1_subscribe_has_no_mqtt5_options(tmp_path):
    h = _Harness(tmp_path, protocol=4)
    fake = _Subscribing()
    h.session._subscribe(fake)
    assert fake.calls == [([("europe/ua/kyiv/0/+", 2)], None)]

    class Code:
        value = 2

    h.session._on_subscribe(h.client, None, 1, [Code()], None)
    assert json.loads(h.rows()[0]["detail"]) == {"requested_qos": 2, "rap": False, "no_local": False}


def test_the_publish_invoke_row_has_the_properties_as_sent(tmp_path):
    path = tmp_path / "history"
    recorder = HistoryRecorder(path, run_id="pub", meta={})
    plan = ClientPlan(client_id="test_pub_client_0_0", role=PUBLISHER, protocol=5, node=0, publisher_index=0)
    session = ClientSession(plan=plan, recorder=recorder, loop=SelectorLoop(), counters=Counters(),
                            address_of=lambda _n: ("127.0.0.1", 1, "broker-1"), publisher_names={})
    session.publish(PublishPlan(0.0, plan.client_id, 7, TOPIC, 1, 62, expiry_s=30, properties=True))
    session.publish(PublishPlan(0.1, plan.client_id, 8, TOPIC, 1, 62))
    recorder.close()
    with_props, without = [r for r in read_history(path).to_pylist() if r["kind"] == Kind.PUBLISH_INVOKE]
    sent = json.loads(with_props["props"])
    assert sent["correlation_data"] == b"test_pub_client_0_0#7".hex() and with_props["retain"] is False
    assert len(sent["user_properties"]) == 2 and with_props["expiry_s"] == 30
    assert without["props"] is None


def test_connect_properties_the_plan_asks_for(tmp_path):
    h = _Harness(tmp_path, receive_maximum=2, maximum_packet_size=300)
    sent = {}
    original = NonBlockingConnectClient.connect

    def capture(self, host, port, keepalive=60, bind_address="", **kwargs):
        sent.update(vars(kwargs["properties"]))
        raise OSError("no broker here")

    NonBlockingConnectClient.connect = capture
    try:
        h.session.connect(clean_start=False, node=0, session_expiry_s=60, why="test")
    finally:
        NonBlockingConnectClient.connect = original
    assert (sent["ReceiveMaximum"], sent["MaximumPacketSize"], sent["SessionExpiryInterval"]) == (2, 300, 60)
