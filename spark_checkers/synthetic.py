"""Synthetic histories in the exact history schema, clean or with planted anomalies at known places.

Pure Python + pyarrow (no Spark): a tiny deterministic model of a correct broker with persistent sessions
(P2P pairs: ``pub-i`` → ``europe/ua/kyiv/i/0`` → ``sub-i`` on ``europe/ua/kyiv/i/+``, optionally one
``sub-all`` watching ``europe/ua/kyiv/#``), offline windows with backlog, trimming to the limit, message
expiry, packet ids that wrap 65535 → 1, faults with evidence, the drain and white-box snapshots.
Mutations (``drop_delivery``, ``swap_deliveries``, ...) then plant exactly one anomaly.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from contracts.history_schema import (
    EVENT_SCHEMA,
    LOG_SCHEMA,
    SCHEMA_VERSION,
    V2_COLUMNS,
    Kind,
    LogSource,
    Manifest,
    Phase,
    write_log_table,
    write_manifest,
    write_part,
)
from contracts.invariants import UNDECLARED_QUEUE_LIMIT, UNDECLARED_TTL_S
from contracts.topics import filter_matches

Row = dict[str, Any]
T0_US = 1_000_000
START_WALL_US = 1_790_000_000_000_000


@dataclass(frozen=True)
class Offline:
    """Subscriber ``sub-<subscriber>`` is offline while message slots [from_slot, to_slot) are published."""

    subscriber: int
    from_slot: int
    to_slot: int


@dataclass(frozen=True)
class Fault:
    fault_id: str
    kind: str  # e.g. "kill"
    node: str  # e.g. "redis-7003"
    start_slot: int
    heal_slot: int
    bit: bool | None = True  # None: no evidence row at all
    error: bool = False  # a fault_error row instead of evidence


@dataclass(frozen=True)
class Spec:
    pairs: int = 2
    messages: int = 20  # per publisher; slots 1..messages
    interval_us: int = 100_000
    latency_us: int = 5_000
    qos: int = 1
    protocol: int = 4
    expiry_s: int | None = None  # MQTT 5 message expiry on every publish
    # MQTT 5 (schema version 2): the forwarded properties of every publish and its deliveries (canonical JSON, as
    # contracts/mqtt_properties.py writes them), the Subscription Identifier of every subscription (each delivery
    # carries it), and the QoS 2 flow's own rows (qos2_received, pubrel_received) before each QoS 2 delivery.
    props: str | None = None
    sub_id: int | None = None
    qos2_flow: bool = False
    offline: tuple[Offline, ...] = ()
    first_packet_id: int = 1
    limit: int = UNDECLARED_QUEUE_LIMIT
    ttl_s: int = UNDECLARED_TTL_S
    tolerance_ms: int = 200  # a fixture tighter than the default (500): the planted near-misses are built on it
    pipeline_slack_ms: int = 20  # under the 25 ms between a reconnect and the next slot: every backlog settled
    allowed: tuple[str, ...] = ()
    target_kind: str = "reference"
    faults: tuple[Fault, ...] = ()
    watcher: bool = False  # add sub-all on europe/ua/kyiv/# (always online)
    trim_mode: str = "oldest"  # oldest (correct) | none (over limit) | one_extra | newest | newest_one_extra
    # An external target's declaration (scenario.json target.promises): its queue policy and persistence.
    queue_policy: str = "drop_oldest"
    persistence: str = "kill"
    target_name: str = "broker"
    indeterminate: tuple[tuple[int, int], ...] = ()  # (publisher index, pub_seq) with no ack
    scenario_name: str = "synthetic"
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)
    # The nodes' logs (history/logs.parquet): (node, role, line) in order; None = a clean log of a correct
    # broker (clean_log_lines).  ``unread_logs``: nodes whose log could not be read (their source says why).
    log_lines: tuple[tuple[str, str, str], ...] | None = None
    unread_logs: tuple[str, ...] = ()
    failure_strategy: str = "skip"  # both stages' [broker] *_failure_strategy (the log oracle's defaults)
    # [broker] application_clients as client-id globs: the reference broker's APPLICATION clients
    application_clients: tuple[str, ...] = ()
    # A shared group of this many members (share-0, share-1, ...) on $share/g/europe/ua/kyiv/+/0, always online:
    # message k of the run (in arrival order) goes to member k mod shared_members, acknowledged.
    shared_members: int = 0

    def scenario(self) -> dict[str, Any]:
        return {
            "name": self.scenario_name,
            "broker": {"persisted_messages_limit": self.limit, "persisted_message_ttl_s": self.ttl_s,
                       "incoming_failure_strategy": self.failure_strategy,
                       "persisted_failure_strategy": self.failure_strategy,
                       **({"application_clients": [{"client_id": glob} for glob in self.application_clients]}
                          if self.application_clients else {})},
            "checks": {"clock_tolerance_ms": self.tolerance_ms, "allowed": list(self.allowed),
                       "pipeline_slack_ms": self.pipeline_slack_ms},
            "target": ({"kind": self.target_kind} if self.target_kind == "reference" else {
                "kind": self.target_kind, "name": self.target_name, "start": ["mosquitto"],  # its log preset
                "promises": {"queue_limit": None if self.queue_policy == "none" else self.limit,
                             "queue_policy": self.queue_policy, "persistence": self.persistence,
                             "message_ttl_s": self.ttl_s, "mqtt_versions": ["3.1.1", "5"]}}),
        }


SHARED_FILTER = "$share/g/europe/ua/kyiv/+/0"  # Spec.shared_members' group


def body_hash(publisher: str, pub_seq: int) -> str:
    return hashlib.blake2b(f"{publisher}:{pub_seq}".encode(), digest_size=8).hexdigest()


def next_packet_id(packet_id: int) -> int:
    return packet_id % 65535 + 1  # 65535 -> 1, never 0


def slot_time(spec: Spec, slot: int) -> int:
    return T0_US + (slot - 1) * spec.interval_us


def generate(spec: Spec) -> list[Row]:
    """The rows of a correct run of ``spec``, sorted by time (seq is assigned when written)."""
    rows: list[Row] = []
    session_expiry = 3600 if spec.protocol == 5 else None

    def add(t: int, kind: str, **fields: Any) -> Row:
        row = {"t_mono_us": t, "kind": kind, **fields}
        rows.append(row)
        return row

    add(0, Kind.PHASE, detail=json.dumps({"phase": Phase.RUN_START}))
    subscribers = [(f"sub-{i}", f"europe/ua/kyiv/{i}/+") for i in range(spec.pairs)]
    if spec.watcher:
        subscribers.append(("sub-all", "europe/ua/kyiv/#"))
    for i in range(spec.pairs):
        add(T0_US - 60_000, Kind.CONNECT, client=f"pub-{i}", node="broker-1", protocol=spec.protocol,
            clean_start=True, session_present=False, reason_code=0, session_expiry_s=0 if spec.protocol == 5 else None)
    members = [f"share-{m}" for m in range(spec.shared_members)]
    for name in members:
        add(T0_US - 50_000, Kind.CONNECT, client=name, node="broker-1", protocol=spec.protocol, clean_start=False,
            session_present=False, reason_code=0, session_expiry_s=session_expiry)
        add(T0_US - 40_000, Kind.SUBSCRIBE_ACK, client=name, node="broker-1", protocol=spec.protocol,
            topic=SHARED_FILTER, qos=spec.qos, detail=json.dumps(_subscribe_detail(spec)))
    for name, topic_filter in subscribers:
        add(T0_US - 50_000, Kind.CONNECT, client=name, node="broker-1", protocol=spec.protocol, clean_start=False,
            session_present=False, reason_code=0, session_expiry_s=session_expiry)
        add(T0_US - 40_000, Kind.SUBSCRIBE_ACK, client=name, node="broker-1", protocol=spec.protocol,
            topic=topic_filter, qos=spec.qos, detail=json.dumps(_subscribe_detail(spec)))
    add(T0_US - 1, Kind.PHASE, detail=json.dumps({"phase": Phase.WORKLOAD_START}))

    # Publishes: invoke, then an ack 2 ms later (or an indeterminate outcome).
    arrivals: list[tuple[int, int, str, int, str, int | None]] = []  # (t_arrival, t_invoke, publisher, seq, topic, expiry)
    indeterminate = set(spec.indeterminate)
    for seq in range(1, spec.messages + 1):
        for i in range(spec.pairs):
            publisher, topic = f"pub-{i}", f"europe/ua/kyiv/{i}/0"
            t = slot_time(spec, seq) + i * 1000
            add(t, Kind.PUBLISH_INVOKE, client=publisher, node="broker-1", protocol=spec.protocol, topic=topic,
                qos=spec.qos, packet_id=(seq - 1) % 65535 + 1, payload_size=62, expiry_s=spec.expiry_s,
                publisher=publisher, pub_seq=seq, send_wall_us=START_WALL_US + t, body_hash=body_hash(publisher, seq),
                dup=False, retain=False, props=spec.props if spec.protocol == 5 else None)
            outcome = Kind.PUBLISH_INDETERMINATE if (i, seq) in indeterminate else Kind.PUBLISH_ACK
            add(t + 2000, outcome, client=publisher, node="broker-1", protocol=spec.protocol, topic=topic, qos=spec.qos,
                packet_id=(seq - 1) % 65535 + 1, publisher=publisher, pub_seq=seq, reason_code=0)
            arrivals.append((t + 2000, t, publisher, seq, topic, spec.expiry_s))
    last_publish = slot_time(spec, spec.messages) + spec.pairs * 1000
    add(last_publish + 10_000, Kind.PHASE, detail=json.dumps({"phase": Phase.WORKLOAD_END}))

    for fault in spec.faults:
        start, heal = slot_time(spec, fault.start_slot) + spec.interval_us // 3, slot_time(spec, fault.heal_slot)
        add(start, Kind.FAULT_START, fault_id=fault.fault_id, fault_kind=fault.kind, node=fault.node,
            detail=json.dumps({"node": fault.node}))
        add(start + 1, Kind.NODE_EVENT, node=fault.node, detail=json.dumps({"action": fault.kind}))
        if fault.error:
            add(start + 2, Kind.FAULT_ERROR, fault_id=fault.fault_id, fault_kind=fault.kind, node=fault.node,
                detail=json.dumps({"error": "could not apply"}))
        elif fault.bit is not None:
            add(start + 2, Kind.FAULT_EVIDENCE, fault_id=fault.fault_id, fault_kind=fault.kind, node=fault.node,
                bit=fault.bit, detail=json.dumps({"evidence": "process dead" if fault.bit else "still alive"}))
        add(heal, Kind.FAULT_HEAL, fault_id=fault.fault_id, fault_kind=fault.kind, node=fault.node)
        add(heal + 1, Kind.NODE_EVENT, node=fault.node, detail=json.dumps({"action": "restart"}))

    last_delivery = last_publish
    last_packet_ids: dict[str, int] = {}
    for index, (name, topic_filter) in enumerate(subscribers):
        windows = [w for w in spec.offline if w.subscriber == index]
        matching = sorted(a for a in arrivals if filter_matches(topic_filter, a[4]))
        packet_id = spec.first_packet_id
        pending: list[tuple] = []
        busy_until = 0
        packet_ids_used = 0

        def deliver(t: int, arrival: tuple, name: str, dup: bool = False) -> int:
            nonlocal packet_id, packet_ids_used
            _, t_invoke, publisher, seq, topic, expiry = arrival
            remaining = None
            if spec.protocol == 5 and expiry is not None:
                remaining = expiry - (t - t_invoke) // 1_000_000
            v5 = spec.protocol == 5
            carried = dict(client=name, node="broker-1", protocol=spec.protocol, topic=topic, qos=spec.qos,
                           packet_id=packet_id if spec.qos > 0 else None, dup=dup, retain=False, payload_size=62,
                           publisher=publisher, pub_seq=seq, send_wall_us=START_WALL_US + t_invoke,
                           body_hash=body_hash(publisher, seq), props=spec.props if v5 else None,
                           sub_ids=str(spec.sub_id) if v5 and spec.sub_id is not None else None,
                           packet_size=publish_packet_size(spec, topic))
            if spec.qos == 2 and spec.qos2_flow:  # the PUBLISH answered with PUBREC, then its PUBREL
                add(t - 40, Kind.QOS2_RECEIVED, **carried)
                add(t - 20, Kind.PUBREL_RECEIVED, client=name, node="broker-1", protocol=spec.protocol,
                    packet_id=packet_id, detail=json.dumps({"known": True}))
            add(t, Kind.DELIVERY, remaining_expiry_s=remaining, **carried)
            if spec.qos > 0:
                add(t + 300, Kind.DELIVERY_ACK_SENT, client=name, node="broker-1", protocol=spec.protocol,
                    packet_id=packet_id, qos=spec.qos)
                last_packet_ids[name] = packet_id
                packet_id = next_packet_id(packet_id)
                packet_ids_used += 1
            return t

        def expired(arrival: tuple, at: int) -> bool:
            expiry = arrival[5] if arrival[5] is not None else spec.ttl_s
            return arrival[1] + expiry * 1_000_000 <= at

        events = sorted([(a[0], 1, a) for a in matching]
                        + [(slot_time(spec, w.from_slot) - spec.interval_us // 4, 0, ("off", w)) for w in windows]
                        + [(slot_time(spec, w.to_slot) - spec.interval_us // 4, 0, ("on", w)) for w in windows],
                        key=lambda e: (e[0], e[1]))
        online = True
        for t, _, item in events:
            if item[0] == "off":
                add(t, Kind.DISCONNECT, client=name, node="broker-1", protocol=spec.protocol, initiator="harness",
                    abrupt=True)
                online = False
            elif item[0] == "on":
                add(t, Kind.CONNECT, client=name, node="broker-1", protocol=spec.protocol, clean_start=False,
                    session_present=True, reason_code=0, session_expiry_s=session_expiry)
                online = True
                backlog = [a for a in pending if not expired(a, t)]
                backlog = _trim(backlog, spec.limit, spec.trim_mode)
                pending = []
                # Why: the backlog is redelivered in queue order before any live message may overtake it.
                busy_until = t + 2000
                for arrival in backlog:
                    busy_until = deliver(busy_until, arrival, name) + 50
            elif online:
                t_delivery = max(t + spec.latency_us, busy_until)
                if not expired(item, t_delivery):
                    busy_until = deliver(t_delivery, item, name) + 50
            else:
                pending.append(item)
        last_delivery = max(last_delivery, busy_until)
        last_packet_ids.setdefault(name, (spec.first_packet_id - 2) % 65535 + 1 if packet_ids_used == 0 else packet_id)

    member_ids = {name: spec.first_packet_id for name in members}
    for k, (t_arrival, t_invoke, publisher, seq, topic, _) in enumerate(sorted(arrivals)):
        if not members:
            break
        name = members[k % len(members)]
        t = t_arrival + spec.latency_us
        add(t, Kind.DELIVERY, client=name, node="broker-1", protocol=spec.protocol, topic=topic, qos=spec.qos,
            packet_id=member_ids[name] if spec.qos > 0 else None, dup=False, retain=False, payload_size=62,
            publisher=publisher, pub_seq=seq, send_wall_us=START_WALL_US + t_invoke, body_hash=body_hash(publisher, seq),
            props=spec.props if spec.protocol == 5 else None, packet_size=publish_packet_size(spec, topic))
        if spec.qos > 0:
            add(t + 300, Kind.DELIVERY_ACK_SENT, client=name, node="broker-1", protocol=spec.protocol,
                packet_id=member_ids[name], qos=spec.qos)
            member_ids[name] = next_packet_id(member_ids[name])
        last_delivery = max(last_delivery, t + 300)

    drain_start = last_publish + 100_000
    add(drain_start, Kind.PHASE, detail=json.dumps({"phase": Phase.HEAL_ALL}))
    add(drain_start + 1, Kind.PHASE, detail=json.dumps({"phase": Phase.DRAIN_START}))
    drain_end = max(drain_start, last_delivery) + 1_000_000
    add(drain_end, Kind.PHASE, detail=json.dumps({"phase": Phase.DRAIN_END, "reason": "quiet"}))
    if spec.target_kind == "reference":
        for name, _ in subscribers:
            add(drain_end + 10, Kind.SESSION_SNAPSHOT, client=name, node="redis-7001", zset_size=0,
                last_packet_id=last_packet_ids[name], orphan_payloads=0, dangling_refs=0, detail=json.dumps({}))
    add(drain_end + 100, Kind.PHASE, detail=json.dumps({"phase": Phase.SNAPSHOT_DONE}))
    add(drain_end + 200, Kind.PHASE, detail=json.dumps({"phase": Phase.RUN_END}))
    return sort_rows(rows)


def _subscribe_detail(spec: Spec) -> dict[str, Any]:
    """A subscribe_ack row's detail: the options of its SUBSCRIBE (docs/history.md)."""
    detail: dict[str, Any] = {"requested_qos": spec.qos, "rap": False, "no_local": False}
    if spec.protocol == 5 and spec.sub_id is not None:
        detail["sub_id"] = spec.sub_id
    return detail


