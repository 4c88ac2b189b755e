"""Round trips and malformed input for reference_broker/codec.py, including paho's own encoder as a peer."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from reference_broker import codec
from reference_broker.codec import (
    MQTT5,
    MQTT311,
    Ack,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    Publish,
    Simple,
    SubAck,
    Subscribe,
    Unsubscribe,
    decode,
    encode,
    split_packets,
    topic_matches,
    valid_filter,
    whole_packets,
)


def roundtrip(packet, version):
    [(first, body)] = split_packets(encode(packet, version))
    return decode(first, body, version)


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_publish_roundtrip_all_qos(version):
    for qos in (0, 1, 2):
        props = None
        if version == MQTT5:
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = 30
            props.UserProperty = ("k", "v")
        packet = Publish("a/b", b"\x00\x01payload", qos, retain=qos == 1, dup=qos == 2,
                         packet_id=65535 if qos else None, properties=props)
        back = roundtrip(packet, version)
        assert (back.topic, back.payload, back.qos, back.retain, back.dup, back.packet_id) == (
            "a/b", b"\x00\x01payload", qos, qos == 1, qos == 2, 65535 if qos else None)
        if version == MQTT5:
            assert back.properties.MessageExpiryInterval == 30
            assert back.properties.UserProperty == [("k", "v")]


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_connect_roundtrip(version):
    props = None
    if version == MQTT5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        props.ReceiveMaximum = 20
    packet = Connect(version, "client-1", False, 30, props, will_topic="w", will_payload=b"bye",
                     will_qos=1, username="u", password=b"p")
    back = roundtrip(packet, version)
    assert (back.protocol_level, back.client_id, back.clean_start, back.keep_alive) == (version, "client-1", False, 30)
    assert (back.will_topic, back.will_payload, back.will_qos, back.username, back.password) == ("w", b"bye", 1, "u", b"p")
    if version == MQTT5:
        assert back.prop("SessionExpiryInterval") == 3600 and back.prop("ReceiveMaximum") == 20


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_other_packets_roundtrip(version):
    assert roundtrip(Subscribe(7, [("a/+", 1), ("b/#", 2)]), version).topics == [("a/+", 1), ("b/#", 2)]
    assert roundtrip(Unsubscribe(8, ["a/+"]), version).topics == ["a/+"]
    assert roundtrip(SubAck(9, [0, 1, 0x80]), version).reason_codes == [0, 1, 0x80]
    for kind in (codec.PUBACK, codec.PUBREC, codec.PUBREL, codec.PUBCOMP):
        back = roundtrip(Ack(kind, 1234, codec.RC_SUCCESS), version)
        assert (back.packet_type, back.packet_id) == (kind, 1234)
    back = roundtrip(ConnAck(True, 0), version)
    assert back.session_present is True
    assert roundtrip(Simple(codec.PINGREQ), version) == Simple(codec.PINGREQ)
    assert isinstance(roundtrip(Disconnect(), version), Disconnect)


def test_mqtt5_reason_codes_roundtrip():
    back = roundtrip(Ack(codec.PUBACK, 5, codec.RC_NO_MATCHING_SUBSCRIBERS), MQTT5)
    assert back.reason_code == codec.RC_NO_MATCHING_SUBSCRIBERS
    back = roundtrip(Disconnect(codec.RC_SESSION_TAKEN_OVER), MQTT5)
    assert back.reason_code == codec.RC_SESSION_TAKEN_OVER


def test_decodes_paho_client_packets():
    """paho's own encoder is the peer: decode what it writes."""
    import paho.mqtt.client as mqtt

    sent = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="p1", protocol=mqtt.MQTTv5)
    client._sock = type("S", (), {"send": lambda self, b: sent.append(bytes(b)) or len(b),
                                  "setblocking": lambda self, f: None,
                                  "close": lambda self: None})()
    client._state = mqtt._ConnectionState.MQTT_CS_CONNECTED
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 9
    client.publish("x/y", b"hi", qos=1, properties=props)
    client.subscribe("x/+", qos=2)
    client.loop_write()
    packets = [decode(first, body, MQTT5) for first, body in split_packets(b"".join(sent))]
    publish = next(p for p in packets if isinstance(p, Publish))
    assert (publish.topic, publish.payload, publish.qos, publish.prop("MessageExpiryInterval")) == ("x/y", b"hi", 1, 9)
    subscribe = next(p for p in packets if isinstance(p, Subscribe))
    assert subscribe.topics[0][0] == "x/+" and subscribe.topics[0][1] & 3 == 2


@pytest.mark.parametrize("first,body", [
    (0x30, b"\x00"),                              # topic length runs past the end
    (0x36, b"\x00\x01a\x00\x01"),                 # QoS 3
    (0x32, b"\x00\x01a\x00\x00"),                 # packet id 0
    (0x38, b"\x00\x01a"),                         # DUP on QoS 0
    (0x30, b"\x00\x03a/+"),                       # wildcard in a topic name
    (0x40, b"\x00"),                              # PUBACK too short
    (0x82, b"\x00\x01"),                          # SUBSCRIBE without filters
    (0x80, b"\x00\x01\x00\x01a\x01"),             # SUBSCRIBE with wrong reserved flags
    (0x82, b"\x00\x01\x00\x01a\x03"),             # SUBSCRIBE QoS 3
    (0x10, b"\x00\x04MQTT\x03\x02\x00\x3c"),      # unsupported protocol level
    (0x10, b"\x00\x04MQTX\x04\x02\x00\x3c\x00\x00"),
    (0x30, b"\x00\x02\xff\xfe"),                  # invalid UTF-8
    (0xC0, b"\x00"),                              # trailing bytes after PINGREQ
    (0xF0, b""),                                  # AUTH not supported
])
def test_malformed_packets_raise(first, body):
    with pytest.raises(MalformedPacket):
        decode(first, body, MQTT311)


