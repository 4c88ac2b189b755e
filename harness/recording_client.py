"""A small synchronous MQTT client on paho-mqtt that records every delivery it sees (packet id, DUP,
QoS, RETAIN, expiry, forwarded properties, subscription identifiers, packet size, arrival time) and the
QoS 2 flow's PUBREC'ed PUBLISHes and PUBRELs, with manual acks and abrupt drops: the integration tests, the
broker benchmarks and ``ordeal up --check`` drive a broker with it as a real peer (MQTT 3.1.1 or 5.0).

It lives in the harness, not in the broker it tests, and shares no code with that broker: paho encodes
and decodes every packet."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from contracts.mqtt_properties import forwarded_json
from harness.clients import packet_size


@dataclass(frozen=True)
class Delivery:
    packet_id: int
    topic: str
    payload: bytes
    qos: int
    dup: bool
    expiry: int | None   # MQTT 5 message expiry interval as received
    at: float            # time.monotonic() on arrival
    retain: bool = False
    props: str | None = None          # contracts/mqtt_properties.forwarded_json of the received properties
    sub_ids: tuple[int, ...] = ()     # MQTT 5 Subscription Identifiers, in the order received
    packet_size: int | None = None    # the whole PUBLISH packet, bytes


class _Client(mqtt.Client):
    """paho's client, telling the Probe each PUBLISH's size, each QoS 2 PUBLISH it answered with PUBREC and each
    PUBREL; with ``hold_releases`` a PUBREL is left unanswered (no release, no PUBCOMP)."""

    probe: Probe | None = None
    hold_releases = False
    publish_size: int | None = None  # of the PUBLISH being handled (on_message runs inside for QoS 0 / 1)

    def _handle_publish(self) -> mqtt.MQTTErrorCode:
        packet = bytes(self._in_packet["packet"])
        self.publish_size = packet_size(len(packet))
        rc = super()._handle_publish()
        qos = (self._in_packet["command"] & 0x06) >> 1
        if qos == 2 and self.probe is not None:
            after_topic = 2 + int.from_bytes(packet[:2], "big")
            mid = int.from_bytes(packet[after_topic:after_topic + 2], "big")
            with self._in_message_mutex:
                message = self._in_messages.get(mid)
            if message is not None:
                self.probe.sizes[mid] = self.publish_size
                self.probe._record(self.probe.qos2_received, message, self.publish_size)
        return rc

    def _handle_pubrel(self) -> mqtt.MQTTErrorCode:
        mid = int.from_bytes(bytes(self._in_packet["packet"][:2]), "big")
        with self._in_message_mutex:
            known = mid in self._in_messages
        if self.probe is not None:
            with self.probe._lock:
                self.probe.pubrels.append((mid, known))
                self.probe._lock.notify_all()
        if self.hold_releases:
            return mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
        self.publish_size = self.probe.sizes.pop(mid, None) if self.probe is not None else None
        rc = super()._handle_pubrel()
        if not known and self._manual_ack and rc == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS:
            return self._send_pubcomp(mid)  # as the harness's client does ([MQTT-4.3.3])
        return rc


class Probe:
    def __init__(self, host: str, port: int, client_id: str, *, version: int = 5, auto_ack: bool = True,
                 receive_maximum: int | None = None, maximum_packet_size: int | None = None) -> None:
        self.host, self.port, self.client_id, self.version = host, port, client_id, version
        self.auto_ack = auto_ack
        self.receive_maximum = receive_maximum
        self.maximum_packet_size = maximum_packet_size
        self.connack_properties: Properties | None = None
        self.deliveries: list[Delivery] = []
        self.qos2_received: list[Delivery] = []   # QoS 2 PUBLISHes answered with PUBREC (delivered at PUBREL)
        self.pubrels: list[tuple[int, bool]] = []  # (packet id, known: a message was held for it)
        self.sizes: dict[int, int] = {}            # packet id -> size of a QoS 2 PUBLISH awaiting its PUBREL
        self.hold_releases = False                 # leave PUBRELs unanswered (see _Client)
        self.dropped: mqtt.Client | None = None    # the last ended connection's client (its unreleased QoS 2)
        self.session_present: bool | None = None
        self.connect_reason: int | None = None
        self.disconnect_reason: int | None = None
        self._lock = threading.Condition()
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        self.client: mqtt.Client | None = None

    # ------------------------------------------------------------ connection
    def connect(self, clean: bool, session_expiry: int | None = None, timeout: float = 10.0) -> bool:
        v5 = self.version == 5
        client = _Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                         protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, clean_session=None if v5 else clean)
        client.probe = self
        client.hold_releases = self.hold_releases
        previous, self.dropped = self.dropped, None
        if previous is not None and not clean:
            # the QoS 2 messages answered with PUBREC on the last connection: a resumed session releases them
            with previous._in_message_mutex:
                client._in_messages.update({m: msg for m, msg in previous._in_messages.items() if msg.qos == 2})
        client.manual_ack_set(not self.auto_ack)
        client.max_inflight_messages_set(65535)
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        client.on_disconnect = self._on_disconnect
        self._connected.clear()
        self._disconnected.clear()
        self.client = client
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                props.SessionExpiryInterval = session_expiry
            if self.receive_maximum:
                props.ReceiveMaximum = self.receive_maximum
            if self.maximum_packet_size:
                props.MaximumPacketSize = self.maximum_packet_size
            client.connect(self.host, self.port, keepalive=30, clean_start=clean, properties=props)
        else:
            client.connect(self.host, self.port, keepalive=30)
        client.loop_start()
        if not self._connected.wait(timeout):
            self.drop()
            raise TimeoutError(f"{self.client_id}: no CONNACK from {self.host}:{self.port} in {timeout} s")
        if self.connect_reason:
            raise ConnectionError(f"{self.client_id}: CONNACK reason {self.connect_reason}")
        return bool(self.session_present)

    def _on_connect(self, client, userdata, flags, reason_code, properties=None) -> None:
        self.session_present = bool(flags.session_present)
        self.connack_properties = properties
        self.connect_reason = reason_code.value if hasattr(reason_code, "value") else int(reason_code)
        self._connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties=None) -> None:
        self.disconnect_reason = reason_code.value if hasattr(reason_code, "value") else reason_code
        self._disconnected.set()

    def _on_message(self, client, userdata, message) -> None:
        self._record(self.deliveries, message, getattr(client, "publish_size", None))

    def _record(self, into: list[Delivery], message: mqtt.MQTTMessage, size: int | None) -> None:
        expiry, props, sub_ids = None, None, ()
        if self.version == 5 and message.properties is not None:
            expiry = getattr(message.properties, "MessageExpiryInterval", None)
            props = forwarded_json(message.properties)
            sub_ids = tuple(getattr(message.properties, "SubscriptionIdentifier", ()))
        with self._lock:
            into.append(Delivery(message.mid, message.topic, message.payload, message.qos, bool(message.dup),
                                 expiry, time.monotonic(), bool(message.retain), props, sub_ids, size))
            self._lock.notify_all()

    def hold(self, on: bool = True) -> None:
        """Leave PUBRELs unanswered from now on (True) or answer them again (False), on this connection and the
        next ones."""
        self.hold_releases = on
        if self.client is not None:
            self.client.hold_releases = on

    def disconnect(self) -> None:
        """Clean DISCONNECT."""
        if self.client is not None:
            self.client.disconnect()
            self._disconnected.wait(5)
            self.client.loop_stop()
            self.dropped, self.client = self.client, None

    def drop(self) -> None:
        """Abrupt: close the socket without DISCONNECT (as a crashed device would).  The last client is kept
        (``self.client`` stays) so that the next ``connect(clean=False)`` carries its unreleased QoS 2 messages."""
        if self.client is not None:
            sock = self.client.socket()
            self.client.loop_stop()
            if sock is not None:
                sock.close()
            self.dropped, self.client = self.client, None

    # ------------------------------------------------------------ traffic
    def subscribe(self, topic_filter: str, qos: int = 1, timeout: float = 10.0, no_local: bool = False,
                  sub_id: int | None = None, rap: bool = False) -> list[int]:
        """SUBSCRIBE one filter (MQTT 5 options: No Local, Retain As Published, a Subscription Identifier);
        returns the SUBACK's reason codes."""
        done = threading.Event()
        codes: list[int] = []

        def on_subscribe(client, userdata, mid, reason_codes, properties=None) -> None:
            codes.extend(int(getattr(c, "value", c)) for c in reason_codes)
            done.set()

        self.client.on_subscribe = on_subscribe
        properties = None
        if sub_id is not None:
            properties = Properties(PacketTypes.SUBSCRIBE)
            properties.SubscriptionIdentifier = sub_id
        if no_local or rap or sub_id is not None:
            options = mqtt.SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap)
            self.client.subscribe(topic_filter, options=options, properties=properties)
        else:
            self.client.subscribe(topic_filter, qos)
        if not done.wait(timeout):
            raise TimeoutError(f"{self.client_id}: no SUBACK for {topic_filter}")
        return codes

    def publish(self, topic: str, payload: bytes, qos: int = 1, expiry: int | None = None,
                timeout: float = 15.0, properties: Properties | None = None,
                retain: bool = False) -> mqtt.MQTTMessageInfo:
        """PUBLISH; ``properties``: MQTT 5 PUBLISH properties (``expiry`` is added to them)."""
        props = properties
        if expiry is not None:
            props = props if props is not None else Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = expiry
        info = self.client.publish(topic, payload, qos, retain=retain, properties=props)
        if qos and timeout:
            info.wait_for_publish(timeout)
            if not info.is_published():
                raise TimeoutError(f"{self.client_id}: publish {payload[:20]!r} not acknowledged in {timeout} s")
        return info

    def ack(self, delivery: Delivery) -> None:
        self.client.ack(delivery.packet_id, delivery.qos)

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.deliveries) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return list(self.deliveries)

    def settle(self, quiet: float = 0.7, timeout: float = 10.0) -> list[Delivery]:
        """Wait until nothing new arrived for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline:
            with self._lock:
                count = len(self.deliveries)
            if count == seen:
                break
            seen = count
            time.sleep(quiet)
        return list(self.deliveries)

    def clear(self) -> None:
        with self._lock:
            self.deliveries.clear()
            self.qos2_received.clear()
            self.pubrels.clear()
