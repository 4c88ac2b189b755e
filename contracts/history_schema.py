"""The history's schema: the one contract between the run stage and the checkers.

A history is a directory of Parquet part files (``events-00000.parquet``, ...) plus ``manifest.json``.
Every observation is one row of a single wide ``events`` table; ``kind`` says which columns are filled.
One table keeps the checkers at one scan per stream instead of many joins.  See docs/history.md for the
meaning of each kind and column; this module is the machine-readable half of that document.

Bump ``SCHEMA_VERSION`` on any incompatible change; checkers refuse (verdict unknown) versions they do
not know.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 2
# Versions a checker reads.  Version 2 added the columns of V2_COLUMNS and the kinds qos2_received and
# pubrel_received; a version 1 history reads with those columns null (nothing of them was recorded).
READABLE_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"
PART_GLOB = "events-*.parquet"
PARQUET_META_KEY = b"ordeal.history.schema_version"


class Kind:
    """The values of the ``kind`` column.  Plain strings so Parquet readers need nothing of ours."""

    # Publisher side.  One invoke per publish; then exactly one outcome row (ack, fail or indeterminate).
    PUBLISH_INVOKE = "publish_invoke"
    PUBLISH_ACK = "publish_ack"  # PUBACK / PUBCOMP received (reason_code < 0x80 on MQTT 5)
    PUBLISH_FAIL = "publish_fail"  # definite failure: error reason code, or never sent on the wire
    PUBLISH_INDETERMINATE = "publish_indeterminate"  # sent, outcome unknown (timeout, connection lost)
    # Client session lifecycle.
    CONNECT = "connect"  # CONNACK received: session_present, reason_code, clean_start, session_expiry_s
    CONNECT_FAIL = "connect_fail"  # connection attempt failed (refused, timeout)
    DISCONNECT = "disconnect"  # initiator: client | server | harness ; abrupt: socket closed, no DISCONNECT
    SUBSCRIBE_ACK = "subscribe_ack"  # SUBACK: topic = filter, qos = granted QoS; refused: reason_code >= 0x80
    UNSUBSCRIBE_ACK = "unsubscribe_ack"
    # Subscriber side.
    DELIVERY = "delivery"  # a PUBLISH received by a subscriber, identity decoded from the payload
    DELIVERY_ACK_SENT = "delivery_ack_sent"  # PUBACK (QoS 1) / PUBCOMP (QoS 2) sent by the subscriber
    # The QoS 2 flow on the subscriber side.  paho hands a QoS 2 message to the application (a DELIVERY row)
    # only at its PUBREL; these two rows show the steps before: the PUBLISH arrived and was answered with
    # PUBREC (identity, packet_id, dup as on a DELIVERY row), and a PUBREL arrived for packet_id
    # (detail.known: whether the client held a message for that packet id).
    QOS2_RECEIVED = "qos2_received"
    PUBREL_RECEIVED = "pubrel_received"
    # The system and the nemesis.
    NODE_EVENT = "node_event"  # detail: {"action": start|stop|kill|pause|resume|restart|ready, ...}
    FAULT_START = "fault_start"
    FAULT_HEAL = "fault_heal"
    FAULT_EVIDENCE = "fault_evidence"  # detail: what proves the fault bit; bit = True/False
    FAULT_ERROR = "fault_error"  # the fault could not be applied; makes the run unknown
    # White box (reference broker only), taken after the drain.
    SESSION_SNAPSHOT = "session_snapshot"
    # Run phases: detail {"phase": ...}; see docs/history.md.
    PHASE = "phase"

    ALL = (
        PUBLISH_INVOKE, PUBLISH_ACK, PUBLISH_FAIL, PUBLISH_INDETERMINATE, CONNECT, CONNECT_FAIL, DISCONNECT,
        SUBSCRIBE_ACK, UNSUBSCRIBE_ACK, DELIVERY, DELIVERY_ACK_SENT, QOS2_RECEIVED, PUBREL_RECEIVED, NODE_EVENT, FAULT_START, FAULT_HEAL,
        FAULT_EVIDENCE, FAULT_ERROR, SESSION_SNAPSHOT, PHASE,
    )


class Phase:
    """Values of detail.phase on PHASE rows, in the order a run passes them."""

    RUN_START = "run_start"
    WORKLOAD_START = "workload_start"
    WORKLOAD_END = "workload_end"
    HEAL_ALL = "heal_all"  # every fault healed, every node restarted
    DRAIN_START = "drain_start"
    DRAIN_END = "drain_end"  # detail.reason: "quiet" (nothing new for quiet_s) or "timeout"
    SNAPSHOT_DONE = "snapshot_done"
    RUN_END = "run_end"


EVENT_SCHEMA = pa.schema(
    [
        # Order and time.  seq is the recorder's global order (strictly increasing within a run).
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("t_mono_us", pa.int64(), nullable=False),  # monotonic clock, µs since run start
        pa.field("t_wall_us", pa.int64(), nullable=False),  # wall clock, µs since the Unix epoch (UTC)
        pa.field("kind", pa.string(), nullable=False),
        # Who.  client = the MQTT client id that observed it; node = the broker node (or system node).
        pa.field("client", pa.string()),
        pa.field("node", pa.string()),
        pa.field("protocol", pa.int8()),  # 4 = MQTT 3.1.1, 5 = MQTT 5.0
        # The message.
        pa.field("topic", pa.string()),
        pa.field("qos", pa.int8()),
        pa.field("packet_id", pa.int32()),
        pa.field("dup", pa.bool_()),
        pa.field("retain", pa.bool_()),
        pa.field("payload_size", pa.int32()),
        pa.field("expiry_s", pa.int64()),  # publish: requested message expiry interval (null = none)
        pa.field("remaining_expiry_s", pa.int64()),  # delivery: MQTT 5 message expiry interval received
        # Identity decoded from the payload (see contracts/payload.py); null when undecodable.
        pa.field("publisher", pa.string()),  # the publishing client's id
        pa.field("pub_seq", pa.int64()),  # per-publisher sequence number, from 1
        pa.field("send_wall_us", pa.int64()),  # when the publisher built the payload
        pa.field("body_hash", pa.string()),  # blake2b-64 hex of the whole payload as sent / as received
        # Connection facts.
        pa.field("reason_code", pa.int32()),
        pa.field("session_present", pa.bool_()),
        pa.field("clean_start", pa.bool_()),
        pa.field("session_expiry_s", pa.int64()),
        pa.field("initiator", pa.string()),  # disconnect: client | server | harness
        pa.field("abrupt", pa.bool_()),  # disconnect: socket closed without DISCONNECT
        # Faults.
        pa.field("fault_id", pa.string()),
        pa.field("fault_kind", pa.string()),
        pa.field("bit", pa.bool_()),  # fault_evidence: did it take effect
        # White box (session_snapshot).
        pa.field("zset_size", pa.int64()),
        pa.field("last_packet_id", pa.int64()),
        pa.field("orphan_payloads", pa.int64()),  # payload keys with no ZSET member
        pa.field("dangling_refs", pa.int64()),  # ZSET members whose payload key is gone
        # MQTT 5 properties a broker forwards (schema version 2).  props: the properties a broker must forward
        # unchanged (payload format indicator, content type, correlation data, response topic, user
        # properties) as canonical JSON (contracts/mqtt_properties.py), on publish_invoke as sent and on
        # delivery as received; null on MQTT 3.1.1 and when none was sent / received.  sub_ids: a delivery's
        # subscription identifiers, comma-separated in the order received (null: none).  packet_size: the
        # whole PUBLISH packet as received (delivery, qos2_received) or as sent (publish_invoke), in bytes,
        # fixed header included.
        pa.field("props", pa.string()),
        pa.field("sub_ids", pa.string()),
        pa.field("packet_size", pa.int32()),
        # Anything else, as a JSON object (fault parameters, evidence, snapshot members, phase details).
        pa.field("detail", pa.string()),
    ],
    metadata={PARQUET_META_KEY: str(SCHEMA_VERSION).encode()},
)

COLUMNS = tuple(EVENT_SCHEMA.names)

# Will messages ([workload] wills; docs/history.md "Will messages").  No column of their own: a connect row whose
# CONNECT carried a Will has ``detail.will`` = {topic, qos, delay_s (null: none sent), payload}; the Will of a
# client is published on its own topic under WILL_TOPIC_PREFIX, with a payload naming that connection
# (``will_payload``), and the watcher (WILL_WATCHER, subscribed to WILL_FILTER) records each arrival as a
# delivery row with ``detail.will`` = the payload.  Such deliveries carry no payload identity: the checkers read
# them as Wills, never as published messages.
WILL_TOPIC_PREFIX = "ordeal/will/"
WILL_FILTER = WILL_TOPIC_PREFIX + "+"
WILL_WATCHER = "test_will_watcher_0"


# Retained messages ([workload] retained): the retained publishes go to a few topics under RETAINED_TOPIC_PREFIX
# with RETAIN 1 (publish_invoke ``retain``), and late subscribers subscribe to RETAINED_FILTER after them; the
# broker's retained copy reaches them as a delivery row with ``retain`` = true.
RETAINED_TOPIC_PREFIX = "ordeal/retained/"
RETAINED_FILTER = RETAINED_TOPIC_PREFIX + "+"


def retained_topic(index: int) -> str:
    return f"{RETAINED_TOPIC_PREFIX}{index}"


def will_topic(client_id: str) -> str:
    return WILL_TOPIC_PREFIX + client_id


def will_payload(client_id: str, connection: int) -> str:
    """The Will payload of ``client_id``'s ``connection``-th CONNECT (from 1): which connection's Will arrived."""
    return f"ordeal-will {client_id} {connection}"
V2_COLUMNS = ("props", "sub_ids", "packet_size")  # absent from a version 1 history (read as null)
REQUIRED_COLUMNS = ("seq", "t_mono_us", "t_wall_us", "kind")


# -- The manifest: one type, one writer (harness/history.py, spark_checkers/synthetic.py, benchmarks) -------


def part_name(index: int) -> str:
    return f"events-{index:05d}.parquet"


@dataclass(frozen=True)
class PartInfo:
    file: str
    rows: int
    first_seq: int
    last_seq: int


@dataclass(frozen=True)
class Manifest:
    """history/manifest.json (docs/history.md, docs/schemas/manifest.schema.json).  ``complete`` is true only
    after the run_end phase row was recorded and the writer closed; ``meta`` holds extra keys (scenario, seed)."""

    run_id: str
    complete: bool
    parts: tuple[PartInfo, ...] = ()
    incomplete_reason: str = ""
    end_reason: str = ""
    started_wall_us: int = 0
    updated_wall_us: int = 0
    counts_recorded: Mapping[str, int] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.meta,
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "complete": self.complete,
            "incomplete_reason": self.incomplete_reason,
            "end_reason": self.end_reason,
            "started_wall_us": self.started_wall_us,
            "updated_wall_us": self.updated_wall_us,
            "rows": self.rows,
            "parts": [p.file for p in self.parts],  # part file names, in seq order
            "part_details": [asdict(p) for p in self.parts],
            "counts_recorded": dict(sorted(self.counts_recorded.items())),
        }


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write (atomically: a temporary file renamed over the old one) ``directory``/manifest.json."""
    directory = Path(directory)
    temporary = directory / f".{MANIFEST_NAME}.tmp"
    temporary.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(temporary, directory / MANIFEST_NAME)
    return directory / MANIFEST_NAME


