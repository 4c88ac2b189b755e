"""MQTT 3.1.1 (protocol level 4) and 5.0 (level 5) packets: decode what a broker receives, encode what it
sends (and, for tests and tools, the client side too).

MQTT 5 properties and their wire format come from paho-mqtt (``paho.mqtt.properties.Properties``); the
fixed header, variable headers and payloads are the minimum written here.  Any structural problem raises
``MalformedPacket`` with a reason code; the server then closes that one connection (DISCONNECT 0x81 on
MQTT 5) and nothing else.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

MQTT311 = 4
MQTT5 = 5

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

# MQTT 5 reason codes the broker sends
RC_SUCCESS = 0x00
RC_DISCONNECT_WITH_WILL = 0x04
RC_NO_MATCHING_SUBSCRIBERS = 0x10
RC_UNSPECIFIED_ERROR = 0x80
RC_MALFORMED_PACKET = 0x81
RC_PROTOCOL_ERROR = 0x82
RC_IMPLEMENTATION_SPECIFIC = 0x83
RC_UNSUPPORTED_PROTOCOL_VERSION = 0x84
RC_CLIENT_ID_NOT_VALID = 0x85
RC_SERVER_UNAVAILABLE = 0x88
RC_SESSION_TAKEN_OVER = 0x8E
RC_TOPIC_FILTER_INVALID = 0x8F
RC_TOPIC_NAME_INVALID = 0x90
RC_PACKET_ID_NOT_FOUND = 0x92
RC_RECEIVE_MAXIMUM_EXCEEDED = 0x93
RC_PACKET_TOO_LARGE = 0x95
RC_KEEP_ALIVE_TIMEOUT = 0x8D
RC_TOPIC_ALIAS_INVALID = 0x94
RC_RETAIN_NOT_SUPPORTED = 0x9A
RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
RC_SUBSCRIPTION_IDS_NOT_SUPPORTED = 0xA1
RC_BAD_AUTHENTICATION_METHOD = 0x8C

MAX_REMAINING_LENGTH = 268_435_455


class MalformedPacket(ValueError):
    def __init__(self, message: str, reason_code: int = RC_MALFORMED_PACKET) -> None:
        super().__init__(message)
        self.reason_code = reason_code


# ---------------------------------------------------------------- packets
@dataclass
class Connect:
    protocol_level: int
    client_id: str
    clean_start: bool
    keep_alive: int
    properties: Properties | None = None
    will_topic: str | None = None
    will_payload: bytes | None = None
    will_qos: int = 0
    will_retain: bool = False
    will_properties: Properties | None = None   # MQTT 5 Will Properties (Will Delay Interval, expiry, ...)
    username: str | None = None
    password: bytes | None = None

    def prop(self, name: str, default=None):
        return getattr(self.properties, name, default) if self.properties is not None else default


@dataclass
class ConnAck:
    session_present: bool
    reason_code: int
    properties: Properties | None = None


@dataclass
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties | None = None

    def prop(self, name: str, default=None):
        return getattr(self.properties, name, default) if self.properties is not None else default


@dataclass
class Ack:
    """PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK-less acks: a packet id and, on MQTT 5, a reason code."""

    packet_type: int
    packet_id: int
    reason_code: int = RC_SUCCESS
    properties: Properties | None = None


@dataclass
class Subscribe:
    packet_id: int
    topics: list[tuple[str, int]]  # (filter, options byte: QoS in bits 0-1, MQTT 5 flags above)
    properties: Properties | None = None


@dataclass
class SubAck:
    packet_id: int
    reason_codes: list[int]
    properties: Properties | None = None


@dataclass
class Unsubscribe:
    packet_id: int
    topics: list[str]
    properties: Properties | None = None


@dataclass
class UnsubAck:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties | None = None


@dataclass
class Simple:
    """PINGREQ, PINGRESP (no body)."""

    packet_type: int


@dataclass
class Disconnect:
    reason_code: int = RC_SUCCESS
    properties: Properties | None = None

    def prop(self, name: str, default=None):
        return getattr(self.properties, name, default) if self.properties is not None else default


Packet = Connect | ConnAck | Publish | Ack | Subscribe | SubAck | Unsubscribe | UnsubAck | Simple | Disconnect


# ---------------------------------------------------------------- primitives
def encode_varint(value: int) -> bytes:
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class _Reader:
    """A cursor over one packet body; every read past the end is a malformed packet."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise MalformedPacket(f"packet ends early: wanted {n} bytes, {self.remaining()} left")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("!H", self.take(2))[0]

    def binary(self) -> bytes:
        return self.take(self.u16())

    def utf8(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("invalid UTF-8 string") from None
        if "\x00" in text:
            raise MalformedPacket("UTF-8 string contains U+0000")
        return text

    def varint(self) -> int:
        multiplier, value = 1, 0
        for _ in range(4):
            byte = self.byte()
            value += (byte & 0x7F) * multiplier
            if not byte & 0x80:
                return value
            multiplier *= 128
        raise MalformedPacket("variable byte integer longer than 4 bytes")

    def properties(self, packet_type: int) -> Properties:
        start = self.pos
        length = self.varint()
        header = self.pos - start
        if length > self.remaining():
            raise MalformedPacket(f"property length {length} runs past the end of the packet "
                                  f"({self.remaining()} bytes left)")
        # paho parses up to the declared length but not *within* it: a property that starts inside the
        # declared length and ends after it would be read whole (and the rest of the packet shifted).  So it
        # only ever sees the declared bytes, and must consume exactly them ([MQTT-2.2.2], 0x81 otherwise).
        window = self.data[start:start + header + length]
        props = Properties(packet_type)
        try:
            _, used = props.unpack(window)
        except MalformedPacket:
            raise
        except Exception as error:  # paho raises KeyError/IndexError/MQTTException/struct.error on bad input
            text = str(error)
            # a value out of its range (Receive Maximum 0, ...) or a property given twice is a protocol error
            code = RC_PROTOCOL_ERROR if "must be in the range" in text or "more than once" in text else \
                RC_MALFORMED_PACKET
            raise MalformedPacket(f"bad properties: {error!r}", code) from None
        if used != header + length or len(props.pack()) != header + length:
            raise MalformedPacket(f"properties do not fill their declared length {length}")
        self.pos = start + header + length
        return props


def _utf8(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 65535:
        raise ValueError("string longer than 65535 bytes")
    return struct.pack("!H", len(raw)) + raw


def _binary(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def _props(props: Properties | None, packet_type: int) -> bytes:
    return (props if props is not None else Properties(packet_type)).pack()


def _frame(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + encode_varint(len(body)) + body


# ---------------------------------------------------------------- reading from a stream
class LostBetweenPackets(ConnectionResetError):
    """The connection failed (a reset) while no packet was half read: what the reader still buffers starts at
    a packet boundary."""


async def read_packet(reader: asyncio.StreamReader, max_size: int = 1 << 20) -> tuple[int, bytes]:
    """Read one packet's fixed header and body. Raises IncompleteReadError on EOF, MalformedPacket on a
    bad remaining length, LostBetweenPackets when the connection failed before the packet's first byte."""
    try:
        first = (await reader.readexactly(1))[0]
    except ConnectionError as error:
        raise LostBetweenPackets(str(error)) from error
    multiplier, length = 1, 0
    for _ in range(4):
        byte = (await reader.readexactly(1))[0]
        length += (byte & 0x7F) * multiplier
        if not byte & 0x80:
            break
        multiplier *= 128
    else:
        raise MalformedPacket("remaining length longer than 4 bytes")
    if length > max_size:
        raise MalformedPacket(f"packet of {length} bytes exceeds the maximum {max_size}", RC_PACKET_TOO_LARGE)
    body = await reader.readexactly(length) if length else b""
    return first, body


def whole_packets(data: bytes) -> list[tuple[int, bytes]]:
    """The complete packets at the start of ``data`` (a partial one at its end is left out)."""
    out, pos = [], 0
    while pos + 2 <= len(data):
        multiplier, length, at = 1, 0, pos + 1
        while True:
            if at >= len(data) or at - pos > 4:
                return out
            byte = data[at]
            at += 1
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            if not byte & 0x80:
                break
        if at + length > len(data):
            return out
        out.append((data[pos], bytes(data[at:at + length])))
        pos = at + length
    return out


def split_packets(data: bytes) -> list[tuple[int, bytes]]:
    """Split a byte string holding whole packets (for tests)."""
    out, pos = [], 0
    while pos < len(data):
        first = data[pos]
        pos += 1
        multiplier, length = 1, 0
        while True:
            byte = data[pos]
            pos += 1
            length += (byte & 0x7F) * multiplier
            if not byte & 0x80:
                break
            multiplier *= 128
        out.append((first, data[pos:pos + length]))
        pos += length
    return out


# ---------------------------------------------------------------- decoding
def decode(first_byte: int, body: bytes, version: int = MQTT311) -> Packet:
    """Decode one packet (fixed header's first byte + body). ``version`` matters for everything but
    CONNECT, which carries its own protocol level."""
    packet_type, flags = first_byte >> 4, first_byte & 0x0F
    r = _Reader(body)
    v5 = version == MQTT5
    if packet_type == CONNECT:
        packet = _decode_connect(r, flags)
    elif packet_type == PUBLISH:
        packet = _decode_publish(r, flags, v5)
    elif packet_type in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        expected = 0x02 if packet_type == PUBREL else 0
        if flags != expected:
            raise MalformedPacket(f"{PacketTypes.Names[packet_type]} with reserved flags {flags:#x}")
        packet_id = r.u16()
        reason, props = RC_SUCCESS, None
        if v5 and r.remaining():
            reason = r.byte()
            if r.remaining():
                props = r.properties(packet_type)
        packet = Ack(packet_type, packet_id, reason, props)
    elif packet_type == SUBSCRIBE:
        if flags != 0x02:
            raise MalformedPacket(f"SUBSCRIBE with reserved flags {flags:#x}")
        packet_id = r.u16()
        props = r.properties(SUBSCRIBE) if v5 else None
        topics = []
        while r.remaining():
            topic = r.utf8()
            options = r.byte()
            if (options & 0x03) == 3 or (options & (0xC0 if v5 else 0xFC)):
                raise MalformedPacket(f"SUBSCRIBE options byte {options:#x} invalid")
            topics.append((topic, options))
        if not topics:
            raise MalformedPacket("SUBSCRIBE without topic filters", RC_PROTOCOL_ERROR)
        packet = Subscribe(packet_id, topics, props)
    elif packet_type == UNSUBSCRIBE:
        if flags != 0x02:
            raise MalformedPacket(f"UNSUBSCRIBE with reserved flags {flags:#x}")
        packet_id = r.u16()
        props = r.properties(UNSUBSCRIBE) if v5 else None
        topics = []
        while r.remaining():
            topics.append(r.utf8())
        if not topics:
            raise MalformedPacket("UNSUBSCRIBE without topic filters", RC_PROTOCOL_ERROR)
        packet = Unsubscribe(packet_id, topics, props)
    elif packet_type in (PINGREQ, PINGRESP):
        packet = Simple(packet_type)
    elif packet_type == DISCONNECT:
        reason, props = RC_SUCCESS, None
        if v5 and r.remaining():
            reason = r.byte()
            if r.remaining():
                props = r.properties(DISCONNECT)
        packet = Disconnect(reason, props)
    elif packet_type == CONNACK:
        ack_flags = r.byte()
        reason = r.byte()
        props = r.properties(CONNACK) if v5 else None
        packet = ConnAck(bool(ack_flags & 1), reason, props)
    elif packet_type == SUBACK:
        packet_id = r.u16()
        props = r.properties(SUBACK) if v5 else None
        packet = SubAck(packet_id, list(r.take(r.remaining())), props)
    elif packet_type == UNSUBACK:
        packet_id = r.u16()
        props = r.properties(UNSUBACK) if v5 else None
        packet = UnsubAck(packet_id, list(r.take(r.remaining())) if v5 else [], props)
    else:
        raise MalformedPacket(f"packet type {packet_type} not supported", RC_PROTOCOL_ERROR)
    if r.remaining():
        raise MalformedPacket(f"{r.remaining()} trailing bytes after {type(packet).__name__}")
    return packet


def _decode_connect(r: _Reader, flags: int) -> Connect:
    if flags:
        raise MalformedPacket(f"CONNECT with reserved flags {flags:#x}")
    name = r.utf8()
    level = r.byte()
    if name != "MQTT" or level not in (MQTT311, MQTT5):
        raise MalformedPacket(f"protocol {name!r} level {level} not supported", RC_UNSUPPORTED_PROTOCOL_VERSION)
    connect_flags = r.byte()
    if connect_flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")
    keep_alive = r.u16()
    v5 = level == MQTT5
    props = r.properties(CONNECT) if v5 else None
    client_id = r.utf8()
    packet = Connect(level, client_id, bool(connect_flags & 0x02), keep_alive, props)
    will = bool(connect_flags & 0x04)
    will_qos = (connect_flags >> 3) & 0x03
    if will_qos == 3 or (not will and (will_qos or connect_flags & 0x20)):
        raise MalformedPacket("CONNECT will flags invalid")
    if will:
        if v5:
            packet.will_properties = r.properties(PacketTypes.WILLMESSAGE)
        packet.will_topic = r.utf8()
        packet.will_payload = r.binary()
        packet.will_qos = will_qos
        packet.will_retain = bool(connect_flags & 0x20)
    if connect_flags & 0x80:
        packet.username = r.utf8()
    if connect_flags & 0x40:
        packet.password = r.binary()
    return packet


def _decode_publish(r: _Reader, flags: int, v5: bool) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH QoS 0 with DUP set")
    topic = r.utf8()
    if "+" in topic or "#" in topic:
        raise MalformedPacket(f"PUBLISH topic {topic!r} contains wildcards", RC_TOPIC_NAME_INVALID)
    packet_id = None
    if qos:
        packet_id = r.u16()
        if packet_id == 0:
            raise MalformedPacket("PUBLISH with packet id 0", RC_PROTOCOL_ERROR)
    props = r.properties(PUBLISH) if v5 else None
    if not topic and (props is None or getattr(props, "TopicAlias", None) is None):
        raise MalformedPacket("PUBLISH with empty topic", RC_TOPIC_NAME_INVALID)
    payload = r.take(r.remaining())
    return Publish(topic, payload, qos, bool(flags & 0x01), dup, packet_id, props)


# ---------------------------------------------------------------- encoding
def encode(packet: Packet, version: int = MQTT311) -> bytes:
    v5 = version == MQTT5
    if isinstance(packet, Publish):
        flags = (0x08 if packet.dup else 0) | (packet.qos << 1) | (0x01 if packet.retain else 0)
        body = _utf8(packet.topic)
        if packet.qos:
            body += struct.pack("!H", packet.packet_id)
        if v5:
            body += _props(packet.properties, PUBLISH)
        return _frame((PUBLISH << 4) | flags, body + packet.payload)
    if isinstance(packet, Ack):
        body = struct.pack("!H", packet.packet_id)
        if v5 and (packet.reason_code != RC_SUCCESS or (packet.properties and not packet.properties.isEmpty())):
            body += bytes([packet.reason_code])
            if packet.properties is not None and not packet.properties.isEmpty():
                body += packet.properties.pack()
        flags = 0x02 if packet.packet_type == PUBREL else 0
        return _frame((packet.packet_type << 4) | flags, body)
    if isinstance(packet, ConnAck):
        body = bytes([1 if packet.session_present else 0, packet.reason_code])
        if v5:
            body += _props(packet.properties, CONNACK)
        return _frame(CONNACK << 4, body)
    if isinstance(packet, SubAck):
        body = struct.pack("!H", packet.packet_id)
        if v5:
            body += _props(packet.properties, SUBACK)
        return _frame(SUBACK << 4, body + bytes(packet.reason_codes))
    if isinstance(packet, UnsubAck):
        body = struct.pack("!H", packet.packet_id)
        if v5:
            body += _props(packet.properties, UNSUBACK) + bytes(packet.reason_codes)
        return _frame(UNSUBACK << 4, body)
    if isinstance(packet, Simple):
        return bytes([packet.packet_type << 4, 0])
    if isinstance(packet, Disconnect):
        body = b""
        if v5 and (packet.reason_code != RC_SUCCESS or (packet.properties and not packet.properties.isEmpty())):
            body = bytes([packet.reason_code])
            if packet.properties is not None and not packet.properties.isEmpty():
                body += packet.properties.pack()
        return _frame(DISCONNECT << 4, body)
    if isinstance(packet, Connect):
        v5 = packet.protocol_level == MQTT5
        flags = 0x02 if packet.clean_start else 0
        if packet.will_topic is not None:
            flags |= 0x04 | (packet.will_qos << 3) | (0x20 if packet.will_retain else 0)
        if packet.username is not None:
            flags |= 0x80
        if packet.password is not None:
            flags |= 0x40
        body = _utf8("MQTT") + bytes([packet.protocol_level, flags]) + struct.pack("!H", packet.keep_alive)
        if v5:
            body += _props(packet.properties, CONNECT)
        body += _utf8(packet.client_id)
        if packet.will_topic is not None:
            if v5:
                body += (packet.will_properties or Properties(PacketTypes.WILLMESSAGE)).pack()
            body += _utf8(packet.will_topic) + _binary(packet.will_payload or b"")
        if packet.username is not None:
            body += _utf8(packet.username)
        if packet.password is not None:
            body += _binary(packet.password)
        return _frame(CONNECT << 4, body)
    if isinstance(packet, Subscribe):
        body = struct.pack("!H", packet.packet_id)
        if v5:
            body += _props(packet.properties, SUBSCRIBE)
        for topic, options in packet.topics:
            body += _utf8(topic) + bytes([options])
        return _frame((SUBSCRIBE << 4) | 0x02, body)
    if isinstance(packet, Unsubscribe):
        body = struct.pack("!H", packet.packet_id)
        if v5:
            body += _props(packet.properties, UNSUBSCRIBE)
        for topic in packet.topics:
            body += _utf8(topic)
        return _frame((UNSUBSCRIBE << 4) | 0x02, body)
    raise TypeError(f"cannot encode {packet!r}")


# ---------------------------------------------------------------- topics
def valid_filter(topic_filter: str) -> bool:
    if not topic_filter or "\x00" in topic_filter:
        return False
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching with + (one level) and # (this level and below); $-topics need an explicit $ level."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for index, f_level in enumerate(f_levels):
        if f_level == "#":
            return True
        if index >= len(t_levels):
            return False
        if f_level != "+" and f_level != t_levels[index]:
            return False
    return len(f_levels) == len(t_levels)
