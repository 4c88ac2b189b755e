"""One MQTT client connection: the protocol state machine (CONNECT to DISCONNECT, publisher and
subscriber side) and its delivery loop.  What it asks of the node that accepted it is declared in
``NodeForConnections``; the node (server.py) composes connections, they do not import it.

Delivery to a persistent session never takes messages from the fan-out directly: live notifications are
only hints that wake the loop, and the loop reads the client's Redis ZSET in score order from a cursor.
So the backlog is always sent before anything newer (no overtaking), order across packet-id wraparound
comes from the score, and a lost hint is recovered by the periodic re-check.  The read script records
each entry as sent before it goes out, so a resend after a reconnect carries DUP = 1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import math
import time
import traceback
import uuid
from collections import Counter, OrderedDict, deque
from typing import Any, Protocol

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from redis.exceptions import RedisError

from reference_broker import codec
from reference_broker.application import APPLICATION, DEVICE, ApplicationDelivery, classify
from reference_broker.codec import (
    MQTT5,
    Ack,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    Publish,
    Simple,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from reference_broker.config import BrokerConfig
from reference_broker.shared_subs import SharedFilterError, granted_shared_qos, is_shared, parse_shared
from reference_broker.store import SessionStore

# the logger's name is part of the broker's log format (tests and stored runs' logs carry it), not a module path
log = logging.getLogger("reference_broker.session")

NEVER_EXPIRES = 0xFFFFFFFF
MAX_LIVE_QUEUE = 100_000  # messages routed live to one connection and not yet sent (a stuck non-persistent reader)


class ProtocolViolation(Exception):
    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class NodeForConnections(Protocol):
    """What a connection asks of the broker node that accepted it (server.py's Broker)."""

    config: BrokerConfig
    store: SessionStore
    stats: Counter[str]
    kafka_bootstrap: str

    async def ensure_app_topic(self, topic: str) -> None: ...

    async def prepare_shared(self, conn: Connection, shared_text: str) -> None: ...

    def join_shared(self, conn: Connection, shared_text: str, qos: int) -> None: ...

    def leave_shared(self, conn: Connection, shared_text: str) -> None: ...

    def shared_ack(self, conn: Connection, pid: int, entry: tuple[str, str]) -> None: ...

    async def open_session(self, conn: Connection, clean_start: bool) -> bool: ...

    async def save_subscriptions(self, conn: Connection) -> None: ...

    async def connection_lost(self, conn: Connection) -> None: ...

    async def produce_incoming(self, message: dict[str, Any]) -> asyncio.Future: ...

    def retain_after(self, produced: asyncio.Future, message: dict[str, Any]) -> asyncio.Future: ...



def leaked_redis_transport_error(error: BaseException) -> bool:
    """Whether ``error`` is redis-py's asyncio client writing to a connection its Redis node closed (a node
    killed mid-request): redis-py lets the transport's own error out -- an AttributeError ('NoneType' object has
    no attribute 'writelines'), a TypeError, or uvloop's RuntimeError ("unable to perform operation on
    <TCPTransport closed=True ...>") -- instead of its ConnectionError (redis-py issue #4287).  The same outage
    as a RedisError, so it is treated like one; any other error of these types is still a broker error."""
    if not isinstance(error, (AttributeError, TypeError, RuntimeError)):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    return any("/redis/asyncio/" in frame.filename for frame in frames)

class Connection:
    def __init__(self, broker: NodeForConnections, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.broker = broker
        self.config = broker.config
        self.reader = reader
        self.writer = writer
        self.conn_id = uuid.uuid4().hex[:12]
        self.version = codec.MQTT311
        self.client_id = ""
        self.persistent = False
        self.client_type = DEVICE                # APPLICATION by the broker's application_clients rules
        self.app: ApplicationDelivery | None = None  # a persistent APPLICATION session's topic consumer
        self.session_expiry: int | None = None   # seconds; None = never (MQTT 3.1.1 persistent); 0 = ends at close
        self.connect_expiry = 0                  # MQTT 5: the Session Expiry Interval the CONNECT carried
        self.session_gen = ""                    # id of the session (not the connection): set when it is created
        self.filters: dict[str, int] = {}
        self.no_local: set[str] = set()          # MQTT 5 filters subscribed with No Local = 1
        self.sub_ids: dict[str, int] = {}        # MQTT 5 filter -> the Subscription Identifier it was subscribed with
        self.rap: set[str] = set()               # MQTT 5 filters subscribed with Retain As Published = 1
        self.shared: dict[str, int] = {}         # '$share/{ShareName}/{filter}' -> granted QoS (shared_delivery.py)
        self.will: dict[str, Any] | None = None  # the Will Message, as a publish's message; None after DISCONNECT
        self.will_delay = 0                      # MQTT 5 Will Delay Interval, seconds
        self.will_stored = False                 # the Will is also in Redis ({client}_will_conn), for a node kill
        self.max_packet_out: int | None = None   # the client's Maximum Packet Size
        self.window = self.config.max_inflight
        self.closed = False
        self.taken_over = False
        self.wake = asyncio.Event()
        self.read_from_cursor = False            # the last read started after a cursor, not at the start
        self.inflight: OrderedDict[int, tuple[str, str]] = OrderedDict()  # pid -> (kind, score)
        self.live_queue: deque[dict[str, Any]] = deque()
        self.live_dropped = 0
        self.local_ids = itertools.count(1)
        self.inbound_qos2: set[int] = set()
        self.inbound_unacked: set[int] = set()   # QoS 1/2 ids received, no PUBACK / PUBCOMP sent yet
        self.produces_pending = 0                # publishes handed to Kafka and not acknowledged by it yet
        self.produce_room = asyncio.Event()
        self.ack_queue: asyncio.Queue = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.connected = asyncio.Event()
        self._out: list[bytes] = []
        self._flush_scheduled = False

    # ------------------------------------------------------------ wire
    def send(self, packet: codec.Packet) -> None:
        # packets produced in one turn of the event loop leave in one write (one syscall, not one each)
        if self.closed:
            return
        self._out.append(codec.encode(packet, self.version))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_publish(self, packet: Publish) -> bool:
        """Queue a PUBLISH unless it exceeds the client's Maximum Packet Size ([MQTT-3.1.2-24]); returns
        whether it was sent.  The caller treats an unsent one as delivered ([MQTT-3.1.2-25])."""
        if self.closed:
            return True
        data = codec.encode(packet, self.version)
        if self.max_packet_out is not None and len(data) > self.max_packet_out:
            log.info("%s: %d-byte PUBLISH on %s exceeds the client's maximum packet size %d: discarded",
                     self.client_id, len(data), packet.topic, self.max_packet_out)
            self.broker.stats["discarded_too_large"] += 1
            return False
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return True

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.writer.is_closing():
            self.writer.write(b"".join(self._out))
        self._out.clear()

    async def close(self, reason_code: int | None = None) -> None:
        if self.closed:
            return
        if reason_code is not None and self.version == MQTT5 and self.connected.is_set():
            self.send(Disconnect(reason_code))
        self.flush()
        self.closed = True
        self.produce_room.set()  # a reader held back by back-pressure wakes up and sees the close
        with contextlib.suppress(Exception):
            self.writer.close()

    # ------------------------------------------------------------ main loop
    async def run(self) -> None:
        try:
            max_size = self.config.max_packet_size
            first, body = await asyncio.wait_for(codec.read_packet(self.reader, max_size), 10.0)
            if first >> 4 != codec.CONNECT:
                raise MalformedPacket("first packet is not CONNECT", codec.RC_PROTOCOL_ERROR)
            try:
                connect = codec.decode(first, body)
            except MalformedPacket as error:
                if error.reason_code == codec.RC_UNSUPPORTED_PROTOCOL_VERSION:
                    self.writer.write(codec.encode(ConnAck(False, 0x01), codec.MQTT311))
                elif body[:7] == b"\x00\x04MQTT\x05":
                    # an MQTT 5 CONNECT: the CONNACK may carry the reason before the close (§3.2.2.2)
                    self.writer.write(codec.encode(ConnAck(False, error.reason_code), MQTT5))
                raise
            await self.handle_connect(connect)
            if self.closed:
                return
            keep_alive = connect.keep_alive
            timeout = keep_alive * 1.5 if keep_alive else None
            limit = self.config.max_pending_publishes
            while not self.closed:
                # Back-pressure: while this client's publishes wait for Kafka, its socket is not read (TCP
                # pushes back on the client), so one client's flood cannot queue its backlog in the shared
                # producer ahead of everyone else's messages (benchmarks/broker_abuse.py measures it).
                while self.produces_pending >= limit and not self.closed:
                    self.produce_room.clear()
                    await self.produce_room.wait()
                try:
                    first, body = await asyncio.wait_for(codec.read_packet(self.reader, max_size), timeout)
                except TimeoutError:
                    log.info("%s: keep-alive timeout", self.client_id)
                    await self.close(codec.RC_KEEP_ALIVE_TIMEOUT)
                    return
                await self.dispatch(codec.decode(first, body, self.version))
                # Fairness: a client whose packets are all buffered would otherwise be served until its
                # buffer is empty (reads from a full buffer do not yield); one packet, then the others' turn.
                await asyncio.sleep(0)
        except MalformedPacket as error:
            log.info("%s: malformed packet: %s", self.client_id or "?", error)
            await self.close(error.reason_code if error.reason_code >= 0x80 else codec.RC_MALFORMED_PACKET)
        except ProtocolViolation as error:
            log.info("%s: protocol violation: %s", self.client_id or "?", error)
            await self.close(error.reason_code)
        except codec.LostBetweenPackets:
            await self._acks_left_buffered()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if isinstance(error, RedisError) or leaked_redis_transport_error(error):
                # Redis away (a killed master before its failover, a cluster down) while a packet needed it, e.g.
                # a SUBSCRIBE's saved subscriptions: the packet cannot be served, so the connection ends and the
                # client reconnects -- an outage this broker rides out, not an error of its own (an ERROR line
                # fails logs.error_lines: the soak's hour met one at a Redis master kill, docs/findings.md).
                log.warning("%s: connection closed, Redis unavailable: %s: %s", self.client_id or "?",
                            type(error).__name__, error)
            else:
                log.exception("%s: connection failed", self.client_id or "?")
            await self.close(codec.RC_UNSPECIFIED_ERROR)
        finally:
            await self.close()
            for task in self.tasks:
                task.cancel()
            for shared_text in self.shared:
                self.broker.leave_shared(self, shared_text)  # its unacknowledged messages go to another member
            if self.app is not None:
                # before connection_lost releases the session (also when the connection ended between the app's
                # start and the CONNACK)
                await self.app.finish()
            if self.connected.is_set() and self.config.has("pubrel_not_resent"):
                await self._forget_released_flows()
            if self.connected.is_set():
                await self.broker.connection_lost(self)

    async def _forget_released_flows(self) -> None:
        """(defect pubrel_not_resent) The QoS 2 flows this connection had PUBREC for and awaited PUBCOMP on are
        dropped with it: the resumed session never resends their PUBREL ([MQTT-4.4.0-1] says it must)."""
        for pid, (kind, _score) in list(self.inflight.items()):
            if kind == "rel":
                with contextlib.suppress(Exception):
                    await self.broker.store.remove_one(self.client_id, pid)

    async def _acks_left_buffered(self) -> None:
        """The connection was reset with packets still in the reader's buffer (asyncio raises the reset before
        handing them out).  The acks among them reached this broker before the reset: end their flows, or the
        resumed session redelivers messages the client acknowledged (MQTT 5 §4.4 resends only unacknowledged
        ones; docs/findings.md, "an ack the history claimed before it left").  Other packets are dropped: the
        client learns nothing of them (no PUBACK / SUBACK can reach it) and resends what it still owes."""
        if not self.connected.is_set():
            return
        buffered = bytes(getattr(self.reader, "_buffer", b""))
        for first, body in codec.whole_packets(buffered):
            if first >> 4 not in (codec.PUBACK, codec.PUBREC, codec.PUBCOMP):
                continue
            try:
                packet = codec.decode(first, body, self.version)
            except (MalformedPacket, ProtocolViolation):
                return
            await self.on_ack(packet)

    # ------------------------------------------------------------ CONNECT
    async def handle_connect(self, connect: Connect) -> None:
        self.version = connect.protocol_level
        v5 = self.version == MQTT5
        client_id = connect.client_id
        assigned = None
        if not client_id:
            if not connect.clean_start and not v5:
                self.send(ConnAck(False, 0x02))
                await self.close()
                return
            client_id = assigned = f"auto-{uuid.uuid4().hex}"
        if "{" in client_id or "}" in client_id:
            # the client id is the Redis hash tag; braces inside it would split the client's keys
            self.send(ConnAck(False, codec.RC_CLIENT_ID_NOT_VALID if v5 else 0x02))
            await self.close()
            return
        self.client_id = client_id
        if v5:
            refusal = self._refuse_connect(connect)
            if refusal is not None:
                log.info("%s: CONNECT refused (%#x)", client_id, refusal)
                self.send(ConnAck(False, refusal))
                await self.close()
                return
            self.session_expiry = self.connect_expiry = connect.prop("SessionExpiryInterval", 0)
            self.window = min(connect.prop("ReceiveMaximum", 65535), self.config.max_inflight)
            if self.config.has("receive_maximum_ignored"):
                self.window = self.config.max_inflight  # defect: the client's Receive Maximum is not read
            self.max_packet_out = connect.prop("MaximumPacketSize")
            # TBMQ: MQTT 5 is persistent with an expiry interval, or with clean start 0 (then never expiring)
            self.persistent = self.session_expiry > 0 or not connect.clean_start
            if self.persistent and self.session_expiry in (0, NEVER_EXPIRES):
                self.session_expiry = None
        else:
            self.persistent = not connect.clean_start
            self.session_expiry = None
        self.client_type = classify(self.config.application_clients, client_id, connect.username)
        try:
            session_present = await self.broker.open_session(self, connect.clean_start)
            if self.client_type == APPLICATION and self.persistent:
                # its topic and starting offset before the CONNACK (application.py ApplicationDelivery.init)
                self.app = ApplicationDelivery(self, session_present)
                await self.app.init()
        except RedisError as error:
            # The session store is away (a Redis master failing over, a node down): this CONNECT cannot be
            # served, and says so; the client retries.  An expected condition under faults, not a broker error
            # (a probe connecting during a Redis master kill found it logged as one, with a traceback).
            log.warning("%s: CONNECT refused, the session store is unavailable: %s: %s", client_id,
                        type(error).__name__, error)
            self.send(ConnAck(False, codec.RC_SERVER_UNAVAILABLE if v5 else 0x03))
            await self.close()
            return
        except Exception as error:
            if self.app is None:
                raise
            # the APPLICATION topic or its consumer is unavailable (Kafka away): refused, the client retries
            log.warning("%s: CONNECT refused, its APPLICATION topic is unavailable: %r", client_id, error)
            self.app = None
            self.send(ConnAck(False, codec.RC_SERVER_UNAVAILABLE if v5 else 0x03))
            await self.close()
            return
        if connect.will_topic is not None:
            # kept until the connection ends; published then unless a normal DISCONNECT cleared it
            # ([MQTT-3.1.2-8], -10); the node decides when (server.py connection_lost, Will Delay Interval)
            will_props = connect.will_properties if v5 else None
            self.will = self.application_message(connect.will_topic, connect.will_payload or b"", connect.will_qos,
                                                 connect.will_retain, will_props)
            self.will_delay = getattr(will_props, "WillDelayInterval", 0) if will_props is not None else 0
            if self.config.has("will_delay_ignored"):
                self.will_delay = 0  # defect: the Will goes out as the connection ends, and a resume cannot cancel it
            try:
                # in Redis too before the CONNACK (after open_session claimed an older connection's): if this node
                # dies with the connection open, the client's next CONNECT (server.py open_session) or else the
                # node that releases its sessions (release_dead_node_sessions) takes it and publishes it
                await self.broker.store.put_connected_will(client_id, self.conn_id, self.will, self.will_delay)
                self.will_stored = True
            except RedisError as error:
                log.warning("%s: Will not stored in Redis (a kill of this node would lose it): %r", client_id, error)
        properties = None
        if v5:
            properties = Properties(PacketTypes.CONNACK)
            if assigned:
                properties.AssignedClientIdentifier = assigned
            # what this broker does not do, declared (docs/reference-broker.md, conformance table), and the
            # limits it enforces
            properties.TopicAliasMaximum = 0
            properties.RetainAvailable = 1
            properties.SharedSubscriptionAvailable = 1  # for persistent APPLICATION clients (others: SUBACK 0x9E)
            properties.ReceiveMaximum = self.config.receive_maximum
            properties.MaximumPacketSize = self.config.max_packet_size
            # the type TBMQ would give this client (docs/reference-broker.md "APPLICATION clients")
            properties.UserProperty = ("client_type", self.client_type)
        if self.config.has("session_present_always_zero"):
            session_present = False  # defect
        self.send(ConnAck(session_present, codec.RC_SUCCESS, properties))
        self.connected.set()
        self.tasks.append(asyncio.create_task(self.acker()))
        self.tasks.append(asyncio.create_task(self.delivery_loop(session_present)))
        if self.app is not None:
            self.tasks.append(self.app.start())
        if self.config.has("resend_within_connection"):
            self.tasks.append(asyncio.create_task(self._resend_unacked()))
        for shared_text, qos in self.shared.items():  # a resumed session's shared subscriptions
            self.broker.join_shared(self, shared_text, qos)

    def _refuse_connect(self, connect: Connect) -> int | None:
        """The MQTT 5 CONNACK reason code for a CONNECT this broker must refuse, or None."""
        if connect.prop("AuthenticationMethod") is not None:
            return codec.RC_BAD_AUTHENTICATION_METHOD  # no enhanced authentication (§4.12)
        if connect.will_topic is not None and len(connect.will_topic.encode()) > self.config.max_topic_length:
            return codec.RC_TOPIC_NAME_INVALID
        return None

    # ------------------------------------------------------------ dispatch
    async def dispatch(self, packet: codec.Packet) -> None:
        if isinstance(packet, Publish):
            await self.on_publish(packet)
        elif isinstance(packet, Ack):
            await self.on_ack(packet)
        elif isinstance(packet, Subscribe):
            await self.on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            await self.on_unsubscribe(packet)
        elif isinstance(packet, Simple) and packet.packet_type == codec.PINGREQ:
            self.send(Simple(codec.PINGRESP))
        elif isinstance(packet, Disconnect):
            if not (self.version == MQTT5 and packet.reason_code == codec.RC_DISCONNECT_WITH_WILL) \
                    and not self.config.has("will_after_normal_disconnect"):  # defect: the Will is kept
                self.will = None  # a normal DISCONNECT: the Will is discarded unpublished ([MQTT-3.1.2-10])
            if self.version == MQTT5:
                expiry = packet.prop("SessionExpiryInterval")
                if expiry is not None and self.connect_expiry == 0 and expiry != 0:
                    # §3.14.2.2.2: not a valid DISCONNECT; the session keeps CONNECT's expiry
                    raise ProtocolViolation(codec.RC_PROTOCOL_ERROR, "DISCONNECT sets Session Expiry Interval "
                                            f"{expiry} after CONNECT's 0")
                if expiry is not None and self.connect_expiry > 0:
                    # §3.14.2.2.2: the DISCONNECT's interval replaces CONNECT's (0: the session ends now)
                    self.session_expiry = None if expiry == NEVER_EXPIRES else expiry
            await self.close()
        else:
            raise ProtocolViolation(codec.RC_PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")

    # ------------------------------------------------------------ publisher side
    async def on_publish(self, packet: Publish) -> None:
        v5 = self.version == MQTT5
        if len(packet.topic.encode()) > self.config.max_topic_length:
            raise ProtocolViolation(codec.RC_TOPIC_NAME_INVALID, f"topic of {len(packet.topic.encode())} bytes "
                                    f"exceeds max_topic_length {self.config.max_topic_length}")
        if v5:
            if packet.prop("SubscriptionIdentifier") is not None:
                raise ProtocolViolation(codec.RC_PROTOCOL_ERROR, "PUBLISH from a client carries a Subscription "
                                        "Identifier [MQTT-3.3.4-6]")
            if packet.prop("TopicAlias") is not None:  # Topic Alias Maximum = 0 (§3.2.2.3.8, §3.3.2.3.4)
                raise ProtocolViolation(codec.RC_TOPIC_ALIAS_INVALID, "PUBLISH with a Topic Alias")
        if packet.qos == 2 and packet.packet_id in self.inbound_qos2:
            self.send(Ack(codec.PUBREC, packet.packet_id))  # already produced: exactly once
            return
        if packet.qos:
            self.inbound_unacked.add(packet.packet_id)
            if v5 and len(self.inbound_unacked) > self.config.receive_maximum:
                raise ProtocolViolation(codec.RC_RECEIVE_MAXIMUM_EXCEEDED,
                                        f"{len(self.inbound_unacked)} QoS 1/2 PUBLISHes unacknowledged, Receive "
                                        f"Maximum {self.config.receive_maximum}")
        message = self.application_message(packet.topic, packet.payload, packet.qos, packet.retain,
                                           packet.properties if v5 else None)
        self.produces_pending += 1
        future = await self.broker.produce_incoming(message)
        # a retained message is stored by the node once Kafka has it, in publish order, also when this
        # connection ends first (a QoS 0 delete followed at once by DISCONNECT must still delete)
        stored = self.broker.retain_after(future, message) if packet.retain else None
        await self.ack_queue.put((packet.qos, packet.packet_id, future, stored))

    def application_message(self, topic: str, payload: bytes, qos: int, retain: bool,
                            properties: Properties | None) -> dict[str, Any]:
        """The message a PUBLISH (or a Will: its Will Properties) puts on the incoming topic."""
        now_ms = int(time.time() * 1000)
        expiry = getattr(properties, "MessageExpiryInterval", None) if properties is not None else None
        if self.config.has("ignore_message_expiry"):
            expiry = None  # defect
        props = b""
        if properties is not None:
            # forwarded unaltered, user properties in order ([MQTT-3.3.2-4], -15, -16, -17, -18, -20; a Will's
            # the same, [MQTT-3.1.3-10])
            forward = Properties(PacketTypes.PUBLISH)
            names = ["PayloadFormatIndicator", "ContentType", "ResponseTopic", "CorrelationData", "UserProperty"]
            if self.config.has("user_properties_dropped"):
                names.remove("UserProperty")  # defect: the user properties are not kept with the message
            for name in names:
                if hasattr(properties, name):
                    value = getattr(properties, name)
                    for item in (value if name == "UserProperty" else [value]):
                        setattr(forward, name, item)
            props = forward.pack()
        return {"topic": topic, "qos": qos, "payload": base64.b64encode(payload).decode(),
                "retain": retain, "props": base64.b64encode(props).decode(), "time": now_ms,
                "expiresAt": None if expiry is None else now_ms + expiry * 1000, "expiryInterval": expiry,
                "publisher": self.client_id}

    async def acker(self) -> None:
        """Acknowledge publishes in receive order, each only after Kafka acknowledged its write."""
        while True:
            qos, packet_id, future, stored = await self.ack_queue.get()
            try:
                # shielded: the connection ending cancels this task, and must not cancel the Kafka write's future
                # (the node's retained-message worker waits for it too)
                await asyncio.shield(future)
            except Exception as error:
                log.warning("%s: produce failed for packet %s: %r", self.client_id, packet_id, error)
                self._produced()
                if qos == 0:
                    continue
                if self.version == MQTT5:
                    self.inbound_unacked.discard(packet_id)  # a reason code >= 0x80 ends the flow
                    self.send(Ack(codec.PUBACK if qos == 1 else codec.PUBREC, packet_id, codec.RC_UNSPECIFIED_ERROR))
                    continue
                await self.close()
                return
            self._produced()
            if stored is not None:
                # stored before the PUBACK: a subscriber that subscribes once the publisher has its
                # acknowledgement gets it ([MQTT-3.3.1-5]; empty payload: deleted, [MQTT-3.3.1-10/-11])
                with contextlib.suppress(Exception):
                    await asyncio.shield(stored)
            if qos == 0:
                continue
            if qos == 1:
                self.inbound_unacked.discard(packet_id)
                self.send(Ack(codec.PUBACK, packet_id))
            else:
                self.inbound_qos2.add(packet_id)
                if self.persistent:
                    # part of the session: a publisher that reconnects and resends must not produce twice
                    await self._with_retry(self.broker.store.add_inbound_qos2, packet_id)
                self.send(Ack(codec.PUBREC, packet_id))

    def _produced(self) -> None:
        self.produces_pending -= 1
        self.produce_room.set()

    # ------------------------------------------------------------ acks from the subscriber (and PUBREL)
    async def on_ack(self, packet: Ack) -> None:
        pid = packet.packet_id
        store = self.broker.store
        if packet.packet_type == codec.PUBREL:
            known = pid in self.inbound_qos2
            self.inbound_qos2.discard(pid)
            self.inbound_unacked.discard(pid)
            if known and self.persistent:
                await self._with_retry(self.broker.store.remove_inbound_qos2, pid)
            rc = codec.RC_SUCCESS if known or self.version != MQTT5 else codec.RC_PACKET_ID_NOT_FOUND
            self.send(Ack(codec.PUBCOMP, pid, rc))
            return
        entry = self.inflight.get(pid)
        if entry is not None and entry[0] == "shared":
            self.broker.shared_ack(self, pid, entry)  # granted QoS <= 1: a PUBACK (or a refusing PUBREC) ends it
            return
        if entry is not None and entry[0] in ("app", "apprel") and self.app is not None:
            await self.app.on_ack(packet.packet_type, pid, entry, packet.reason_code)
            return
        stored = entry is not None and entry[0] != "live"
        if packet.packet_type == codec.PUBREC:
            if packet.reason_code >= 0x80:  # the subscriber refused it: the flow ends here
                if stored:
                    await self._with_retry(store.remove_one, pid)
                self._flow_ended(pid)
                return
            if stored:
                await self._with_retry(store.mark_released, pid)
                self.inflight[pid] = ("rel", entry[1])
            self.send(Ack(codec.PUBREL, pid))
            return
        # PUBACK or PUBCOMP: the message is done.  Remove it from Redis before it leaves the in-flight
        # window: an empty window sends the delivery loop back to the start of the ZSET, where a message
        # not yet removed would be sent again.
        if stored and not self.config.has("puback_not_removing"):
            await self._with_retry(store.remove_one, pid)
        self._flow_ended(pid)

    def _flow_ended(self, pid: int) -> None:
        """A delivery left the in-flight window.  Wake the delivery loop only if that can send something: the
        window was full, live messages wait for room, or the window is now empty after a read from a cursor
        (a read from the start then finds messages scored below it, after a wrap).  Otherwise the next hint
        wakes it -- an unconditional wake costs one empty Redis read per delivered message, a large share of
        the broker's Redis commands (benchmarks/broker_p2p.py counts them)."""
        was_full = len(self.inflight) >= self.window
        if self.inflight.pop(pid, None) is None:
            return
        if was_full or self.live_queue or (not self.inflight and self.read_from_cursor):
            self.wake.set()

    async def _with_retry(self, operation, packet_id: int) -> None:
        """Ack bookkeeping rides through a Redis failover; if it still fails, the message stays stored
        and is redelivered after the next reconnect (a duplicate, never a loss)."""
        for attempt in range(6):
            try:
                await operation(self.client_id, packet_id)
                return
            except Exception as error:
                log.warning("%s: %s(%d) failed (attempt %d): %r", self.client_id, operation.__name__,
                            packet_id, attempt + 1, error)
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------ subscriptions
    async def on_subscribe(self, packet: Subscribe) -> None:
        v5 = self.version == MQTT5
        sub_id = None
        if v5 and packet.properties is not None and hasattr(packet.properties, "SubscriptionIdentifier"):
            ids = packet.properties.SubscriptionIdentifier  # a list (paho: it may repeat on a PUBLISH)
            if len(ids) != 1:  # §3.8.2.1.2: more than one is a Protocol Error (0 is refused by the codec)
                raise ProtocolViolation(codec.RC_PROTOCOL_ERROR, f"SUBSCRIBE with {len(ids)} Subscription Identifiers")
            sub_id = ids[0]
        codes = []
        retained_for: list[tuple[str, int]] = []  # (filter, granted QoS) whose retained messages go out now
        joined: list[tuple[str, int]] = []        # shared subscriptions granted: this connection joins their groups
        for topic_filter, options in packet.topics:
            if is_shared(topic_filter):
                code = await self._subscribe_shared(topic_filter, options, v5)
                codes.append(code)
                if code <= 2:
                    joined.append((topic_filter, code))
                continue
            if not codec.valid_filter(topic_filter) or len(topic_filter.encode()) > self.config.max_topic_length:
                codes.append(codec.RC_TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            qos = options & 0x03
            # Retain Handling (MQTT 5 §3.8.3.1): 0 send, 1 send if the subscription is new, 2 never; 3.1.1: send
            handling = (options >> 4) & 0x03 if v5 else 0
            if handling == 0 or (handling == 1 and topic_filter not in self.filters):
                retained_for.append((topic_filter, qos))
            self.filters[topic_filter] = qos
            if v5 and options & 0x04:
                self.no_local.add(topic_filter)   # [MQTT-3.8.3-3], applied by the fan-out
            else:
                self.no_local.discard(topic_filter)
            # a SUBSCRIBE replaces the filter's subscription and its options ([MQTT-3.8.4-3]): its identifier
            # too -- none when this SUBSCRIBE has none
            if sub_id is not None:
                self.sub_ids[topic_filter] = sub_id   # [MQTT-3.3.4-3], applied by the fan-out
            else:
                self.sub_ids.pop(topic_filter, None)
            if v5 and options & 0x08:
                self.rap.add(topic_filter)        # [MQTT-3.3.1-12/-13], applied by the fan-out
            else:
                self.rap.discard(topic_filter)
            codes.append(qos)
        await self.broker.save_subscriptions(self)
        self.send(SubAck(packet.packet_id, codes))
        for shared_text, qos in joined:
            self.broker.join_shared(self, shared_text, qos)  # (no retained messages for a shared one, §4.8.2)
        for topic_filter, qos in retained_for:
            await self._send_retained(topic_filter, qos, sub_id)

    async def _subscribe_shared(self, topic_filter: str, options: int, v5: bool) -> int:
        """The SUBACK code of one ``$share/...`` filter; a granted one is in ``self.shared`` (saved by the caller)."""
        try:
            parse_shared(topic_filter)
        except SharedFilterError as error:
            log.info("%s: SUBSCRIBE refused: %s", self.client_id, error)
            return codec.RC_TOPIC_FILTER_INVALID if v5 else 0x80
        if len(topic_filter.encode()) > self.config.max_topic_length:
            return codec.RC_TOPIC_FILTER_INVALID if v5 else 0x80
        if v5 and options & 0x04:
            raise ProtocolViolation(codec.RC_PROTOCOL_ERROR, f"No Local on shared subscription {topic_filter!r} "
                                    "[MQTT-3.8.3-4]")
        if self.client_type != APPLICATION or not self.persistent:
            # only persistent APPLICATION clients: their groups live in Kafka (docs/reference-broker.md)
            log.info("%s: shared subscription %r refused: only persistent APPLICATION clients may share (this is "
                     "a %s%s client)", self.client_id, topic_filter, "" if self.persistent else "non-persistent ",
                     self.client_type)
            return codec.RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if v5 else 0x80
        try:
            await self.broker.prepare_shared(self, topic_filter)  # the topic, and a new group's start offset
        except Exception as error:
            log.warning("%s: shared subscription %r not prepared (Kafka away?): %r", self.client_id, topic_filter,
                        error)
            return codec.RC_UNSPECIFIED_ERROR if v5 else 0x80
        qos = granted_shared_qos(options & 0x03)
        self.shared[topic_filter] = qos
        return qos

    async def _send_retained(self, topic_filter: str, granted: int, sub_id: int | None) -> None:
        """The retained messages matching a new subscription, after its SUBACK ([MQTT-3.3.1-6]), RETAIN = 1
        ([MQTT-3.3.1-8]), at the minimum of their QoS and the granted one.  They go out as live messages:
        a connection lost before their acknowledgement does not get them again (a new SUBSCRIBE does)."""
        try:
            messages = await self.broker.store.retained_matching(topic_filter)
        except RedisError as error:
            log.warning("%s: retained messages for %r not read: %r", self.client_id, topic_filter, error)
            return
        for message in messages:
            out = dict(message, qos=min(granted, message["qos"]), retainedDelivery=True)
            out.pop("subIds", None)
            if sub_id is not None:
                out["subIds"] = [sub_id]
            self.deliver_live(out)

    async def on_unsubscribe(self, packet: Unsubscribe) -> None:
        codes = []
        for topic_filter in packet.topics:
            if is_shared(topic_filter):
                found = self.shared.pop(topic_filter, None) is not None
                if found:
                    self.broker.leave_shared(self, topic_filter)
                codes.append(0x00 if found else 0x11)
                continue
            codes.append(0x00 if self.filters.pop(topic_filter, None) is not None else 0x11)
            self.no_local.discard(topic_filter)
            self.sub_ids.pop(topic_filter, None)
            self.rap.discard(topic_filter)
        await self.broker.save_subscriptions(self)
        self.send(UnsubAck(packet.packet_id, codes))

    # ------------------------------------------------------------ delivery
    def deliver_live(self, message: dict[str, Any]) -> None:
        if len(self.live_queue) >= MAX_LIVE_QUEUE:
            # a connection that takes nothing (Receive Maximum reached, never acknowledging) must not grow the
            # node's memory without bound; live (non-persistent) messages beyond this are dropped
            self.live_dropped += 1
            if self.live_dropped in (1, 1000) or self.live_dropped % 100_000 == 0:
                log.warning("%s: %d live messages dropped (the connection takes none)", self.client_id,
                            self.live_dropped)
            return
        self.live_queue.append(message)
        self.wake.set()

    async def delivery_loop(self, resumed: bool) -> None:
        store = self.broker.store
        cursor = "-inf"
        backlog_first = True
        if resumed and self.persistent and self.config.has("live_before_backlog"):
            # defect: start after the newest stored message; the backlog is read only later
            top = await store.redis.zrevrange(store.messages_key(self.client_id), 0, 0, withscores=True)
            if top:
                cursor, backlog_first = str(int(top[0][1])), False
        started = time.monotonic()
        while not self.closed:
            # clear before reading: a hint that lands during the read wakes the next round
            self.wake.clear()
            try:
                await self._send_live()
                if self.persistent and self.app is None:  # an APPLICATION session reads its topic instead
                    room = self.window - len(self.inflight)
                    if room > 0:
                        if not self.inflight and backlog_first and not self.config.has("puback_not_removing"):
                            # every sent message is acknowledged and removed; scores restart below the
                            # cursor once the ZSET emptied (after a wrap) when the save found no session
                            # record to keep its highest score in (lua/save.lua), so read from the start again
                            cursor = "-inf"
                        self.read_from_cursor = cursor != "-inf"
                        entries = await store.read(self.client_id, cursor, room, reader=self.conn_id)
                        for entry in entries:
                            cursor = str(int(entry.score))
                            if self.inflight.get(entry.packet_id, (None, None))[1] == cursor:
                                continue  # already in flight on this connection
                            await self._send_stored(entry)
                        if resumed and entries and self.config.has("backlog_sent_twice"):
                            # defect: a second backlog fetch (the first hint's) raced the CONNACK's and read
                            # the same entries before either marked them sent: each goes out twice
                            resumed = False
                            for entry in entries:
                                await self._send_stored(entry)
                        if entries:
                            self.flush()
                            await self.writer.drain()
                        if len(entries) == room:
                            continue  # the window was the limit: there may be more right away
                    if not backlog_first and (len(self.inflight) or time.monotonic() - started > 3.0):
                        backlog_first, cursor = True, "-inf"
            except (ConnectionError, asyncio.CancelledError):
                return
            except Exception as error:
                # Redis failing over, for instance: the queue is still there, read it again shortly
                log.warning("%s: delivery read failed: %r; retrying", self.client_id, error)
                await asyncio.sleep(0.5)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.config.delivery_recheck_s)

    async def _resend_unacked(self) -> None:
        """(defect resend_within_connection) An MQTT 3.1.1 habit: a stored message unacknowledged for a
        second is resent (DUP = 1) on the same connection -- MQTT 5 allows resends only on a reconnect."""
        sent: dict[int, tuple[str, float]] = {}  # packet id -> (score, first seen in flight)
        while not self.closed:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for pid, (kind, score) in list(self.inflight.items()):
                if kind != "stored":
                    continue
                if sent.get(pid, (None, 0.0))[0] != score:
                    sent[pid] = (score, now)
                elif now - sent[pid][1] > 1.0:
                    sent[pid] = (score, now)
                    for entry in await self.broker.store.read(self.client_id, str(int(score) - 1), 1, mark_sent=False):
                        if entry.packet_id == pid:
                            self.send_publish(self._publish(entry.message, entry.message["qos"], pid, True,
                                                            self._remaining_expiry(entry.message)))
            self.flush()

    async def _send_stored(self, entry) -> None:
        message = entry.message
        pid = entry.packet_id
        score = str(int(entry.score))
        if message.get("packetType") == "PUBREL":
            self.inflight[pid] = ("rel", score)
            self.send(Ack(codec.PUBREL, pid))
            return
        remaining = self._remaining_expiry(message)
        if remaining is not None and remaining <= 0:
            await self.broker.store.remove_one(self.client_id, pid)  # expired: never sent
            return
        dup = entry.sent_before
        if self.config.has("no_dup_on_resend"):
            dup = False
        if self.config.has("dup_on_first_delivery"):
            dup = True
        if not self.send_publish(self._publish(message, message["qos"], pid, dup, remaining)):
            await self.broker.store.remove_one(self.client_id, pid)  # [MQTT-3.1.2-25]: as if delivered
            return
        self.inflight[pid] = ("stored", score)

    async def _send_live(self) -> None:
        queue = self.live_queue
        while queue:
            message = queue[0]
            remaining = self._remaining_expiry(message)
            if remaining is not None and remaining <= 0:
                queue.popleft()
                continue
            if message["qos"] and len(self.inflight) >= self.window:
                break  # [MQTT-3.3.4-9]: the client's Receive Maximum; an acknowledgement wakes the loop
            queue.popleft()
            pid = self._free_local_id() if message["qos"] else None
            if self.send_publish(self._publish(message, message["qos"], pid, False, remaining)) and pid:
                self.inflight[pid] = ("live", "")
        self.flush()
        await self.writer.drain()

    def _free_local_id(self) -> int:
        # live (non-stored) deliveries use packet ids the stored queue is not using right now
        for _ in range(65536):
            pid = next(self.local_ids) % 65536
            if pid and pid not in self.inflight:
                return pid
        raise ProtocolViolation(codec.RC_RECEIVE_MAXIMUM_EXCEEDED, "no free packet id")

    def _remaining_expiry(self, message: dict[str, Any]) -> int | None:
        expires_at = message.get("expiresAt")
        if expires_at is None or self.config.has("ignore_message_expiry"):
            return None
        remaining = math.ceil((expires_at - time.time() * 1000) / 1000)
        if self.config.has("remaining_expiry_not_reduced") and remaining > 0:
            return message.get("expiryInterval") or remaining  # defect: the original interval
        return remaining

    def _publish(self, message: dict[str, Any], qos: int, pid: int | None, dup: bool,
                 remaining: int | None) -> Publish:
        properties = None
        # RETAIN as the fan-out set it: the published flag when a matching subscription has Retain As Published,
        # else 0 ([MQTT-3.3.1-12], -13); MQTT 3.1.1 forwards 0 always ([MQTT-3.3.1-9]); 1 on a retained message
        # sent because of a new subscription, both versions ([MQTT-3.3.1-8])
        retain = bool(message.get("retainedDelivery"))  # sent because of a new subscription: RETAIN 1
        if self.version == MQTT5:
            retain = retain or bool(message.get("rapRetain"))
            properties = Properties(PacketTypes.PUBLISH)
            raw = base64.b64decode(message.get("props") or "")
            if raw:
                with contextlib.suppress(Exception):
                    properties.unpack(raw)
            # the remaining interval ([MQTT-3.3.2-6]); (defect expiry_property_dropped: left out, though the
            # message still expires)
            if remaining is not None and not self.config.has("expiry_property_dropped"):
                properties.MessageExpiryInterval = remaining
            for sub_id in message.get("subIds") or ():
                properties.SubscriptionIdentifier = sub_id  # [MQTT-3.3.4-3]: those of the matching subscriptions
        return Publish(message["topic"], base64.b64decode(message["payload"]), qos, retain, dup and qos > 0,
                       pid, properties)