def write_part(directory: str | Path, index: int, table: pa.Table, *, compression: str = "zstd") -> PartInfo:
    """Write one part file (atomically) from a table whose rows carry ``seq``; returns its manifest entry."""
    import pyarrow.parquet as pq

    directory = Path(directory)
    name = part_name(index)
    temporary = directory / f".{name}.tmp"
    pq.write_table(table, temporary, compression=compression)
    os.replace(temporary, directory / name)
    seqs = table.column("seq")
    return PartInfo(name, table.num_rows, int(seqs[0].as_py()) if table.num_rows else 0,
                    int(seqs[-1].as_py()) if table.num_rows else 0)


# -- The node logs: a second table of the history (docs/history.md "Node logs") -------------------------------
# After the target stopped, the harness copies every line of every node's log (logs/<node>.log) into
# history/logs.parquet; the checkers judge them against the scenario's declared patterns (the log oracle,
# logs.error_lines / logs.reported_lines).  Which nodes there were and whether each log could be read is in
# the file's metadata (LOG_SOURCES_META_KEY, a JSON list), so a node whose log was unreadable is named.
LOG_TABLE_NAME = "logs.parquet"
LOG_SOURCES_META_KEY = b"ordeal.logs.sources"
LOG_SCHEMA = pa.schema(
    [
        pa.field("node", pa.string(), nullable=False),  # the node's name (broker-1, redis-3, kafka, mosquitto)
        pa.field("role", pa.string()),  # its role (broker, redis, kafka, storage, mqtt-broker)
        pa.field("line_no", pa.int64(), nullable=False),  # 1-based, in the node's log file
        pa.field("t_wall_us", pa.int64()),  # the line's own timestamp, parsed (null: the line carries none)
        pa.field("t_mono_us", pa.int64()),  # the same on the events' clock (t_wall_us - the recorder's start)
        pa.field("line", pa.string(), nullable=False),  # the line, without its newline (invalid UTF-8 replaced)
    ],
    metadata={PARQUET_META_KEY: str(SCHEMA_VERSION).encode()},
)
LOG_COLUMNS = tuple(LOG_SCHEMA.names)