def publish_packet_size(spec: Spec, topic: str) -> int:
    """The size of a synthetic PUBLISH packet: fixed header, topic, packet id, properties, the 62-byte payload."""
    properties = 0 if spec.protocol != 5 else 1 + len(spec.props or "")
    return 2 + 2 + len(topic.encode()) + (2 if spec.qos > 0 else 0) + properties + 62


def _trim(backlog: list[tuple], limit: int, mode: str) -> list[tuple]:
    """Which of the backlog (oldest first) the broker keeps, per ``Spec.trim_mode``."""
    if len(backlog) <= limit or mode == "none":
        return backlog
    if mode == "oldest":
        return backlog[-limit:]
    if mode == "one_extra":
        return backlog[-(limit - 1):]
    if mode == "newest":
        excess = len(backlog) - limit
        return backlog[:-excess]
    if mode == "newest_one_extra":
        return backlog[:limit - 1]
    raise ValueError(f"Spec.trim_mode must be oldest|none|one_extra|newest|newest_one_extra, got {mode!r}")


def sort_rows(rows: Iterable[Row]) -> list[Row]:
    """Stable sort by monotonic time: the recorder's order."""
    return sorted(rows, key=lambda row: row["t_mono_us"])


# --- Writing ---------------------------------------------------------------------------------------------


