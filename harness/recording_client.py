"""A small synchronous MQTT client on paho-mqtt that records every delivery it sees (packet id, DUP,
QoS, expiry, arrival time), with manual acks and abrupt drops: the integration tests, the broker
benchmarks and ``ordeal up --check`` drive a broker with it as a real peer (MQTT 3.1.1 or 5.0).

It lives in the harness, not in the broker it tests, and shares no code with that broker: paho encodes
and decodes every packet."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


@dataclass(frozen=True)
class Delivery:
    packet_id: int
    topic: str
    payload: bytes
    qos: int
    dup: bool
    expiry: int | None   # MQTT 5 message expiry interval as received
    at: float            # time.monotonic() on arrival


class Probe:
    def __init__(self, host: str, port: int, client_id: str, *, version: int = 5, auto_ack: bool = True,
                 receive_maximum: int | None = None, maximum_packet_size: int | None = None) -> None:
        self.host, self.port, self.client_id, self.version = host, port, client_id, version
        self.auto_ack = auto_ack
        self.receive_maximum = receive_maximum
        self.maximum_packet_size = maximum_packet_size
        self.connack_properties: Properties | None = None
        self.deliveries: list[Delivery] = []
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
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, clean_session=None if v5 else clean)
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
        expiry = None
        if self.version == 5 and message.properties is not None:
            expiry = getattr(message.properties, "MessageExpiryInterval", None)
        with self._lock:
            self.deliveries.append(Delivery(message.mid, message.topic, message.payload, message.qos,
                                            bool(message.dup), expiry, time.monotonic()))
            self._lock.notify_all()

    def disconnect(self) -> None:
        """Clean DISCONNECT."""
        if self.client is not None:
            self.client.disconnect()
            self._disconnected.wait(5)
            self.client.loop_stop()
            self.client = None

    def drop(self) -> None:
        """Abrupt: close the socket without DISCONNECT (as a crashed device would)."""
        if self.client is not None:
            sock = self.client.socket()
            self.client.loop_stop()
            if sock is not None:
                sock.close()
            self.client = None

    # ------------------------------------------------------------ traffic
    def subscribe(self, topic_filter: str, qos: int = 1, timeout: float = 10.0, no_local: bool = False) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *args: done.set()
        if no_local:
            self.client.subscribe(topic_filter, options=mqtt.SubscribeOptions(qos=qos, noLocal=True))
        else:
            self.client.subscribe(topic_filter, qos)
        if not done.wait(timeout):
            raise TimeoutError(f"{self.client_id}: no SUBACK for {topic_filter}")

    def publish(self, topic: str, payload: bytes, qos: int = 1, expiry: int | None = None,
                timeout: float = 15.0) -> mqtt.MQTTMessageInfo:
        props = None
        if expiry is not None:
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = expiry
        info = self.client.publish(topic, payload, qos, properties=props)
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