@dataclass(frozen=True)
class LogSource:
    """One node's log as the harness found it.  ``error``: why it could not be read (then no lines of it are
    in the table); ``truncated``: only the first ``lines`` were kept (the rest is not judged)."""

    node: str
    role: str
    file: str  # relative to the run directory (logs/<node>.log)
    lines: int = 0
    bytes: int = 0
    error: str = ""
    truncated: bool = False


def write_log_table(history_dir: str | Path, table: pa.Table, sources: list[LogSource]) -> Path:
    """Write history/logs.parquet (atomically) with ``sources`` in its metadata."""
    import pyarrow.parquet as pq

    history_dir = Path(history_dir)
    meta = dict(LOG_SCHEMA.metadata)
    meta[LOG_SOURCES_META_KEY] = json.dumps([asdict(s) for s in sources]).encode()
    table = table.cast(LOG_SCHEMA).replace_schema_metadata(meta)
    temporary = history_dir / f".{LOG_TABLE_NAME}.tmp"
    pq.write_table(table, temporary, compression="zstd")
    os.replace(temporary, history_dir / LOG_TABLE_NAME)
    return history_dir / LOG_TABLE_NAME


def read_log_table(history_dir: str | Path) -> tuple[pa.Table, list[LogSource]]:
    """(lines, sources) of history/logs.parquet.  FileNotFoundError when the run recorded none; ValueError
    naming the file when it is not a log table of this schema version."""
    import pyarrow.parquet as pq

    path = Path(history_dir) / LOG_TABLE_NAME
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise
    except Exception as error:  # ArrowInvalid / OSError: truncated or not Parquet
        raise ValueError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from None
    meta = table.schema.metadata or {}
    version = meta.get(PARQUET_META_KEY)
    if version != str(SCHEMA_VERSION).encode():
        raise ValueError(f"{path}: Parquet metadata {PARQUET_META_KEY.decode()}={version!r}, expected {SCHEMA_VERSION}")
    missing = [c for c in LOG_COLUMNS if c not in table.schema.names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing} (contracts/history_schema.py LOG_SCHEMA)")
    try:
        sources = [LogSource(**s) for s in json.loads(meta[LOG_SOURCES_META_KEY])]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: metadata {LOG_SOURCES_META_KEY.decode()} missing or not a list of "
                         f"sources ({type(error).__name__}: {error})") from None
    return table.select(list(LOG_COLUMNS)), sources