def write_run(run_dir: Path, rows: list[Row], spec: Spec, *, complete: bool = True, parts: int = 2,
              schema_version: int = SCHEMA_VERSION, end_reason: str = "drained") -> Path:
    """Write ``rows`` as a run directory: history/ (manifest + parts), scenario.json, plan.json."""
    run_dir = Path(run_dir)
    history_dir = run_dir / "history"
    history_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "scenario.json").write_text(json.dumps(spec.scenario(), indent=2))
    (run_dir / "plan.json").write_text(json.dumps({"synthetic": True, "seed": spec.seed}))
    ordered = sort_rows(rows) if schema_version >= 2 else version_1_rows(rows)
    records = []
    for seq, row in enumerate(ordered):
        record = dict(row)
        record["seq"] = seq
        record["t_wall_us"] = START_WALL_US + row["t_mono_us"]
        records.append(record)
    schema = EVENT_SCHEMA.with_metadata({b"ordeal.history.schema_version": str(schema_version).encode()})
    if schema_version < 2:  # a version 1 history has none of the version 2 columns
        schema = pa.schema([f for f in schema if f.name not in V2_COLUMNS], metadata=schema.metadata)
        records = [{k: v for k, v in r.items() if k not in V2_COLUMNS} for r in records]
    table = pa.Table.from_pylist(records, schema=schema)
    written = []
    chunk = max(1, -(-len(records) // parts))
    for index in range(parts):
        part = table.slice(index * chunk, chunk)
        if part.num_rows == 0 and index > 0:
            break
        written.append(write_part(history_dir, index, part))
    write_manifest(history_dir, Manifest(
        run_id=run_dir.name, complete=complete, parts=tuple(written), end_reason=end_reason,
        incomplete_reason="" if complete else end_reason, started_wall_us=START_WALL_US,
        updated_wall_us=START_WALL_US, meta={"scenario": spec.scenario_name, "seed": spec.seed},
        schema_version=schema_version))
    write_logs(history_dir, spec)
    return run_dir


# What a version 1 history did not record: the version 2 kinds and detail keys (docs/history.md).
V2_KINDS = (Kind.QOS2_RECEIVED, Kind.PUBREL_RECEIVED)
V2_DETAIL_KEYS = ("receive_maximum", "maximum_packet_size", "requested_qos", "sub_id", "rap", "no_local")


def version_1_rows(rows: list[Row]) -> list[Row]:
    """``rows`` as a version 1 recorder wrote them: without the version 2 kinds and detail keys (the columns go when
    written: ``write_run``)."""
    out = []
    for row in sort_rows(rows):
        if row["kind"] in V2_KINDS:
            continue
        if row.get("detail") and any(k in row["detail"] for k in V2_DETAIL_KEYS):
            detail = {k: v for k, v in json.loads(row["detail"]).items() if k not in V2_DETAIL_KEYS}
            row = {**row, "detail": json.dumps(detail) if detail else None}
        out.append(row)
    return out


def clean_log_lines(spec: Spec) -> tuple[tuple[str, str, str], ...]:
    """What the nodes of a correct run log: INFO lines and the warnings of a fault the broker survives."""
    if spec.target_kind != "reference":
        return ((spec.target_name, "mqtt-broker", "1790000001: New client connected from 127.0.0.1:50000 as sub-0"),)
    return (
        ("broker-1", "broker", "2026-09-21 12:26:41,000 broker-1 INFO reference_broker: broker-1 ready"),
        ("broker-1", "broker", "2026-09-21 12:26:43,000 broker-1 WARNING reference_broker.pipeline: "
                               "tbmq.msg.persisted: processing failed (attempt 1): network:ConnectionError; retrying"),
        ("redis-2", "redis", "7:M 21 Sep 2026 12:26:44.000 # Connection with replica 127.0.0.5:6379 lost."),
        ("kafka", "kafka", "ready in 44ms"),
    )


def write_logs(history_dir: Path, spec: Spec) -> Path:
    """history/logs.parquet of a synthetic run: ``spec.log_lines`` (a time stamp at the start of a line is
    not parsed here: a synthetic line's time is its position, one slot apart, from the run's start)."""
    lines = clean_log_lines(spec) if spec.log_lines is None else spec.log_lines
    rows: dict[str, list[Any]] = {name: [] for name in LOG_SCHEMA.names}
    numbers: dict[str, int] = {}
    for index, (node, role, line) in enumerate(lines):
        numbers[node] = numbers.get(node, 0) + 1
        t_mono = T0_US + index * spec.interval_us
        for key, value in (("node", node), ("role", role), ("line_no", numbers[node]),
                           ("t_wall_us", START_WALL_US + t_mono), ("t_mono_us", t_mono), ("line", line)):
            rows[key].append(value)
    roles = {node: role for node, role, _ in lines}
    sources = [LogSource(node, role, f"logs/{node}.log", lines=numbers[node]) for node, role in roles.items()
               if node not in spec.unread_logs]
    sources += [LogSource(node, roles.get(node, ""), f"logs/{node}.log", error="PermissionError: Permission denied")
                for node in spec.unread_logs]
    keep = [i for i, node in enumerate(rows["node"]) if node not in spec.unread_logs]
    table = pa.table({k: [v[i] for i in keep] for k, v in rows.items()}, schema=LOG_SCHEMA)
    return write_log_table(history_dir, table, sources)


def write_spec(run_dir: Path, spec: Spec, **kwargs: Any) -> Path:
    return write_run(run_dir, generate(spec), spec, **kwargs)


# --- Mutations: each plants exactly one anomaly and returns new rows -----------------------------------------


def _copy(rows: list[Row]) -> list[Row]:
    return copy.deepcopy(rows)


def deliveries(rows: list[Row], client: str | None = None) -> list[Row]:
    return [r for r in rows if r["kind"] == Kind.DELIVERY and (client is None or r.get("client") == client)]


def find_delivery(rows: list[Row], client: str, publisher: str, pub_seq: int, nth: int = 0) -> Row:
    found = [r for r in deliveries(rows, client) if r.get("publisher") == publisher and r.get("pub_seq") == pub_seq]
    if len(found) <= nth:
        raise LookupError(f"no delivery #{nth} of {publisher}#{pub_seq} to {client}")
    return found[nth]


def _ack_after(rows: list[Row], delivery: Row) -> Row | None:
    for row in rows:
        if (row["kind"] == Kind.DELIVERY_ACK_SENT and row.get("client") == delivery["client"]
                and row.get("packet_id") == delivery.get("packet_id") and row["t_mono_us"] >= delivery["t_mono_us"]):
            return row
    return None


def drop_delivery(rows: list[Row], client: str, publisher: str, pub_seq: int) -> list[Row]:
    """The delivery and its ack vanish: a lost message."""
    rows = _copy(rows)
    target = find_delivery(rows, client, publisher, pub_seq)
    ack = _ack_after(rows, target)
    return [r for r in rows if r is not target and r is not ack]


def drop_ack(rows: list[Row], client: str, publisher: str, pub_seq: int) -> list[Row]:
    """The subscriber never acknowledges that delivery: the message stays in flight (unacknowledged)."""
    rows = _copy(rows)
    ack = _ack_after(rows, find_delivery(rows, client, publisher, pub_seq))
    if ack is None:
        raise LookupError(f"the delivery of {publisher}#{pub_seq} to {client} has no ack to drop")
    return [r for r in rows if r is not ack]


IDENTITY_FIELDS = ("publisher", "pub_seq", "body_hash", "send_wall_us", "topic", "remaining_expiry_s")


def swap_deliveries(rows: list[Row], client: str, publisher: str, seq_a: int, seq_b: int) -> list[Row]:
    """Two messages arrive in each other's slot (packet ids and times stay): an order inversion."""
    rows = _copy(rows)
    a, b = find_delivery(rows, client, publisher, seq_a), find_delivery(rows, client, publisher, seq_b)
    for name in IDENTITY_FIELDS:
        a[name], b[name] = b.get(name), a.get(name)
    return rows


def set_delivery_field(rows: list[Row], client: str, publisher: str, pub_seq: int, **fields: Any) -> list[Row]:
    rows = _copy(rows)
    find_delivery(rows, client, publisher, pub_seq).update(fields)
    return rows


def move_delivery(rows: list[Row], client: str, publisher: str, pub_seq: int, t_mono_us: int) -> list[Row]:
    """Deliver at another time (its ack follows 300 µs later)."""
    rows = _copy(rows)
    target = find_delivery(rows, client, publisher, pub_seq)
    ack = _ack_after(rows, target)
    target["t_mono_us"] = t_mono_us
    if ack is not None:
        ack["t_mono_us"] = t_mono_us + 300
    return sort_rows(rows)


def deliver_in_batch(rows: list[Row], client: str, publisher: str, seqs: Iterable[int], t_mono_us: int) -> list[Row]:
    """Deliver ``seqs`` (in that order, their packet ids kept) in one batch from ``t_mono_us``, 50 µs apart, each
    acknowledged 300 µs after it: a slow pipeline handing a held-back queue over at once."""
    for index, seq in enumerate(seqs):
        rows = move_delivery(rows, client, publisher, seq, t_mono_us + index * 50)
    return rows


def publish_row(rows: list[Row], kind: str, publisher: str, pub_seq: int) -> Row:
    for row in rows:
        if row["kind"] == kind and row.get("publisher") == publisher and row.get("pub_seq") == pub_seq:
            return row
    raise LookupError(f"no {kind} row for {publisher}#{pub_seq}")


def fail_publish(rows: list[Row], publisher: str, pub_seq: int) -> list[Row]:
    """The publisher was told the publish failed (yet the message may still be delivered)."""
    rows = _copy(rows)
    row = publish_row(rows, Kind.PUBLISH_ACK, publisher, pub_seq)
    row["kind"], row["reason_code"] = Kind.PUBLISH_FAIL, 0x80
    return rows


def add_delivery(rows: list[Row], template: Row, t_mono_us: int, *, ack: bool = True, **fields: Any) -> list[Row]:
    """Insert a delivery built from ``template`` (another delivery row), optionally acknowledged."""
    rows = _copy(rows)
    new = {**copy.deepcopy(template), **fields, "t_mono_us": t_mono_us}
    rows.append(new)
    if ack and new.get("qos", 0) > 0:
        rows.append({"t_mono_us": t_mono_us + 300, "kind": Kind.DELIVERY_ACK_SENT, "client": new["client"],
                     "node": new.get("node"), "protocol": new.get("protocol"), "packet_id": new["packet_id"],
                     "qos": new["qos"]})
    return sort_rows(rows)


def delay_ack(rows: list[Row], client: str, publisher: str, pub_seq: int, t_mono_us: int) -> list[Row]:
    """The subscriber acknowledges that delivery only at ``t_mono_us`` (later PUBLISH packets may arrive first)."""
    rows = _copy(rows)
    ack = _ack_after(rows, find_delivery(rows, client, publisher, pub_seq))
    if ack is None:
        raise LookupError(f"the delivery of {publisher}#{pub_seq} to {client} has no ack to delay")
    ack["t_mono_us"] = t_mono_us
    return sort_rows(rows)


def resend_before_ack(rows: list[Row], client: str, publisher: str, pub_seq: int, *, dup: bool = True) -> list[Row]:
    """The first delivery's ack is lost (never sent); the broker resends the same packet id, then it is acked."""
    rows = _copy(rows)
    first = find_delivery(rows, client, publisher, pub_seq)
    ack = _ack_after(rows, first)
    assert ack is not None, "resend_before_ack needs a QoS > 0 delivery"
    ack["t_mono_us"] = first["t_mono_us"] + 200  # the ack of the resend
    resend = {**copy.deepcopy(first), "t_mono_us": first["t_mono_us"] + 100, "dup": dup}
    rows.append(resend)
    return sort_rows(rows)


def set_connect(rows: list[Row], client: str, nth: int, **fields: Any) -> list[Row]:
    rows = _copy(rows)
    connects = [r for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == client]
    connects[nth].update(fields)
    return rows


def set_snapshot(rows: list[Row], client: str, **fields: Any) -> list[Row]:
    rows = _copy(rows)
    for row in rows:
        if row["kind"] == Kind.SESSION_SNAPSHOT and row.get("client") == client:
            row.update(fields)
            return rows
    raise LookupError(f"no session_snapshot for {client}")


def set_phase_detail(rows: list[Row], phase: str, **detail: Any) -> list[Row]:
    rows = _copy(rows)
    for row in rows:
        if row["kind"] == Kind.PHASE and json.loads(row.get("detail") or "{}").get("phase") == phase:
            row["detail"] = json.dumps({"phase": phase, **detail})
            return rows
    raise LookupError(f"no phase row {phase}")


def lose_session(rows: list[Row], client: str, nth: int) -> list[Row]:
    """The broker answers session present = 0 on the ``nth`` connect (0 = first) although the session was
    persistent; the client resubscribes right away."""
    rows = _copy(rows)
    connects = [r for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == client]
    connect = connects[nth]
    connect["session_present"] = False
    subscriptions = [r for r in rows if r["kind"] == Kind.SUBSCRIBE_ACK and r.get("client") == client]
    for sub in subscriptions[:1]:
        rows.append({**copy.deepcopy(sub), "t_mono_us": connect["t_mono_us"] + 1})
    # A new session starts its stored packet ids at 1 (the reference broker discards the old counter).
    return renumber(sort_rows(rows), client, connect["t_mono_us"], 1)


def renumber(rows: list[Row], client: str, from_t: int, first_id: int) -> list[Row]:
    """Hand ``client``'s packet ids out anew from ``first_id`` (then 1..65535 in order, as the reference broker
    does) for its deliveries at or after ``from_t``: each new message takes the next id; a resend of a message
    keeps the id it got; acks follow their delivery.  The session snapshot's last packet id follows too."""
    rows = _copy(rows)
    holder: dict[int, tuple[Any, Any, int]] = {}  # old id -> (publisher, pub_seq, new id), as sent last
    next_id = first_id
    last = None
    for row in rows:
        if row.get("client") != client or row["t_mono_us"] < from_t or row.get("packet_id") is None:
            continue
        old = row["packet_id"]
        if row["kind"] == Kind.DELIVERY and (row.get("qos") or 0) > 0:
            held = holder.get(old)
            if held is not None and held[:2] == (row.get("publisher"), row.get("pub_seq")):
                row["packet_id"] = held[2]
                continue
            holder[old] = (row.get("publisher"), row.get("pub_seq"), next_id)
            row["packet_id"] = last = next_id
            next_id = next_packet_id(next_id)
        elif row["kind"] == Kind.DELIVERY_ACK_SENT and old in holder:
            row["packet_id"] = holder[old][2]
    if last is not None:
        for row in rows:
            if row["kind"] == Kind.SESSION_SNAPSHOT and row.get("client") == client:
                row["last_packet_id"] = last
    return rows


def skip_packet_ids(rows: list[Row], client: str, packet_id: int, skip: int = 1) -> list[Row]:
    """From ``client``'s first delivery with ``packet_id`` on, the ids jump ``skip`` values ahead (ids skipped
    as a broker that burns ids, or one that trimmed or expired that many stored messages, shows them)."""
    target = next(r for r in deliveries(rows, client) if r.get("packet_id") == packet_id)
    first = packet_id
    for _ in range(skip):
        first = next_packet_id(first)
    return renumber(rows, client, target["t_mono_us"], first)


def preset_packet_ids(rows: list[Row], client: str, packet_id: int, first_id: int) -> list[Row]:
    """The harness presets ``client``'s stored counter right before its delivery with ``packet_id`` (a
    session_snapshot row with when = "preset", as ``preset_each_offline`` records it); the ids go on from
    ``first_id``."""
    target = next(r for r in deliveries(rows, client) if r.get("packet_id") == packet_id)
    rows = _copy(rows)
    rows.append({"t_mono_us": target["t_mono_us"] - 1, "kind": Kind.SESSION_SNAPSHOT, "client": client,
                 "node": "redis-7001", "zset_size": 0, "last_packet_id": first_id - 1, "orphan_payloads": 0,
                 "dangling_refs": 0, "detail": json.dumps({"when": "preset"})})
    return renumber(sort_rows(rows), client, target["t_mono_us"], first_id)


def add_delivery_in_sequence(rows: list[Row], template: Row, t_mono_us: int, **fields: Any) -> list[Row]:
    """As ``add_delivery`` (acknowledged), but the new delivery takes the next packet id of its subscriber's
    stored sequence and the later ones move up by one: a second copy the broker stored and sent, not an id
    out of nowhere."""
    client = fields.get("client", template["client"])
    before = [r for r in deliveries(rows, client) if r["t_mono_us"] < t_mono_us and r.get("packet_id")]
    first = next_packet_id(before[-1]["packet_id"]) if before else 1
    rows = add_delivery(rows, template, t_mono_us, packet_id=0, **fields)
    return renumber(rows, client, t_mono_us, first)


def reuse_packet_id(rows: list[Row], client: str, publisher: str, seq_held: int, seq_reusing: int) -> list[Row]:
    """``seq_held`` is never acknowledged, yet ``seq_reusing`` is delivered with the same packet id."""
    rows = _copy(rows)
    held = find_delivery(rows, client, publisher, seq_held)
    reusing = find_delivery(rows, client, publisher, seq_reusing)
    held_ack, reusing_ack = _ack_after(rows, held), _ack_after(rows, reusing)
    rows = [r for r in rows if r is not held_ack]
    reusing["packet_id"] = held["packet_id"]
    if reusing_ack is not None:
        reusing_ack["packet_id"] = held["packet_id"]
    return rows


# --- MQTT 5 options and the QoS 2 flow (the delivery rules' plants) ------------------------------------------


def _with_detail(row: Row, **keys: Any) -> None:
    row["detail"] = json.dumps({**json.loads(row.get("detail") or "{}"), **keys})


def set_connect_detail(rows: list[Row], client: str, nth: int, **keys: Any) -> list[Row]:
    """What the ``nth`` connect of ``client`` sent (detail keys: receive_maximum, maximum_packet_size)."""
    rows = _copy(rows)
    _with_detail([r for r in rows if r["kind"] == Kind.CONNECT and r.get("client") == client][nth], **keys)
    return rows


def set_publish(rows: list[Row], publisher: str, pub_seq: int, **fields: Any) -> list[Row]:
    """Fields of a message's publish_invoke row (qos, retain, props, protocol); its qos on its outcome rows too."""
    rows = _copy(rows)
    publish_row(rows, Kind.PUBLISH_INVOKE, publisher, pub_seq).update(fields)
    if "qos" in fields:
        for row in rows:
            if row["kind"] in (Kind.PUBLISH_ACK, Kind.PUBLISH_FAIL, Kind.PUBLISH_INDETERMINATE) and (
                    row.get("publisher"), row.get("pub_seq")) == (publisher, pub_seq):
                row["qos"] = fields["qos"]
    return rows


def set_subscription(rows: list[Row], client: str, nth: int, qos: int | None = None, **options: Any) -> list[Row]:
    """The ``nth`` subscribe_ack of ``client``: its granted QoS and the options of its SUBSCRIBE (sub_id, rap)."""
    rows = _copy(rows)
    row = [r for r in rows if r["kind"] == Kind.SUBSCRIBE_ACK and r.get("client") == client][nth]
    if qos is not None:
        row["qos"] = qos
    _with_detail(row, **options)
    return rows


def subscribe(rows: list[Row], client: str, topic_filter: str, t_mono_us: int, qos: int, **options: Any) -> list[Row]:
    """``client`` subscribes (SUBACK at ``t_mono_us``) to ``topic_filter`` granted ``qos``: a new subscription, or a
    re-subscribe replacing the one of that filter; ``options``: the SUBSCRIBE's (sub_id, rap)."""
    template = next(r for r in rows if r["kind"] == Kind.SUBSCRIBE_ACK and r.get("client") == client)
    row = {**copy.deepcopy(template), "t_mono_us": t_mono_us, "topic": topic_filter, "qos": qos,
           "detail": json.dumps({"requested_qos": qos, "rap": False, "no_local": False, **options})}
    return sort_rows([*_copy(rows), row])


def _qos2_received(rows: list[Row], client: str, publisher: str, pub_seq: int) -> Row:
    for row in rows:
        if row["kind"] == Kind.QOS2_RECEIVED and (row.get("client"), row.get("publisher"), row.get("pub_seq")) == (
                client, publisher, pub_seq):
            return row
    raise LookupError(f"no qos2_received of {publisher}#{pub_seq} by {client} (Spec.qos2_flow)")


def cut_qos2_flow(rows: list[Row], client: str, publisher: str, pub_seq: int) -> list[Row]:
    """The QoS 2 flow of that message stops at the PUBREC: its pubrel_received, delivery and ack rows vanish."""
    rows = _copy(rows)
    received = _qos2_received(rows, client, publisher, pub_seq)
    delivery = find_delivery(rows, client, publisher, pub_seq)
    ack = _ack_after(rows, delivery)
    pubrel = next(r for r in rows if r["kind"] == Kind.PUBREL_RECEIVED and r.get("client") == client
                  and r.get("packet_id") == received["packet_id"] and r["t_mono_us"] >= received["t_mono_us"])
    return [r for r in rows if r is not delivery and r is not ack and r is not pubrel]


def release_qos2(rows: list[Row], client: str, publisher: str, pub_seq: int, t_mono_us: int, **fields: Any) -> list[Row]:
    """The broker sends the PUBREL of that message (its qos2_received's packet id) at ``t_mono_us``: the client
    releases it (a delivery row, with ``fields``: its remaining expiry, say) and answers PUBCOMP."""
    received = _qos2_received(rows, client, publisher, pub_seq)
    common = {"client": client, "node": received.get("node"), "protocol": received.get("protocol"),
              "packet_id": received["packet_id"]}
    release = {**copy.deepcopy(received), "kind": Kind.DELIVERY, "t_mono_us": t_mono_us + 20, **fields}
    return sort_rows([*_copy(rows), {**common, "t_mono_us": t_mono_us, "kind": Kind.PUBREL_RECEIVED,
                                     "detail": json.dumps({"known": True})}, release,
                      {**common, "t_mono_us": t_mono_us + 300, "kind": Kind.DELIVERY_ACK_SENT, "qos": 2}])


def clock_fault(rows: list[Row], fault_id: str, kind: str, node: str, changes: Iterable[tuple[int, float, str]],
                heal_t: int | None = None, **detail: Any) -> list[Row]:
    """A clock fault on ``node`` as the nemesis records it (faults/clock.py): its fault_start at the first change,
    a ``node_event`` (action "clock", offset_s, reason) per change (t_mono_us, offset_s, reason), evidence that it
    bit and, at ``heal_t``, its heal: the fault_heal row and the clock row setting the offset back to 0.
    ``detail``: what the first change's row adds (a drift's rate_ppm)."""
    changes = list(changes)
    start = changes[0][0]
    out = _copy(rows)
    out.append({"t_mono_us": start - 1, "kind": Kind.FAULT_START, "fault_id": fault_id, "fault_kind": kind,
                "node": node, "detail": json.dumps({"node": node})})
    for i, (t, offset_s, reason) in enumerate(changes):
        extra = detail if i == 0 else {}
        out.append({"t_mono_us": t, "kind": Kind.NODE_EVENT, "node": node, "fault_id": fault_id,
                    "detail": json.dumps({"action": "clock", "by": "nemesis", "offset_s": offset_s, "kind": kind,
                                          "reason": reason, **extra})})
    out.append({"t_mono_us": start + 1, "kind": Kind.FAULT_EVIDENCE, "fault_id": fault_id, "fault_kind": kind,
                "node": node, "bit": True, "detail": json.dumps({"stage": "apply", "checks": []})})
    if heal_t is not None:
        out.append({"t_mono_us": heal_t, "kind": Kind.FAULT_HEAL, "fault_id": fault_id, "fault_kind": kind,
                    "node": node})
        out.append({"t_mono_us": heal_t + 1, "kind": Kind.NODE_EVENT, "node": node, "fault_id": fault_id,
                    "detail": json.dumps({"action": "clock", "by": "nemesis", "offset_s": 0.0, "kind": kind,
                                          "reason": "heal"})})
    return sort_rows(out)
