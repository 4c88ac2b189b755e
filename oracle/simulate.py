"""A correct broker playing a plan (oracle/plan.py), as the harness's clients would record it: every row of the
history in time order.

The broker: each persistent session stores every QoS > 0 message routed to it (packet ids handed out at the
store, 1..65535 then 1, from the session's counter), trims its store to the declared limit from the declared
end, keeps in-flight messages until acknowledged and resends them with DUP = 1 on a resumed session before the
rest of its queue; a clean session gets messages only while connected, with ids of its connection; nothing is
sent after its expiry; an MQTT 5 session ends its expiry interval after the disconnect; a kill of a broker
node cuts every client, which reconnects after the heal.  Rows are stamped in processing order with strictly
increasing times, so seq order is time order and every client's rows are in the order it saw them.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import random
from dataclasses import dataclass, field
from typing import Any

from contracts.history_schema import Kind, Phase
from contracts.scenario import UNPROMISED_FAULTS
from oracle.plan import Plan, Step, Subscriber
from oracle.topics import matches

Row = dict[str, Any]
T0 = 1_000_000  # the workload starts 1 s into the run
PAYLOAD = 64


def body_hash(publisher: str, pub_seq: int) -> str:
    return hashlib.blake2b(f"{publisher}:{pub_seq}".encode(), digest_size=8).hexdigest()


def canonical_props(content_type: str | None, user: tuple[tuple[str, str], ...]) -> str | None:
    """The forwarded properties as the history writes them (docs/history.md: canonical JSON, sorted keys)."""
    props: dict[str, Any] = {}
    if content_type is not None:
        props["content_type"] = content_type
    if user:
        props["user_properties"] = [list(p) for p in user]
    return json.dumps(props, sort_keys=True, separators=(",", ":")) if props else None


def packet_size(topic: str, qos: int, protocol: int, props: str | None, expiry: int | None,
                sub_ids: str | None) -> int:
    """The bytes of the whole PUBLISH packet: fixed header, topic, packet id, MQTT 5 properties, payload."""
    body = 2 + len(topic.encode()) + (2 if qos > 0 else 0) + PAYLOAD
    if protocol == 5:
        size = 0
        if expiry is not None:
            size += 5
        for sub_id in (sub_ids or "").split(",") if sub_ids else ():
            size += 1 + _varint_len(int(sub_id))
        if props:
            decoded = json.loads(props)
            if "content_type" in decoded:
                size += 3 + len(decoded["content_type"].encode())
            for key, value in decoded.get("user_properties", []):
                size += 5 + len(key.encode()) + len(value.encode())
        body += _varint_len(size) + size
    return 1 + _varint_len(body) + body


def _varint_len(n: int) -> int:
    return 1 if n < 128 else 2 if n < 16384 else 3 if n < 2_097_152 else 4


@dataclass
class Message:
    publisher: str
    pub_seq: int
    topic: str
    qos: int
    expiry_s: int | None
    props: str | None
    t_invoke: int
    protocol: int


@dataclass
class Stored:
    message: Message
    qos: int  # effective: min(published, granted)
    pid: int | None = None
    sent_on: int | None = None  # the connection it was last sent on
    resend: bool = False  # sent before on a connection now gone: DUP = 1 next time
    pubrec: bool = False  # QoS 2: the broker has the client's PUBREC (what it owes next is the PUBREL)


@dataclass
class Session:
    sub: Subscriber
    persistent: bool
    subs: dict[str, int] = field(default_factory=dict)  # filter -> granted
    store: list[Stored] = field(default_factory=list)  # persistent: the queue (ZSET), in-flight ones included
    inflight: dict[int, Stored] = field(default_factory=dict)  # pid -> sent, not acknowledged
    counter: int = 0  # the last packet id handed out
    conn: int | None = None  # the current connection (None: offline)
    t_disconnect: int | None = None


class Broker:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.rng = random.Random(plan.behaviour.seed)
        self.rows: list[Row] = []
        self.clock = 0
        self.heap: list[tuple[int, int, Any, tuple]] = []
        self.order = 0
        self.sessions: dict[str, Session] = {}
        self.connected: dict[str, int | None] = {}  # client -> its connection token
        self.connections = 0
        self.pub_seq: dict[str, int] = {}
        self.delivered: list[Row] = []
        self.down_until: int | None = None  # a broker node is down
        self.pending_back: list[int] = []  # subscribers whose reconnect waits for the broker
        self.deferred: list[Message] = []  # messages to route once the broker is back
        self.held: dict[tuple[str, int], dict] = {}  # (client, packet id) -> a QoS 2 PUBLISH the client holds
        self.first_counter = plan.behaviour.first_packet_id - 1
        self.had_session: set[str] = set()  # clients whose later new sessions count ids from 1 again
        self.wire: dict[tuple[int, str], int] = {}  # (connection, direction) -> when its last packet arrives
        self.protocols = {s.name: s.protocol for s in plan.subscribers} | {p.name: p.protocol for p in plan.publishers}

    # -- time and rows ---------------------------------------------------------------------------------
    def emit(self, now: int, kind: str, **fields: Any) -> Row:
        self.clock = max(now, self.clock + 1)
        row = {"t_mono_us": self.clock, "kind": kind, **fields}
        self.rows.append(row)
        return row

    def at(self, t: int, action, *args) -> None:
        self.order += 1
        heapq.heappush(self.heap, (t, self.order, action, args))

    def lat(self, low_us: int, high_us: int) -> int:
        return self.rng.randint(low_us, high_us)

    def in_order(self, conn: int | None, direction: str, t: int) -> int:
        """A connection delivers its packets in the order they were sent (TCP): never before the one before."""
        t = max(t, self.wire.get((conn, direction), 0) + 10)
        self.wire[(conn, direction)] = t
        return t

    def run(self) -> list[Row]:
        b = self.plan.behaviour
        self.emit(0, Kind.PHASE, detail=json.dumps({"phase": Phase.RUN_START, "scenario": "oracle", "seed": b.seed}))
        t = T0 - 100_000
        for p in self.plan.publishers:
            t += 1000
            self.connect_publisher(t, p.name)
        for i, s in enumerate(self.plan.subscribers):
            t += 1000
            self.at(t, self.connect_subscriber, i, s.persistent is False, "start")
        t = T0
        self.at(t - 1, self.phase, Phase.WORKLOAD_START, {})
        for step in self.plan.steps:
            t += step.gap_ms * 1000
            self.at(t, self.step, step)
        self.loop()
        end = self.clock + 50_000
        self.phase(end, Phase.WORKLOAD_END, {"max_lag_s": 0.0})
        self.phase(end + 1000, Phase.HEAL_ALL, {"faults_healed": 0, "nodes_restarted": 0})
        self.phase(end + 2000, Phase.DRAIN_START, {"quiet_s": 0.2, "timeout_s": 30})
        drain = end + 3000
        for i, s in enumerate(self.plan.subscribers):
            drain += 500
            if self.connected.get(s.name) is None and not s.stays_away:
                self.at(drain, self.connect_subscriber, i, not s.persistent, "drain")
            elif b.drain_cycle and s.persistent and self.connected.get(s.name) is not None:
                self.at(drain, self.disconnect_subscriber, i, False, "drain: reconnect every persistent subscriber")
                self.at(drain + 300, self.connect_subscriber, i, False, "drain")
        self.loop()
        quiet = self.clock + 200_000
        self.phase(quiet, Phase.DRAIN_END, {"reason": "quiet", "ended_by": "quiet", "outstanding": 0})
        if self.plan.setup.target == "reference":
            for s in self.plan.subscribers:  # one per subscriber: a clean session's store is empty
                session = self.sessions.get(s.name)
                stored = session is not None and session.persistent
                self.emit(quiet + 10, Kind.SESSION_SNAPSHOT, client=s.name, node="redis-7001",
                          zset_size=len(session.store) if stored else 0,
                          last_packet_id=session.counter if stored and session.counter else None,
                          orphan_payloads=0, dangling_refs=0, detail=json.dumps({}))
        self.phase(quiet + 100, Phase.SNAPSHOT_DONE, {"white_box": self.plan.setup.target == "reference"})
        self.phase(quiet + 200, Phase.RUN_END, {"elapsed_s": 1.0})
        return self.rows

    def loop(self) -> None:
        while self.heap:
            t, _, action, args = heapq.heappop(self.heap)
            action(max(t, self.clock + 1), *args)

    def phase(self, now: int, phase: str, extra: dict) -> None:
        self.emit(now, Kind.PHASE, detail=json.dumps({"phase": phase, **extra}))

    # -- the plan's steps ------------------------------------------------------------------------------
    def step(self, now: int, step: Step) -> None:
        if step.kind == "publish":
            self.publish(now, step)
        elif step.kind == "leave":
            self.disconnect_subscriber(now, step.who, step.abrupt, "plan")
        elif step.kind == "back":
            sub = self.plan.subscribers[step.who]
            if self.connected.get(sub.name) is None:
                if self.down_until is not None:
                    self.pending_back.append(step.who)
                else:
                    self.connect_subscriber(now, step.who, step.clean_start or not sub.persistent, "plan")
        elif step.kind == "fault":
            self.fault(now, step)

    def connect_publisher(self, now: int, name: str) -> None:
        protocol = self.protocols[name]
        self.emit(now, Kind.CONNECT, client=name, node="broker-1", protocol=protocol, clean_start=True,
                  session_present=False, reason_code=0, session_expiry_s=0 if protocol == 5 else None,
                  detail=json.dumps({"why": "start", "role": "publisher"}))
        self.connections += 1
        self.connected[name] = self.connections

    def publish(self, now: int, step: Step) -> None:
        p = self.plan.publishers[step.who % len(self.plan.publishers)]
        topic = p.topics[step.topic % len(p.topics)]
        seq = self.pub_seq[p.name] = self.pub_seq.get(p.name, 0) + 1
        expiry = step.expiry_s if p.protocol == 5 else None
        props = canonical_props(step.content_type, step.props) if p.protocol == 5 else None
        up = self.connected.get(p.name) is not None and self.down_until is None
        message = Message(p.name, seq, topic, step.qos, expiry, props, now, p.protocol)
        pid = (seq - 1) % 65535 + 1 if step.qos > 0 and up else None
        base = dict(client=p.name, node="broker-1", protocol=p.protocol, topic=topic, qos=step.qos, packet_id=pid,
                    publisher=p.name, pub_seq=seq)
        invoke = self.emit(now, Kind.PUBLISH_INVOKE, **base, payload_size=PAYLOAD, expiry_s=expiry,
                           send_wall_us=None, body_hash=body_hash(p.name, seq), dup=False, retain=False, props=props)
        message.t_invoke = invoke["t_mono_us"]
        if not up:
            self.emit(now, Kind.PUBLISH_FAIL, **base, detail=json.dumps({"reason": "not connected; never sent"}))
            return
        # The broker saves a message after the write its PUBACK waits for (the PUBACK is observed first, on
        # loopback); a publisher's messages are routed in the order it sent them (one log partition) and
        # acknowledged so.  ``slow_acks``: a PUBACK that took long, observed after the deliveries.
        conn = self.connected[p.name]
        if self.plan.behaviour.slow_acks and self.rng.random() < 0.3:
            route_t = self.in_order(conn, f"route {p.name}", now + self.lat(300, 5000))
            ack_t = self.in_order(conn, "ack", route_t + self.lat(2000, 40_000))
        else:
            ack_t = self.in_order(conn, "ack", now + self.lat(500, 8000))
            route_t = self.in_order(conn, f"route {p.name}", ack_t + self.lat(100, 3000))
        self.at(route_t, self.route, message)
        self.at(ack_t, self.publish_outcome, message, conn)

    def publish_outcome(self, now: int, message: Message, conn: int) -> None:
        base = dict(client=message.publisher, node="broker-1", protocol=message.protocol, topic=message.topic,
                    qos=message.qos, packet_id=(message.pub_seq - 1) % 65535 + 1 if message.qos else None,
                    publisher=message.publisher, pub_seq=message.pub_seq)
        if self.connected.get(message.publisher) != conn:
            self.emit(now, Kind.PUBLISH_INDETERMINATE, **base,
                      detail=json.dumps({"reason": "connection lost before the acknowledgement"}))
            return
        self.emit(now, Kind.PUBLISH_ACK, **base, reason_code=0, detail=json.dumps({"latency_ms": 1.0}))

    # -- subscribers -------------------------------------------------------------------------------------
    def connect_subscriber(self, now: int, index: int, clean_start: bool, why: str) -> None:
        sub = self.plan.subscribers[index]
        if self.connected.get(sub.name) is not None:
            return
        if self.down_until is not None:
            self.pending_back.append(index)
            return
        session = self.sessions.get(sub.name)
        if session is not None and session.t_disconnect is not None and sub.protocol == 5 \
                and (sub.session_expiry_s or 0) > 0 and now - session.t_disconnect > sub.session_expiry_s * 1_000_000:
            session = None  # its expiry elapsed while offline: the broker has ended it
        present = session is not None and not clean_start
        if not present:
            self.held = {k: v for k, v in self.held.items() if k[0] != sub.name}
            # Persistent as this CONNECT asks: CleanSession = 0 / clean start 0, or (MQTT 5) a session expiry > 0.
            keeps = not clean_start or (sub.protocol == 5 and (sub.session_expiry_s or 0) > 0)
            session = Session(sub, keeps, counter=self.first_counter if sub.name not in self.had_session else 0)
            self.sessions[sub.name] = session
            self.had_session.add(sub.name)
        detail: dict[str, Any] = {"why": why, "role": "subscriber"}
        if sub.protocol == 5 and sub.receive_maximum is not None:
            detail["receive_maximum"] = sub.receive_maximum
        if sub.protocol == 5 and sub.maximum_packet_size is not None:
            detail["maximum_packet_size"] = sub.maximum_packet_size
        self.emit(now, Kind.CONNECT, client=sub.name, node="broker-1", protocol=sub.protocol, clean_start=clean_start,
                  session_present=present, reason_code=0,
                  session_expiry_s=(sub.session_expiry_s or 0) if sub.protocol == 5 else None,
                  detail=json.dumps(detail))
        self.connections += 1
        conn = self.connections
        self.connected[sub.name] = conn
        session.conn, session.t_disconnect = conn, None
        if not session.persistent:
            session.counter = 0  # a clean session's ids are its connection's
        for stored in session.inflight.values():
            stored.resend = True
        if not present or self.rng.random() < 0.3:  # a new session subscribes; a resumed one sometimes again
            self.at(now + self.lat(200, 2000), self.subscribe, index, conn)
        self.at(now + self.lat(100, 1000), self.pump, sub.name, conn)

    def subscribe(self, now: int, index: int, conn: int) -> None:
        sub = self.plan.subscribers[index]
        if self.connected.get(sub.name) != conn:
            return
        session = self.sessions[sub.name]
        session.subs[sub.topic_filter] = sub.qos
        detail: dict[str, Any] = {"requested_qos": sub.qos, "rap": False, "no_local": False}
        if sub.sub_id is not None and sub.protocol == 5:
            detail["sub_id"] = sub.sub_id
        self.emit(now, Kind.SUBSCRIBE_ACK, client=sub.name, node="broker-1", protocol=sub.protocol,
                  topic=sub.topic_filter, qos=sub.qos, packet_id=1, detail=json.dumps(detail))

    def disconnect_subscriber(self, now: int, index: int, abrupt: bool, why: str, initiator: str | None = None) -> None:
        sub = self.plan.subscribers[index]
        if self.connected.get(sub.name) is None:
            return
        self.connected[sub.name] = None
        self.emit(now, Kind.DISCONNECT, client=sub.name, node="broker-1", protocol=sub.protocol,
                  initiator=initiator or ("harness" if abrupt else "client"), abrupt=abrupt,
                  detail=json.dumps({"why": why, "was_connected": True}))
        session = self.sessions[sub.name]
        session.conn, session.t_disconnect = None, now
        if not session.persistent:
            del self.sessions[sub.name]  # a clean session ends with its connection

    # -- the broker's message path ---------------------------------------------------------------------------
    def deadline(self, message: Message) -> int:
        ttl = self.plan.setup.ttl_s
        if message.expiry_s is not None:
            return message.t_invoke + message.expiry_s * 1_000_000
        return message.t_invoke + (ttl * 1_000_000 if ttl is not None else 1 << 61)

    def route(self, now: int, message: Message) -> None:
        if self.down_until is not None:
            self.deferred.append(message)  # in the log (Kafka) already: routed once the node is back
            return
        for name, session in list(self.sessions.items()):
            granted = [g for f, g in session.subs.items() if matches(f, message.topic)]
            if not granted:
                continue
            qos = min(message.qos, max(granted))
            if session.persistent and qos > 0:
                self.save(session, Stored(message, qos))
            elif session.conn is not None:
                session.store.append(Stored(message, qos))
            self.at(now + self.lat(50, 500), self.pump, name, session.conn)

    def save(self, session: Session, stored: Stored) -> None:
        """A persistent session's store: an id from its counter, then trimmed to the limit."""
        setup, trim = self.plan.setup, self.plan.behaviour.trim
        session.counter = session.counter % 65535 + 1
        stored.pid = session.counter
        session.store.append(stored)
        limit = setup.limit if setup.target == "reference" or setup.queue_policy in ("drop_oldest", "drop_newest") \
            else None
        if limit is None or len(session.store) <= limit or trim == "none":
            return
        newest = (setup.queue_policy == "drop_newest" and setup.target == "external") != (trim == "newest")
        dropped = session.store.pop(-1 if newest else 0)
        if dropped.pid is not None and session.inflight.get(dropped.pid) is dropped:
            del session.inflight[dropped.pid]

    def pump(self, now: int, name: str, conn: int | None) -> None:
        """Send what the session has for its connection: resends first, then the queue, one at a time."""
        session = self.sessions.get(name)
        if session is None or session.conn is None or session.conn != conn or self.connected.get(name) != conn:
            return
        sub = session.sub
        window = sub.receive_maximum if sub.protocol == 5 and sub.receive_maximum else 65535
        resends = [s for s in session.store if s.resend and s.pid in session.inflight and s.sent_on != conn]
        if not session.persistent:
            resends = []
        waiting = [s for s in session.store if s.sent_on is None]
        item = resends[0] if resends else (waiting[0] if waiting else None)
        if item is None:
            return
        if not item.resend and item.qos > 0 and len(session.inflight) >= window:
            return  # the client's receive maximum: wait for an ack
        if now > self.deadline(item.message) and not item.pubrec:  # a QoS 2 exchange begun is completed
            session.store.remove(item)  # expired: never sent (again)
            session.inflight.pop(item.pid, None)
            self.at(now + 10, self.pump, name, conn)
            return
        if item.pid is None and item.qos > 0:
            session.counter = session.counter % 65535 + 1
            item.pid = session.counter
        dup = item.resend
        item.sent_on, item.resend = conn, False
        if dup and item.pubrec:  # the client answered the PUBLISH before: only the PUBREL is owed again
            self.at(self.in_order(conn, "down", now + self.lat(100, 2000)), self.pubrel_arrives, name, conn, item)
            self.at(now + self.lat(50, 800), self.pump, name, conn)
            return
        if item.qos > 0:
            session.inflight[item.pid] = item
        else:
            session.store.remove(item)
        self.at(self.in_order(conn, "down", now + self.lat(100, 2000)), self.arrive, name, conn, item, dup)
        self.at(now + self.lat(50, 800), self.pump, name, conn)

    def arrive(self, now: int, name: str, conn: int, item: Stored, dup: bool) -> None:
        """The PUBLISH reaches the client (if its connection still stands), and the client answers."""
        if self.connected.get(name) != conn:
            return
        sub = self.plan.subscribers[[s.name for s in self.plan.subscribers].index(name)]
        m = item.message
        remaining = None
        if sub.protocol == 5 and m.expiry_s is not None:
            remaining = max(0, m.expiry_s - (now - m.t_invoke) // 1_000_000)
        sub_ids = str(sub.sub_id) if sub.protocol == 5 and sub.sub_id is not None else None
        props = m.props if sub.protocol == 5 else None
        size = packet_size(m.topic, item.qos, sub.protocol, props, remaining, sub_ids)
        if sub.protocol == 5 and sub.maximum_packet_size is not None and size > sub.maximum_packet_size:
            raise ValueError(f"{name}: a {size}-byte PUBLISH against its Maximum Packet Size "
                             f"{sub.maximum_packet_size}: the plan's limits must fit every message")
        fields = dict(client=name, node="broker-1", protocol=sub.protocol, topic=m.topic, qos=item.qos,
                      packet_id=item.pid if item.qos > 0 else None, dup=dup, retain=False, payload_size=PAYLOAD,
                      remaining_expiry_s=remaining, publisher=m.publisher, pub_seq=m.pub_seq, send_wall_us=None,
                      body_hash=body_hash(m.publisher, m.pub_seq), props=props, sub_ids=sub_ids, packet_size=size)
        if item.qos == 2:
            # PUBLISH -> PUBREC; the client holds the message until the PUBREL, which the broker sends once it
            # has the PUBREC (and again on a resumed session); only then does the application get it.
            self.emit(now, Kind.QOS2_RECEIVED, **fields)
            self.held[(name, item.pid)] = fields
            self.at(self.in_order(conn, "up", now + self.lat(50, 1000)), self.broker_pubrec, name, conn, item)
            return
        self.emit(now, Kind.DELIVERY, **fields)
        if item.qos > 0:
            self.at(self.in_order(conn, "up", now + self.lat(50, 1000)), self.client_ack, name, conn, item)

    def broker_pubrec(self, now: int, name: str, conn: int, item: Stored) -> None:
        if self.connected.get(name) != conn:
            return  # the PUBREC never reached the broker: it resends the PUBLISH
        item.pubrec = True
        self.at(self.in_order(conn, "down", now + self.lat(100, 2000)), self.pubrel_arrives, name, conn, item)

    def pubrel_arrives(self, now: int, name: str, conn: int, item: Stored) -> None:
        if self.connected.get(name) != conn:
            return
        sub = self.sessions[name].sub
        fields = self.held.pop((name, item.pid), None)
        self.emit(now, Kind.PUBREL_RECEIVED, client=name, node="broker-1", protocol=sub.protocol, packet_id=item.pid,
                  detail=json.dumps({"known": fields is not None}))
        if fields is not None:
            self.emit(now, Kind.DELIVERY, **fields)  # the release: the application gets the message now
        self.at(self.in_order(conn, "up", now + self.lat(50, 1000)), self.client_ack, name, conn, item)

    def client_ack(self, now: int, name: str, conn: int, item: Stored) -> None:
        if self.connected.get(name) != conn:
            return  # cut before the ack left: the broker resends it on a resumed session
        sub = self.sessions[name].sub
        m = item.message
        self.emit(now, Kind.DELIVERY_ACK_SENT, client=name, node="broker-1", protocol=sub.protocol, topic=m.topic,
                  qos=item.qos, packet_id=item.pid, publisher=m.publisher, pub_seq=m.pub_seq)
        session = self.sessions[name]
        if session.inflight.get(item.pid) is item:
            del session.inflight[item.pid]
        if item in session.store:
            session.store.remove(item)
        self.at(now + 20, self.pump, name, conn)

    # -- faults --------------------------------------------------------------------------------------------
    def fault(self, now: int, step: Step) -> None:
        if self.down_until is not None:
            return
        fault_id = f"f{sum(1 for r in self.rows if r['kind'] == Kind.FAULT_START) + 1}"
        base = dict(fault_id=fault_id, fault_kind=step.fault_kind, node=step.node)
        self.emit(now, Kind.FAULT_START, **base, detail=json.dumps({"node": step.node}))
        self.emit(now, Kind.NODE_EVENT, node=step.node, detail=json.dumps({"action": "kill"}))
        self.emit(now, Kind.FAULT_EVIDENCE, **base, bit=True, detail=json.dumps({"evidence": "process gone"}))
        heal = now + max(1, step.duration_ms) * 1000
        if step.node.startswith("broker"):
            self.down_until = heal
            for i, s in enumerate(self.plan.subscribers):
                if self.connected.get(s.name) is not None:
                    self.disconnect_subscriber(now, i, True, "connection lost", initiator="server")
                    self.pending_back.append(i)
            for p in self.plan.publishers:
                if self.connected.get(p.name) is not None:
                    self.connected[p.name] = None
                    self.emit(now, Kind.DISCONNECT, client=p.name, node="broker-1", protocol=p.protocol,
                              initiator="server", abrupt=True, detail=json.dumps({"why": "connection lost"}))
            setup = self.plan.setup
            unpromised = step.fault_kind in UNPROMISED_FAULTS.get(setup.persistence, ())
            if unpromised and self.plan.behaviour.lose_on_unpromised_kill:
                self.sessions.clear()  # what the target never promised to keep across this fault
        self.at(heal, self.heal, step, base)

    def heal(self, now: int, step: Step, base: dict) -> None:
        self.emit(now, Kind.FAULT_HEAL, **base)
        self.emit(now, Kind.NODE_EVENT, node=step.node, detail=json.dumps({"action": "restart"}))
        if not step.node.startswith("broker"):
            return
        self.down_until = None
        t = now + 5000
        for message in self.deferred:
            self.at(now + 1000, self.route, message)
        self.deferred = []
        for p in self.plan.publishers:
            if self.connected.get(p.name) is None:
                t += 300
                self.at(t, lambda n, name=p.name: self.connect_publisher(n, name))
        waiting, self.pending_back = sorted(set(self.pending_back)), []
        for i in waiting:
            t += 300
            sub = self.plan.subscribers[i]
            self.at(t, self.connect_subscriber, i, not sub.persistent, "auto-reconnect")


def simulate(plan: Plan) -> list[Row]:
    return Broker(plan).run()