def test_malformed_mqtt5_properties_raise():
    # PUBLISH with property id 0x7f (unknown)
    with pytest.raises(MalformedPacket):
        decode(0x32, b"\x00\x01a\x00\x01\x02\x7f\x00", MQTT5)
    # properties length longer than the packet
    with pytest.raises(MalformedPacket):
        decode(0x32, b"\x00\x01a\x00\x01\x09\x02\x00", MQTT5)


def test_bad_protocol_level_carries_reason_code():
    with pytest.raises(MalformedPacket) as caught:
        decode(0x10, b"\x00\x04MQTT\x03\x02\x00\x3c\x00\x00", MQTT311)
    assert caught.value.reason_code == codec.RC_UNSUPPORTED_PROTOCOL_VERSION


def test_varint_boundaries():
    for value in (0, 127, 128, 16383, 16384, 2097151, 2097152, codec.MAX_REMAINING_LENGTH):
        encoded = codec.encode_varint(value)
        assert len(encoded) == (1 if value < 128 else 2 if value < 16384 else 3 if value < 2097152 else 4)
    with pytest.raises(ValueError):
        codec.encode_varint(codec.MAX_REMAINING_LENGTH + 1)


@pytest.mark.parametrize("topic_filter,topic,expected", [
    ("europe/ua/kyiv/1/+", "europe/ua/kyiv/1/0", True),
    ("europe/ua/kyiv/1/+", "europe/ua/kyiv/2/0", False),
    ("europe/ua/kyiv/1/+", "europe/ua/kyiv/1/0/x", False),
    ("a/#", "a", True),
    ("a/#", "a/b/c", True),
    ("#", "a/b", True),
    ("#", "$SYS/x", False),
    ("+/b", "/b", True),
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
])
def test_topic_matching(topic_filter, topic, expected):
    assert topic_matches(topic_filter, topic) is expected


def test_filter_validation():
    assert valid_filter("a/+/b/#") and valid_filter("#") and valid_filter("+")
    assert not valid_filter("a/#/b") and not valid_filter("a+/b") and not valid_filter("") and not valid_filter("a/b#")


@pytest.mark.parametrize("declared", [1, 2, 4])
def test_property_length_shorter_than_its_property_is_malformed(declared):
    """A CONNECT whose property length cuts Receive Maximum (3 bytes) short: paho would read the whole
    property and shift the rest of the packet; the codec hands it only the declared bytes."""
    props = Properties(PacketTypes.CONNECT)
    props.ReceiveMaximum = 10
    data = bytearray(encode(Connect(MQTT5, "c", True, 30, props), MQTT5))
    assert data[12] == 3
    data[12] = declared  # 4: the property length reaches into the client id
    (first, body), = split_packets(bytes(data))
    with pytest.raises(MalformedPacket) as caught:
        decode(first, body)
    assert caught.value.reason_code == codec.RC_MALFORMED_PACKET


def test_property_length_matching_its_properties_decodes():
    """The near miss of the test above: the declared length is the properties' length."""
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 60
    props.UserProperty = ("k", "v")
    (first, body), = split_packets(encode(Publish("t/1", b"x", 1, packet_id=3, properties=props), MQTT5))
    packet = decode(first, body, MQTT5)
    assert packet.prop("MessageExpiryInterval") == 60 and packet.payload == b"x"


def test_publish_property_length_shorter_than_its_property_is_malformed():
    """PUBLISH whose property length (3) cuts Message Expiry Interval (5 bytes) short: the old codec let paho
    read the whole property and took the rest as payload -- accepted, with a shifted payload."""
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 60
    data = bytearray(encode(Publish("t/1", b"", 0, properties=props), MQTT5))
    assert data[7] == 5
    data[7] = 3
    (first, body), = split_packets(bytes(data))
    with pytest.raises(MalformedPacket):
        decode(first, body, MQTT5)


def test_whole_packets_leaves_out_a_partial_tail():
    """What a reset leaves in the reader's buffer: whole packets, then maybe part of one (connection.py's
    _acks_left_buffered reads only the whole ones)."""
    acks = b"".join(encode(Ack(codec.PUBACK, pid), MQTT5) for pid in (1, 2, 300))
    publish = encode(Publish("a/b", b"x" * 200, 1, packet_id=7), MQTT5)
    for cut in range(len(publish)):
        packets = whole_packets(acks + publish[:cut])
        assert [decode(f, b, MQTT5).packet_id for f, b in packets] == [1, 2, 300]
    assert len(whole_packets(acks + publish)) == 4
    assert whole_packets(b"") == [] and whole_packets(b"\x40") == []
