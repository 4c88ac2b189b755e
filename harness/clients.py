"""MQTT clients of a run: paho-mqtt 2.x clients (MQTT 3.1.1 and 5.0) on one shared selector loop.

Why one selector loop instead of ``loop_start()`` (one thread per client): a run has hundreds of clients
on a 2-core machine.  A thread per client costs a stack each, GIL hand-offs on every packet and makes the
order of observations depend on the scheduler; one loop thread that owns every socket is cheap, keeps all
paho calls on one thread (paho is not designed for concurrent calls into one client), and lets the
executor interleave plan events and socket I/O deterministically.  paho supports exactly this through
``socket()``, ``loop_read()``, ``loop_write()``, ``loop_misc()`` and the ``on_socket_*`` callbacks.

Every connection is a fresh paho client: paho's own in-memory session (queued and in-flight messages)
would otherwise resend publishes after a reconnect, after we already recorded their outcome as
indeterminate; the broker's session (what we test) lives on the broker, not in paho.  One part of the
*client's* session state is carried over to a resumed session's next client: the QoS 2 messages it answered
with PUBREC and that wait for their PUBREL (``take_unreleased_qos2``; paho delivers a QoS 2 message only at
PUBREL, so without them a message the client had taken ownership of was dropped, docs/findings.md).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from contracts import payload as identity_codec
from contracts.credentials import Credential
from contracts.history_schema import WILL_TOPIC_PREFIX, Kind, will_payload
from contracts.mqtt_properties import forwarded_json, workload_properties
from harness import connack
from harness.history import HistoryRecorder
from harness.tls import ClientTls, failure_words
from properties.plan import PUBLISHER, ClientPlan, PublishPlan, Subscription

PROTOCOLS = {4: mqtt.MQTTv311, 5: mqtt.MQTTv5}


@dataclass
class Counters:
    """Live counts for the progress display and the run summary (the history is the truth)."""

    published: int = 0
    acked: int = 0
    failed: int = 0
    indeterminate: int = 0
    delivered: int = 0
    undecodable: int = 0
    connects: int = 0
    connect_failures: int = 0
    disconnects: int = 0
    last_delivery_mono: float = 0.0

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if k != "last_delivery_mono"}


class NonBlockingConnectClient(mqtt.Client):
    """A paho client whose connect() returns at once: the TCP handshake completes on the selector loop.
    paho's own connect blocks for up to connect_timeout, and on one shared loop a broker behind a network
    partition would stall every other client that long.  A connection that never completes is caught by
    the executor's CONNACK timeout; a refused one surfaces as a read error (connect_fail row).
    (Overrides paho's ``_create_socket_connection``; paho-mqtt is pinned to 2.x in pyproject.toml.)

    TLS ([target.tls], ``use_tls``) on the same loop: paho wraps the socket and completes the handshake
    blocking, which a non-blocking connect cannot have (and Python wraps a socket still connecting without
    TLS at all).  So the TLS layer starts once the TCP connect is done, at the connection's first read or
    write, and the handshake advances on the selector's readiness like any other I/O; a handshake failure
    (a certificate that does not verify, an alert) ends the connection with its words in ``tls_error``."""

    tls_server_name = ""  # the name the certificate is checked for and SNI sends (use_tls)
    tls_error = ""  # why this connection's TLS handshake failed, in words ("" = it did not)
    _tls: ClientTls | None = None
    _tls_handshaking = False
    _tls_waits_to_read = False  # the handshake waits for the broker: no write interest meanwhile (want_write)
    # The QoS 2 flow's steps before on_message, for the history (ClientSession sets them; None: not recorded):
    # on_qos2_received(client, message, packet_size) once the PUBLISH was answered with PUBREC;
    # on_pubrel_received(client, packet_id, known) for every PUBREL.
    on_qos2_received: Callable[[mqtt.Client, mqtt.MQTTMessage, int], None] | None = None
    on_pubrel_received: Callable[[mqtt.Client, int, bool], None] | None = None
    # ClientSession.withhold_acks: once a QoS 2 PUBLISH is answered with PUBREC, read nothing more (reading_stalled)
    # until the planned drop -- a device whose application froze after that answer: its PUBREL, and whatever
    # follows, is never read, so the resumed session must resend the PUBREL ([MQTT-4.4.0-1]).  The PUBREC
    # still leaves (writes go on); SelectorLoop stops watching the socket for reads, _cut reads nothing more.
    stall_after_pubrec = False
    reading_stalled = False
    # The size of the PUBLISH packet on_message is called for (fixed header included); None outside it.
    received_packet_size: int | None = None
    _held_sizes: dict[int, int] | None = None  # packet id -> packet size of the QoS 2 messages awaiting PUBREL

    def _create_socket_connection(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if self._bind_address:
                sock.bind((self._bind_address, self._bind_port))
            code = sock.connect_ex((self._host, self._port))
        except OSError:
            sock.close()
            raise
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(code, os.strerror(code))
        return sock

    def use_tls(self, tls: ClientTls, host: str) -> None:
        """Speak MQTT over TLS: verified against ``tls``'s CA for its server name (or ``host``), before connect()."""
        self.tls_set_context(tls.context())
        self._tls = tls
        self.tls_server_name = tls.server_hostname(host)

    def _ssl_wrap_socket(self, tcp_sock: socket.socket) -> Any:
        self._tls_handshaking = True  # wrapped and shaken on the loop (_tls_step), not here
        return tcp_sock

    def _tls_step(self) -> None:
        """Advance the TLS handshake; BlockingIOError while it waits for the socket (paho's 'again')."""
        sock = self._sock
        if not self._tls_handshaking or sock is None:
            return
        if not isinstance(sock, ssl.SSLSocket):
            failed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if failed:
                raise OSError(failed, os.strerror(failed))
            try:
                sock.getpeername()
            except OSError as error:
                if error.errno != errno.ENOTCONN:
                    raise
                self._call_socket_register_write()  # writable once the TCP connect is done
                raise BlockingIOError() from error
            sock = self._ssl_context.wrap_socket(sock, server_hostname=self.tls_server_name,
                                                 do_handshake_on_connect=False)
            self._sock = sock
        if sock._sslobj is None:  # shut down by a cut (_cut) before the handshake finished
            raise ConnectionError("the TLS connection was shut down during its handshake")
        self._tls_waits_to_read = False
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError as error:
            self._tls_waits_to_read = True  # woken by the broker's answer, not by a writable socket
            self._call_socket_unregister_write()
            raise BlockingIOError() from error
        except ssl.SSLWantWriteError as error:
            self._call_socket_register_write()
            raise BlockingIOError() from error
        except ssl.SSLError as error:
            # An OSError that is no ValueError (a certificate error is both, and paho's writer takes a
            # ValueError for "try again"): paho ends the connection, and on_disconnect records these words.
            self.tls_error = self.tls_error or failure_words(error, self._tls)
            raise ConnectionAbortedError(errno.ECONNABORTED, self.tls_error) from error
        self._tls_handshaking = False
        self._call_socket_register_write()  # the CONNECT paho queued can go now

    def want_write(self) -> bool:
        """Not while the handshake waits for the broker: paho keeps write interest for its queued CONNECT, and
        a socket that is always writable would turn the loop without pause until the broker answers."""
        return not self._tls_waits_to_read and super().want_write()

    def _sock_send(self, buf: bytes | bytearray) -> int:
        self._tls_step()
        return super()._sock_send(buf)

    def _sock_recv(self, bufsize: int) -> bytes:
        self._tls_step()
        return super()._sock_recv(bufsize)

    def _loop_read_tls(self, max_packets: int = 1) -> mqtt.MQTTErrorCode:
        """Over TLS, also what the TLS layer already holds decrypted: the socket is not readable for it."""
        rc = super().loop_read(max_packets)
        while rc == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS and isinstance(self._sock, ssl.SSLSocket) \
                and not self._tls_handshaking and self._sock.pending():
            rc = super().loop_read(max_packets)
        return rc

    def _handle_publish(self) -> mqtt.MQTTErrorCode:
        """paho's, plus the packet's size for the history and, for QoS 2, the qos2_received hook: paho answers a
        QoS 2 PUBLISH with PUBREC here and hands the message to on_message only at its PUBREL."""
        size = packet_size(len(self._in_packet["packet"]))
        self.received_packet_size = size  # QoS 0 / 1: on_message runs inside paho's handler
        try:
            rc = super()._handle_publish()
        finally:
            self.received_packet_size = None
        if (self._in_packet["command"] & 0x06) >> 1 == 2 and rc == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS:
            packet = bytes(self._in_packet["packet"])
            after_topic = 2 + int.from_bytes(packet[:2], "big")  # topic length, topic, then the packet id
            mid = int.from_bytes(packet[after_topic:after_topic + 2], "big")
            with self._in_message_mutex:
                message = self._in_messages.get(mid)
            if message is not None:
                self.held_sizes()[mid] = size
                if self.on_qos2_received is not None:
                    self.on_qos2_received(self, message, size)
                if self.stall_after_pubrec:
                    self.reading_stalled = True
        return rc

    def loop_read(self, max_packets: int = 1) -> mqtt.MQTTErrorCode:
        if self.reading_stalled:
            return mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
        return self._loop_read_tls(max_packets)

    def held_sizes(self) -> dict[int, int]:
        if self._held_sizes is None:
            self._held_sizes = {}
        return self._held_sizes

    def _handle_pubrel(self) -> mqtt.MQTTErrorCode:
        """A PUBREL for a packet id this client holds no message for (released on an earlier connection, or
        delivered there and its PUBCOMP lost with the socket) is answered with PUBCOMP, as MQTT requires
        ([MQTT-4.3.3], 3.1.1 §4.3.3).  paho 2.x answers it only without ``manual_ack``: with it the QoS 2
        flow stayed open in the broker's in-flight window for ever (docs/findings.md, session-mix seed 4)."""
        mid = int.from_bytes(bytes(self._in_packet["packet"][:2]), "big")
        with self._in_message_mutex:
            known = mid in self._in_messages
        if self.on_pubrel_received is not None:
            self.on_pubrel_received(self, mid, known)
        self.received_packet_size = self.held_sizes().pop(mid, None)
        try:
            rc = super()._handle_pubrel()
        finally:
            self.received_packet_size = None
        if not known and self._manual_ack and rc == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS:
            return self._send_pubcomp(mid)
        return rc


def packet_size(remaining_length: int) -> int:
    """The whole packet's size in bytes from its remaining length: the first byte, the remaining length as a
    Variable Byte Integer (1-4 bytes, MQTT 5 §1.5.5 / 3.1.1 §2.2.3), then the rest."""
    digits = 1
    while remaining_length >= 128 ** digits:
        digits += 1
    return 1 + digits + remaining_length


def take_unreleased_qos2(client: mqtt.Client | None) -> dict[int, mqtt.MQTTMessage]:
    """The QoS 2 messages ``client`` answered with PUBREC and holds until their PUBREL (paho hands a QoS 2
    message to ``on_message`` only at PUBREL), removed from it.  They are part of the client's session state
    ([MQTT-4.3.3], method B: the receiver owns the message after its PUBREC): a resumed session gets the
    PUBREL on the next connection, which is a fresh paho client that must know them."""
    if client is None:
        return {}
    with client._in_message_mutex:
        taken = {mid: m for mid, m in client._in_messages.items() if m.qos == 2}
        for mid in taken:
            del client._in_messages[mid]
    return taken


def carry_unreleased_qos2(old: mqtt.Client | None, new: NonBlockingConnectClient,
                          carried: dict[int, mqtt.MQTTMessage]) -> None:
    """Give ``new`` the QoS 2 messages taken from ``old`` (take_unreleased_qos2), with their packet sizes."""
    new._in_messages.update(carried)
    sizes = old.held_sizes() if isinstance(old, NonBlockingConnectClient) else {}
    new.held_sizes().update({mid: sizes[mid] for mid in carried if mid in sizes})


class SelectorLoop:
    """The one selector every client's socket is registered with (read always, write when paho wants)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        # client -> called after each of its loop turns (the session records the acks that left paho's queue)
        self._after_write: dict[mqtt.Client, Callable[[mqtt.Client], None]] = {}

    def attach(self, client: mqtt.Client, after_write: Callable[[mqtt.Client], None] | None = None) -> None:
        if after_write is not None:
            self._after_write[client] = after_write
        client.on_socket_open = self._open
        client.on_socket_close = self._close
        client.on_socket_register_write = self._want_write
        client.on_socket_unregister_write = self._done_writing

    def detach(self, client: mqtt.Client) -> None:
        """Forget a client whose socket never opened (its connect failed at once)."""
        self._after_write.pop(client, None)

    def _open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self.selector.register(sock, selectors.EVENT_READ, client)

    def _close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._after_write.pop(client, None)
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _want_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._watch(client, sock, write=True)

    def _done_writing(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._watch(client, sock, write=False)

    def _watch(self, client: mqtt.Client, sock: Any, *, write: bool) -> None:
        """Watch ``sock`` for reads (unless its client's reading is stalled) and, with ``write``, for writes."""
        events = (0 if getattr(client, "reading_stalled", False) else selectors.EVENT_READ) | \
            (selectors.EVENT_WRITE if write else 0)
        try:
            if not events:
                self.selector.unregister(sock)
            else:
                try:
                    self.selector.modify(sock, events, client)
                except KeyError:  # unregistered while stalled and nothing to write
                    self.selector.register(sock, events, client)
        except (KeyError, ValueError, OSError):
            pass

    def poll(self, timeout: float) -> int:
        """Wait up to timeout for socket readiness and let paho read / write; returns events handled."""
        events = self.selector.select(max(0.0, timeout))
        for key, mask in events:
            client: mqtt.Client = key.data
            if mask & selectors.EVENT_READ:
                client.loop_read()
            # Why write after every read, not only when this select saw the socket writable: a PUBACK that
            # on_message queued must leave in this turn.  Left for the next select, a stall of the loop (a
            # loaded machine) kept it in paho's queue while a planned abrupt cut dropped it (docs/findings.md).
            if (mask & selectors.EVENT_WRITE or client.want_write()) and client.socket() is not None:
                client.loop_write()
            written = self._after_write.get(client)
            if written is not None:
                written(client)
            if getattr(client, "reading_stalled", False) and client.socket() is not None:
                self._watch(client, client.socket(), write=client.want_write())  # no more reads: not watched
        return len(events)

    def close(self) -> None:
        self.selector.close()


@dataclass
class PendingPublish:
    publish: PublishPlan
    invoked_mono: float
    packet_id: int


@dataclass
class ClientSession:
    """One plan client and its current connection.  Called only from the loop thread."""

    plan: ClientPlan
    recorder: HistoryRecorder
    loop: SelectorLoop
    counters: Counters
    address_of: Callable[[int], tuple[str, int, str]]  # node index -> (host, port, node name)
    publisher_names: dict[int, str]
    keepalive_s: int = 30
    connect_timeout_s: float = 5.0
    bind_address: str = ""  # source address of every connection ("" = the kernel's choice)
    credential: Credential | None = None  # the user name and password every CONNECT sends (None: anonymous)
    tls: ClientTls | None = None  # [target.tls]: every connection over TLS, verified against the run's CA

    paho: mqtt.Client | None = None
    previous_paho: mqtt.Client | None = None  # the last ended connection's client: its unreleased QoS 2 messages
    node: int = 0
    node_name: str = ""
    connected: bool = False  # CONNACK with success received on the current connection
    subscribed: bool = False  # every SUBACK of the current connection received
    want_connected: bool = False  # the plan wants this client connected (auto-reconnect when lost)
    connect_started: float = 0.0
    clean_start: bool = False
    session_expiry_s: int | None = None
    closing: bool = False  # the harness is ending this connection; its on_disconnect is not news
    reconnect_at: float | None = None
    why: str = ""  # why the current connection was opened (plan, auto-reconnect, drain)
    consecutive_failures: int = 0  # connect attempts failed since the last CONNACK (auto-reconnect rotates nodes)
    fault_id: str | None = None  # the client fault that opened the current connection (history column)
    session_present: bool | None = None  # the last CONNACK's session present flag
    connections: int = 0  # CONNECTs sent with the plan's Will (its payload names the connection)
    will_detail: dict[str, Any] = field(default_factory=dict)  # the current CONNECT's Will (connect row detail)
    withholding: bool = False  # the plan drops this connection abruptly soon: send no PUBACK until then
    pending: dict[int, PendingPublish] = field(default_factory=dict)
    unsent_acks: list[dict[str, Any]] = field(default_factory=list)  # acks paho queued, not yet written
    sub_mids: dict[int, list[Subscription]] = field(default_factory=dict)  # SUBSCRIBE packet id -> its filters
    # The executor's drain bookkeeping (harness/drain.py): told of every ack and every decoded delivery.
    on_acked: Callable[[PublishPlan], None] | None = None
    on_delivered: Callable[[str, str | None, int | None], None] | None = None
    on_fresh_session: Callable[[str], None] | None = None  # CONNACK with session present 0
    # The broker refused this client's credentials (CONNACK 3.1.1 4/5, MQTT 5 0x86/0x87/0x8C): the message.
    on_refused: Callable[[str], None] | None = None

    @property
    def client_id(self) -> str:
        return self.plan.client_id

    @property
    def protocol(self) -> int:
        return self.plan.protocol

    @property
    def session_persistent(self) -> bool:
        """Does the current connection's session outlive it?  3.1.1: CleanSession = 0; MQTT 5: clean start 0
        (TBMQ's rule: then kept even with expiry 0) or a session expiry interval > 0."""
        if not self.plan.persistent:
            return False
        if self.protocol == 5:
            return not self.clean_start or bool(self.session_expiry_s)
        return not self.clean_start

    # -- connecting --------------------------------------------------------------------------------
    def connect(self, *, clean_start: bool, node: int, session_expiry_s: int | None, why: str,
                fault_id: str | None = None) -> None:
        """Open a new connection (a fresh paho client).  Outcome: a connect or connect_fail row."""
        if self.paho is not None:
            self.drop("replaced by a new connection")
        # Why carried: the session's QoS 2 messages already PUBREC'ed on the old connection are released by the
        # broker's PUBREL on this one (a resumed session); a clean one discards them (paho clears them too).
        previous, carried = self.previous_paho, take_unreleased_qos2(self.previous_paho)
        self.previous_paho = None
        self.fault_id = fault_id
        self.session_present = None
        self.node = node
        host, port, self.node_name = self.address_of(node)
        self.clean_start = clean_start
        self.session_expiry_s = session_expiry_s if self.protocol == 5 else None
        self.want_connected = True
        self.connected = self.subscribed = self.closing = self.withholding = False
        self.reconnect_at = None
        self.why = why
        if self.protocol == 5:
            client = NonBlockingConnectClient(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                              protocol=mqtt.MQTTv5)
        else:  # 3.1.1: clean_session is the session flag; a persistent client never asks for a clean one
            clean_session = clean_start or not self.plan.persistent
            client = NonBlockingConnectClient(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                              protocol=mqtt.MQTTv311, clean_session=clean_session)
        client.manual_ack_set(True)  # we send each PUBACK ourselves, so the history knows it was sent
        if self.credential is not None:
            client.username_pw_set(self.credential.username, self.credential.password)
        if self.tls is not None:
            client.use_tls(self.tls, host)
        if carried and self.plan.persistent and not clean_start:
            carry_unreleased_qos2(previous, client, carried)
        client.on_qos2_received = self._on_qos2_received
        client.on_pubrel_received = self._on_pubrel_received
        client.max_inflight_messages_set(65535)
        client.max_queued_messages_set(0)
        client.connect_timeout = self.connect_timeout_s
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self._set_will(client)
        self.loop.attach(client, self._acks_written)
        self.paho = client
        self.connect_started = time.monotonic()
        kwargs: dict[str, Any] = {}
        if self.protocol == 5:
            properties = Properties(PacketTypes.CONNECT)
            if self.session_expiry_s is not None:
                properties.SessionExpiryInterval = self.session_expiry_s
            if self.plan.receive_maximum is not None:
                properties.ReceiveMaximum = self.plan.receive_maximum
            if self.plan.maximum_packet_size is not None:
                properties.MaximumPacketSize = self.plan.maximum_packet_size
            kwargs = {"clean_start": clean_start, "properties": properties}
        try:
            client.connect(host, port, keepalive=self.keepalive_s, bind_address=self.bind_address, **kwargs)
        except OSError as error:  # refused, unreachable, timed out: nothing was established
            self.loop.detach(client)
            self.paho = None
            self.previous_paho = client  # still holds the carried messages for the next attempt
            self._record_connect_fail(f"{type(error).__name__}: {error}", why)
            return

    def _set_will(self, client: mqtt.Client) -> None:
        """The plan's Will on this CONNECT, its payload naming this connection (history_schema.will_payload)."""
        will = self.plan.will
        if will is None:
            return
        self.connections += 1
        properties = None
        if self.protocol == 5 and will.delay_s is not None:
            properties = Properties(PacketTypes.WILLMESSAGE)
            properties.WillDelayInterval = will.delay_s
        payload = will_payload(self.client_id, self.connections)
        client.will_set(will.topic, payload, qos=will.qos, retain=False, properties=properties)
        self.will_detail = {"topic": will.topic, "qos": will.qos, "delay_s": will.delay_s, "payload": payload}

    def _record_connect_fail(self, reason: str, why: str, reason_code: int | None = None) -> None:
        self.counters.connect_failures += 1
        self.consecutive_failures += 1
        self.recorder.record(Kind.CONNECT_FAIL, client=self.client_id, node=self.node_name,
                             protocol=self.protocol, clean_start=self.clean_start,
                             session_expiry_s=self.session_expiry_s, reason_code=reason_code,
                             detail={"error": reason, "why": why})

    def check_connect_timeout(self, now: float) -> None:
        if self.paho is not None and not self.connected and not self.closing \
                and now - self.connect_started > self.connect_timeout_s:
            self._record_connect_fail(f"no CONNACK within {self.connect_timeout_s} s", self.why)
            self.drop("connect timeout")

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        if client is not self.paho:
            return
        code = int(reason_code.value)
        if reason_code.is_failure:
            # the code on the wire: paho reports a 3.1.1 return code as the MQTT 5 reason code of its name
            sent = connack.wire_code(self.protocol, reason_code.getName(), code)
            self._record_connect_fail(f"CONNACK refused: {connack.words(self.protocol, sent)}", self.why,
                                      reason_code=sent)
            # Inside paho's CONNACK handling: paho closes the socket itself once this callback returns (a
            # refusal is MQTT_ERR_CONN_REFUSED / _PROTOCOL to its loop).  Cutting here re-entered loop_read,
            # which handled the same CONNACK again and deadlocked on paho's callback lock.
            self.drop("refused", cut=False)
            if connack.is_auth_refusal(self.protocol, sent) and self.on_refused is not None:
                credential = self.credential
                self.on_refused(connack.refusal_message(
                    f"the broker ({self.node_name})", self.client_id, self.protocol, sent,
                    credential.username if credential is not None else None,
                    credential is not None and credential.password is not None))
            return
        self.connected = True
        self.consecutive_failures = 0
        self.counters.connects += 1
        self.session_present = bool(flags.session_present)
        if not self.session_present:
            # a new session: the broker will release none of the old ones
            for mid in take_unreleased_qos2(client):
                client.held_sizes().pop(mid, None)
        if not self.session_present and self.on_fresh_session is not None:
            self.on_fresh_session(self.client_id)  # a new session: nothing of the old one is owed any more
        detail: dict[str, Any] = {"why": self.why, "role": self.plan.role}
        if self.plan.will is not None:
            detail["will"] = self.will_detail
        if self.protocol == 5:  # what this CONNECT sent (absent: none, i.e. 65535 / no limit)
            if self.plan.receive_maximum is not None:
                detail["receive_maximum"] = self.plan.receive_maximum
            if self.plan.maximum_packet_size is not None:
                detail["maximum_packet_size"] = self.plan.maximum_packet_size
        self.recorder.record(Kind.CONNECT, client=self.client_id, node=self.node_name, protocol=self.protocol,
                             fault_id=self.fault_id, session_present=self.session_present, reason_code=code,
                             clean_start=self.clean_start, session_expiry_s=self.session_expiry_s,
                             detail=detail)
        self._subscribe(client)

    def _subscribe(self, client: mqtt.Client) -> None:
        """One SUBSCRIBE per distinct Subscription Identifier (it belongs to the whole packet, MQTT 5 §3.8.2.1.2);
        the plan's MQTT 5 options only on MQTT 5."""
        if not self.plan.subscriptions:
            self.subscribed = True
            return
        packets: dict[int | None, list[Subscription]] = {}
        for subscription in self.plan.subscriptions:
            packets.setdefault(subscription.sub_id if self.protocol == 5 else None, []).append(subscription)
        for sub_id, subscriptions in packets.items():
            properties = None
            if self.protocol == 5:
                topics: list[tuple[str, Any]] = [
                    (s.topic_filter, mqtt.SubscribeOptions(qos=s.qos, retainAsPublished=s.retain_as_published))
                    for s in subscriptions]
                if sub_id is not None:
                    properties = Properties(PacketTypes.SUBSCRIBE)
                    properties.SubscriptionIdentifier = sub_id
            else:
                topics = [(s.topic_filter, s.qos) for s in subscriptions]
            result, mid = client.subscribe(topics, properties=properties)
            if result == mqtt.MQTT_ERR_SUCCESS and mid is not None:
                self.sub_mids[mid] = subscriptions

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: list, properties: Any) -> None:
        if client is not self.paho:
            return
        subscriptions = self.sub_mids.pop(mid, [])
        v5 = self.protocol == 5
        for subscription, code in zip(subscriptions, reason_codes, strict=False):
            # the options of the SUBSCRIBE this filter was in (docs/history.md)
            detail: dict[str, Any] = {"requested_qos": subscription.qos,
                                      "rap": v5 and subscription.retain_as_published, "no_local": False}
            if v5 and subscription.sub_id is not None:
                detail["sub_id"] = subscription.sub_id
            self.recorder.record(Kind.SUBSCRIBE_ACK, client=self.client_id, node=self.node_name,
                                 protocol=self.protocol, topic=subscription.topic_filter,
                                 # a refusal (>= 0x80) is a reason code: the qos column (int8) cannot hold it
                                 qos=int(code.value) if int(code.value) < 0x80 else None,
                                 reason_code=int(code.value) if int(code.value) >= 0x80 else None,
                                 packet_id=mid, detail=detail)
        if not self.sub_mids:
            self.subscribed = True

    def withhold_acks(self) -> None:
        """Stop acknowledging deliveries until this connection ends (the next connect() clears it).  The
        withheld ones are recorded as deliveries without a delivery_ack_sent row: unacknowledged, so the
        broker owes them again with DUP = 1 when the session resumes (MQTT §4.4)."""
        if self.paho is not None:
            self.withholding = True
            self.paho.stall_after_pubrec = True  # QoS 2: the next PUBREC is the last thing this connection does

    # -- disconnecting -----------------------------------------------------------------------------
    def disconnect(self, *, abrupt: bool, why: str, fault_id: str | None = None) -> None:
        """A planned disconnect: clean (DISCONNECT packet) or abrupt (socket cut, no DISCONNECT)."""
        self.want_connected = False
        self.reconnect_at = None
        if self.paho is None:
            return
        self.counters.disconnects += 1
        if not abrupt and self.paho.is_connected() and self.paho.socket() is not None:
            self.paho.loop_write()  # the queued acks go now, as they would before the DISCONNECT packet
        detail: dict[str, Any] = {"why": why, "was_connected": self.connected}
        unsent = self._drop_unsent_acks(self.paho)
        if unsent:  # queued by paho, never written: the cut drops them, the broker owes these messages
            detail["acks_not_sent"] = unsent
        self.recorder.record(Kind.DISCONNECT, client=self.client_id, node=self.node_name, protocol=self.protocol,
                             fault_id=fault_id, initiator="harness" if abrupt else "client", abrupt=abrupt,
                             detail=detail)
        self._settle_pending("the client disconnected")
        self.closing = True
        client, self.paho = self.paho, None
        self.previous_paho = client
        self.connected = self.subscribed = False
        if abrupt or not client.is_connected():
            _cut(client)
        else:
            client.disconnect()  # paho writes DISCONNECT on the loop, then closes the socket

    def drop(self, why: str, *, cut: bool = True) -> None:
        """Forget the current connection without a history row of its own (used after a connect_fail).
        ``cut``: close its socket now; False from inside a paho callback of that client, which closes it."""
        self._drop_unsent_acks(self.paho)
        client, self.paho = self.paho, None
        self.connected = self.subscribed = False
        if client is not None:
            self.previous_paho = client
            self.closing = True
            if cut:
                _cut(client)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        if client is not self.paho:
            return  # a connection the harness already ended and recorded
        was_connected = self.connected
        unsent = self._drop_unsent_acks(client)
        self.paho = None
        self.previous_paho = client
        self.connected = self.subscribed = False
        if was_connected:
            self.counters.disconnects += 1
            detail: dict[str, Any] = {"why": "connection lost"}
            if unsent:
                detail["acks_not_sent"] = unsent
            self.recorder.record(
                Kind.DISCONNECT, client=self.client_id, node=self.node_name, protocol=self.protocol,
                initiator="server", abrupt=not flags.is_disconnect_packet_from_server,
                reason_code=int(reason_code.value) if reason_code is not None else None,
                detail=detail)
        else:
            self._record_connect_fail(getattr(client, "tls_error", "") or "connection closed before CONNACK", self.why)
        self._settle_pending("connection lost before the acknowledgement")
        _cut(client)

    # -- publishing --------------------------------------------------------------------------------
    def publish(self, publish: PublishPlan) -> None:
        """Invoke one planned publish; exactly one outcome row follows (now, or on ack/loss/timeout)."""
        send_wall_us = time.time_ns() // 1000
        body = identity_codec.encode(
            identity_codec.Identity(self.plan.publisher_index or 0, publish.seq, send_wall_us), publish.size)
        digest = identity_codec.body_hash(body)
        common = dict(client=self.client_id, node=self.node_name, protocol=self.protocol, topic=publish.topic,
                      qos=publish.qos, publisher=self.client_id, pub_seq=publish.seq)
        self.counters.published += 1
        properties = self._publish_properties(publish)
        invoke = dict(common, retain=publish.retain, props=forwarded_json(properties), payload_size=len(body),
                      expiry_s=publish.expiry_s, send_wall_us=send_wall_us, body_hash=digest,
                      packet_size=self._publish_packet_size(publish, properties, len(body)))
        if self.paho is None or not self.connected:
            self.recorder.record(Kind.PUBLISH_INVOKE, **invoke)
            self._outcome(Kind.PUBLISH_FAIL, publish, None, reason="not connected; never sent")
            return
        info = self.paho.publish(publish.topic, body, qos=publish.qos, retain=publish.retain, properties=properties)
        self.recorder.record(Kind.PUBLISH_INVOKE, packet_id=info.mid, **invoke)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self._outcome(Kind.PUBLISH_FAIL, publish, info.mid, reason=f"paho: {mqtt.error_string(info.rc)}")
            return
        if info.mid in self.pending:  # paho reused a packet id still awaiting its ack: that one is lost
            self._settle_one(info.mid, Kind.PUBLISH_INDETERMINATE, "packet id reused by the client library")
        self.pending[info.mid] = PendingPublish(publish, time.monotonic(), info.mid)
        if publish.qos == 0 and info.is_published():
            self._settle_one(info.mid, Kind.PUBLISH_ACK, "QoS 0: written to the socket")

    def _publish_packet_size(self, publish: PublishPlan, properties: Properties | None, body: int) -> int:
        """The PUBLISH packet this publish sends, in bytes: topic, packet id (QoS > 0), the MQTT 5 properties
        (their packed form carries its own length), the payload, under the fixed header.  A subscriber's copy
        differs only by what the broker adds or drops (a subscription identifier, the packet id at QoS 0)."""
        remaining = 2 + len(publish.topic.encode()) + (2 if publish.qos > 0 else 0) + body
        if self.protocol == 5:
            remaining += len(properties.pack()) if properties is not None else 1
        return packet_size(remaining)

    def _publish_properties(self, publish: PublishPlan) -> Properties | None:
        """The PUBLISH properties of an MQTT 5 publish: its Message Expiry Interval and, with
        [workload] mqtt5_properties, the forwarded ones (contracts/mqtt_properties.py), in a fixed order."""
        if self.protocol != 5 or (publish.expiry_s is None and not publish.properties):
            return None
        properties = Properties(PacketTypes.PUBLISH)
        if publish.properties:
            for name, value in workload_properties(self.client_id, publish.seq).attributes():
                setattr(properties, name, value)
        if publish.expiry_s is not None:
            properties.MessageExpiryInterval = publish.expiry_s
        return properties

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        if client is not self.paho or mid not in self.pending:
            return
        pending = self.pending[mid]
        if pending.publish.qos == 0:
            self._settle_one(mid, Kind.PUBLISH_ACK, "QoS 0: written to the socket")
        elif reason_code is not None and reason_code.is_failure:
            self._settle_one(mid, Kind.PUBLISH_FAIL, f"reason code {reason_code}", int(reason_code.value))
        else:
            self._settle_one(mid, Kind.PUBLISH_ACK, "", int(reason_code.value) if reason_code is not None else 0)

    def _settle_one(self, mid: int, kind: str, reason: str, reason_code: int | None = None) -> None:
        pending = self.pending.pop(mid)
        self._outcome(kind, pending.publish, mid, reason=reason, reason_code=reason_code,
                      latency_s=time.monotonic() - pending.invoked_mono)

    def _outcome(self, kind: str, publish: PublishPlan, mid: int | None, *, reason: str = "",
                 reason_code: int | None = None, latency_s: float | None = None) -> None:
        if kind == Kind.PUBLISH_ACK:
            self.counters.acked += 1
            if self.on_acked is not None:
                self.on_acked(publish)
        elif kind == Kind.PUBLISH_FAIL:
            self.counters.failed += 1
        else:
            self.counters.indeterminate += 1
        detail: dict[str, Any] = {}
        if reason:
            detail["reason"] = reason
        if latency_s is not None:
            detail["latency_ms"] = round(latency_s * 1000, 3)
        self.recorder.record(kind, client=self.client_id, node=self.node_name, protocol=self.protocol,
                             topic=publish.topic, qos=publish.qos, packet_id=mid, publisher=self.client_id,
                             pub_seq=publish.seq, reason_code=reason_code, detail=detail or None)

    def _settle_pending(self, reason: str) -> None:
        for mid in list(self.pending):
            self._settle_one(mid, Kind.PUBLISH_INDETERMINATE, reason)

    def expire_pending(self, now: float, timeout_s: float) -> None:
        for mid, pending in list(self.pending.items()):
            if now - pending.invoked_mono > timeout_s:
                self._settle_one(mid, Kind.PUBLISH_INDETERMINATE, f"no acknowledgement within {timeout_s} s")

    def settle_all(self, reason: str) -> None:
        self._settle_pending(reason)

    # -- receiving ---------------------------------------------------------------------------------
    def _received(self, message: mqtt.MQTTMessage, size: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(columns, detail) that a delivery and a qos2_received row share: the PUBLISH as received, its
        identity decoded from the payload, its forwarded properties and subscription identifiers (MQTT 5)."""
        body = message.payload
        identity = identity_codec.try_decode(body)
        detail: dict[str, Any] = {}
        publisher = None
        if identity is None:
            try:
                identity_codec.decode(body)
            except identity_codec.PayloadError as error:
                detail["undecodable"] = str(error)
        else:
            publisher = self.publisher_names.get(identity.publisher_index)
            if publisher is None:
                detail["unknown_publisher_index"] = identity.publisher_index
        try:
            topic = message.topic
        except UnicodeDecodeError:
            topic = None
            detail["topic_not_utf8"] = message._topic.hex()
        if topic is not None and topic.startswith(WILL_TOPIC_PREFIX):  # a Will: its payload names the connection
            detail.pop("undecodable", None)
            detail["will"] = bytes(body).decode("utf-8", "replace")
        remaining = props = sub_ids = None
        if self.protocol == 5 and message.properties is not None:
            remaining = getattr(message.properties, "MessageExpiryInterval", None)
            props = forwarded_json(message.properties)
            ids = getattr(message.properties, "SubscriptionIdentifier", None)
            sub_ids = ",".join(str(i) for i in ids) if ids else None
        columns = dict(
            client=self.client_id, node=self.node_name, protocol=self.protocol, topic=topic, qos=message.qos,
            packet_id=message.mid, dup=bool(message.dup), retain=bool(message.retain), payload_size=len(body),
            remaining_expiry_s=remaining, publisher=publisher, pub_seq=identity.seq if identity else None,
            send_wall_us=identity.send_wall_us if identity else None, body_hash=identity_codec.body_hash(body),
            props=props, sub_ids=sub_ids, packet_size=size)
        return columns, detail

    def _on_qos2_received(self, client: mqtt.Client, message: mqtt.MQTTMessage, size: int) -> None:
        """A QoS 2 PUBLISH arrived and paho answered it with PUBREC (its delivery row comes at its PUBREL)."""
        columns, detail = self._received(message, size)
        del columns["remaining_expiry_s"]  # not among a qos2_received row's columns (docs/history.md)
        self.recorder.record(Kind.QOS2_RECEIVED, detail=detail or None, **columns)

    def _on_pubrel_received(self, client: mqtt.Client, mid: int, known: bool) -> None:
        self.recorder.record(Kind.PUBREL_RECEIVED, client=self.client_id, node=self.node_name,
                             protocol=self.protocol, packet_id=mid, detail={"known": known})

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        columns, detail = self._received(message, getattr(client, "received_packet_size", None))
        publisher, pub_seq = columns["publisher"], columns["pub_seq"]
        if pub_seq is None and "will" not in detail:  # a Will carries no identity by design
            self.counters.undecodable += 1
        self.counters.delivered += 1
        self.counters.last_delivery_mono = time.monotonic()
        if self.on_delivered is not None:
            self.on_delivered(self.client_id, publisher, pub_seq)
        will_ack = message.qos > 0 and client is self.paho and client.socket() is not None
        if message.qos > 0 and not will_ack:  # arrived on a connection the harness is already ending
            detail["not_acked"] = "the harness was closing this connection"
        elif will_ack and self.withholding:
            will_ack = False
            detail["not_acked"] = "withheld: the plan drops this connection abruptly"
        self.recorder.record(Kind.DELIVERY, detail=detail or None, **columns)
        if will_ack:
            # PUBACK (QoS 1) / PUBCOMP (QoS 2): paho only queues it; its delivery_ack_sent row is written when
            # the packet has left paho's queue for the socket (_acks_written), so the row's time is when it
            # was sent, and an ack a cut dropped from the queue has no row (the broker owes that message).
            client.ack(message.mid, message.qos)
            self.unsent_acks.append(dict(
                client=self.client_id, node=self.node_name, protocol=self.protocol, topic=columns["topic"],
                qos=message.qos, packet_id=message.mid, publisher=publisher, pub_seq=pub_seq))

    def _acks_written(self, client: mqtt.Client) -> None:
        """After a loop turn of ``client``: record delivery_ack_sent for each queued ack paho has written."""
        if client is not self.paho or not self.unsent_acks:
            return
        queued = _queued_acks(client)
        still: list[dict[str, Any]] = []
        for row in self.unsent_acks:
            if (row["packet_id"], row["qos"]) in queued:
                still.append(row)
            else:
                self.recorder.record(Kind.DELIVERY_ACK_SENT, **row)
        self.unsent_acks = still

    def _drop_unsent_acks(self, client: mqtt.Client | None) -> list[int]:
        """The connection ends: acks still in paho's queue never leave (the next connect is a fresh client);
        the packet ids of those, for the disconnect row.  Those already written get their row first."""
        if client is not None and client is self.paho:
            self._acks_written(client)
        dropped = [row["packet_id"] for row in self.unsent_acks]
        self.unsent_acks = []
        return dropped

    # -- housekeeping ------------------------------------------------------------------------------
    def misc(self) -> None:
        if self.paho is not None:
            self.paho.loop_misc()  # keep-alive PINGREQ, and paho's own timeouts

    @property
    def is_publisher(self) -> bool:
        return self.plan.role == PUBLISHER


def _queued_acks(client: mqtt.Client) -> set[tuple[int, int]]:
    """(packet id, QoS) of the PUBACK / PUBCOMP packets still in paho's out queue (not yet written)."""
    commands = {mqtt.PUBACK: 1, mqtt.PUBCOMP: 2}
    return {(packet["mid"], commands[packet["command"] & 0xF0]) for packet in list(client._out_packet)
            if packet["command"] & 0xF0 in commands}


def _cut(client: mqtt.Client) -> None:
    """Close the socket without a DISCONNECT packet.  shutdown() sends FIN at once; paho then sees EOF on
    its next read and cleans up (the selector unregisters the socket in on_socket_close)."""
    sock = client.socket()
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        # reads the EOF now: paho closes and unregisters the socket (a stalled client reads nothing: what is
        # still buffered, unread, goes with the socket -- loop_read returns at once and the close follows below)
        client.loop_read()
    except (OSError, ValueError):
        pass
    if client.socket() is not None:  # paho did not notice (e.g. data still buffered): close it ourselves
        try:
            client.on_socket_close(client, None, client.socket())
        except Exception:  # noqa: BLE001 - best effort
            pass
        try:
            client.socket().close()
        except OSError:
            pass
