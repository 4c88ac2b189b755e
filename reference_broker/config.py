"""The reference broker's configuration: one frozen dataclass, validated on construction.

``BrokerConfig.from_mapping(mapping, source="scenario.toml [broker]")`` is the only way in from files;
every error names the source, the key, the value given and what is allowed, so the user knows what to
change.  ``NodeConfig`` adds what one running node needs besides (Redis startup nodes, Kafka bootstrap).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from reference_broker.app_clients import ACK_STRATEGIES, AppClientRule, parse_rules
from reference_broker.defects import CATALOG, require_known

MAX_PERSISTED_LIMIT = 65535  # a larger limit would let packet ids collide with still-stored messages

PRODUCER_ACKS = ("0", "1", "all")
FAILURE_STRATEGIES = ("retry_forever", "skip")
EVENT_LOOPS = ("uvloop", "asyncio")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message says what to change."""


@dataclass(frozen=True)
class BrokerConfig:
    # Redis persistence of DEVICE sessions
    persisted_messages_limit: int = 10000
    persisted_message_ttl_s: int = 604800
    key_prefix: str = ""
    redis_wait_replicas: int = 0          # WAIT <n> after each save; 0 = do not wait
    redis_wait_timeout_ms: int = 1000
    redis_batch_size: int = 500           # save scripts in flight at once per poll
    # Kafka
    producer_acks: str = "1"              # TBMQ default
    # 50 ms: on Tansu over S3 each produce request writes an object per partition; a longer linger sends
    # fewer S3 requests per message at no measurable end-to-end cost (docs/measurements.md, "S3 requests")
    producer_linger_ms: int = 50
    # Bytes of one partition's batch in a produce request (aiokafka max_batch_size; its default is 16 KiB).
    # aiokafka keeps one produce request in flight per broker and puts at most one batch per partition in
    # it, so a partition with more pending than this needs another round trip; on Tansu over S3 every
    # batch is an object (PUT + watermark PUT, then a GET and a LIST share per fetch).
    producer_max_batch_bytes: int = 1048576
    incoming_topic: str = "tbmq.msg.all"
    incoming_partitions: int = 16
    persisted_topic: str = "tbmq.msg.persisted"
    persisted_partitions: int = 12
    poll_max_records: int = 500
    # How long Tansu may hold a fetch.  Tansu gives up on a fetch at this deadline even when its S3 read is
    # still under way, so a wait shorter than one S3 round trip starves the consumer (a loaded S3 stand-in
    # then delivers next to nothing); Tansu also holds a fetch for the full wait when records arrive meanwhile.
    kafka_fetch_max_wait_ms: int = 250
    # What a consumer does when processing a poll fails (TBMQ defaults: incoming skips at once,
    # persisted retries 3 times 1 s apart, then both commit anyway).
    incoming_failure_strategy: str = "skip"
    incoming_failure_retries: int = 0
    incoming_failure_backoff_s: float = 1.0
    persisted_failure_strategy: str = "skip"
    persisted_failure_retries: int = 3
    persisted_failure_backoff_s: float = 1.0
    processing_timeout_s: float = 20.0
    # Sessions and delivery
    max_inflight: int = 1000
    # Limits the server declares in CONNACK and enforces (docs/reference-broker.md, "Limits under abuse")
    receive_maximum: int = 100            # QoS 1/2 PUBLISHes a client may have unacknowledged (0x93 beyond)
    max_packet_size: int = 1048576        # bytes, whole packet; larger -> DISCONNECT / CONNACK 0x95
    max_topic_length: int = 1024          # bytes of a topic name or filter; longer -> 0x90 / SUBACK 0x8F
    # Back-pressure: a connection's socket is not read while this many of its publishes wait for Kafka, so one
    # client cannot queue a flood in the shared producer ahead of everyone else's messages
    max_pending_publishes: int = 32
    session_expiry_check_s: float = 1.0
    delivery_recheck_s: float = 1.0       # a lost live hint is recovered within this time
    partition_lease_s: float = 5.0        # a dead node's partitions move to the others after this
    # uvloop (libuv) or the standard library's loop; uvloop costs less CPU per socket event
    # (benchmarks/broker_p2p.py, docs/measurements.md)
    event_loop: str = "uvloop"
    # APPLICATION clients (docs/reference-broker.md "APPLICATION clients"): which clients are APPLICATION (rules
    # of client-id glob and / or user name; none = every client is a DEVICE), and their per-client topic's
    # consumer (TBMQ defaults: RETRY_ALL with 3 retries, 20 s pack timeout, 200 records a poll)
    application_clients: tuple[AppClientRule, ...] = field(default_factory=tuple)
    application_ack_strategy: str = "retry"
    application_retries: int = 3          # retries of a pack before giving up; 0 = forever
    application_pack_timeout_s: float = 20.0
    application_poll_max_records: int = 200
    # Named defects from reference_broker/defects.py; empty = correct broker
    defects: tuple[str, ...] = field(default_factory=tuple)
    source: str = field(default="<defaults>", compare=False)

    def __post_init__(self) -> None:
        src = self.source
        _int_range(src, "persisted_messages_limit", self.persisted_messages_limit, 1, MAX_PERSISTED_LIMIT,
                   why="a larger limit would let packet ids (1..65535) collide with stored messages")
        _int_range(src, "persisted_message_ttl_s", self.persisted_message_ttl_s, 1, 2**31 - 1)
        if not isinstance(self.key_prefix, str):
            raise ConfigError(f"{src}: key_prefix = {self.key_prefix!r}: expected a string")
        _int_range(src, "redis_wait_replicas", self.redis_wait_replicas, 0, 16)
        _int_range(src, "redis_wait_timeout_ms", self.redis_wait_timeout_ms, 1, 600000)
        _int_range(src, "redis_batch_size", self.redis_batch_size, 1, 100000)
        _choice(src, "producer_acks", self.producer_acks, PRODUCER_ACKS)
        _int_range(src, "producer_linger_ms", self.producer_linger_ms, 0, 10000)
        _int_range(src, "producer_max_batch_bytes", self.producer_max_batch_bytes, 1024, 16777216)
        for key in ("incoming_topic", "persisted_topic"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{src}: {key} = {value!r}: expected a non-empty topic name")
        if self.incoming_topic == self.persisted_topic:
            raise ConfigError(f"{src}: incoming_topic and persisted_topic must differ "
                              f"(both are {self.incoming_topic!r})")
        _int_range(src, "incoming_partitions", self.incoming_partitions, 1, 1000)
        _int_range(src, "persisted_partitions", self.persisted_partitions, 1, 1000)
        _int_range(src, "poll_max_records", self.poll_max_records, 1, 100000)
        _int_range(src, "kafka_fetch_max_wait_ms", self.kafka_fetch_max_wait_ms, 1, 60000)
        for stage in ("incoming", "persisted"):
            _choice(src, f"{stage}_failure_strategy", getattr(self, f"{stage}_failure_strategy"),
                    FAILURE_STRATEGIES)
            _int_range(src, f"{stage}_failure_retries", getattr(self, f"{stage}_failure_retries"), 0, 1000000)
            _positive(src, f"{stage}_failure_backoff_s", getattr(self, f"{stage}_failure_backoff_s"), zero_ok=True)
        _positive(src, "processing_timeout_s", self.processing_timeout_s)
        _int_range(src, "max_inflight", self.max_inflight, 1, 65535)
        _int_range(src, "receive_maximum", self.receive_maximum, 1, 65535)
        _int_range(src, "max_packet_size", self.max_packet_size, 64, 268435460)
        _int_range(src, "max_topic_length", self.max_topic_length, 1, 65535)
        _int_range(src, "max_pending_publishes", self.max_pending_publishes, 1, 65535)
        _positive(src, "session_expiry_check_s", self.session_expiry_check_s)
        _positive(src, "delivery_recheck_s", self.delivery_recheck_s)
        _positive(src, "partition_lease_s", self.partition_lease_s)
        _choice(src, "event_loop", self.event_loop, EVENT_LOOPS)
        try:
            object.__setattr__(self, "application_clients", parse_rules(src, self.application_clients))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        _choice(src, "application_ack_strategy", self.application_ack_strategy, ACK_STRATEGIES)
        _int_range(src, "application_retries", self.application_retries, 0, 1000000, why="0 = retry forever")
        _positive(src, "application_pack_timeout_s", self.application_pack_timeout_s)
        _int_range(src, "application_poll_max_records", self.application_poll_max_records, 1, 65535,
                   why="a pack's packet ids come from its offsets and must not repeat within it")
        if isinstance(self.defects, (str, bytes)) or not all(isinstance(d, str) for d in self.defects):
            raise ConfigError(f"{src}: defects = {self.defects!r}: expected a list of defect names")
        object.__setattr__(self, "defects", tuple(self.defects))
        unknown = [name for name in self.defects if name not in CATALOG]
        if unknown:
            raise ConfigError(f"{src}: defects: unknown {', '.join(map(repr, unknown))}; "
                              f"known defects: {', '.join(sorted(CATALOG))}")

    def has(self, defect: str) -> bool:
        """Whether the named defect is switched on.  The name must be in the catalog: a misspelt switch in the
        broker's code would otherwise silently never turn on (the defect then goes uncaught by design)."""
        if defect not in CATALOG:
            require_known((defect,), "BrokerConfig.has")  # raises, naming every valid defect
        return defect in self.defects

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], source: str = "<mapping>") -> BrokerConfig:
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"{source}: expected a table of broker settings, got {type(mapping).__name__}")
        known = {f.name: f for f in fields(cls) if f.name != "source"}
        unknown = sorted(set(mapping) - set(known))
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; "
                              f"allowed keys: {', '.join(sorted(known))}")
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            default = getattr(cls, key, None) if key not in ("defects", "application_clients") else ()
            values[key] = _coerce(source, key, value, default)
        return cls(**values, source=source)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("source")
        data["defects"] = list(self.defects)
        data["application_clients"] = [{k: v for k, v in rule.items() if v is not None}
                                       for rule in data["application_clients"]]
        return data


@dataclass(frozen=True)
class NodeConfig:
    """Everything one broker node reads from its ``--config`` JSON file."""

    broker: BrokerConfig
    redis_startup_nodes: tuple[tuple[str, int], ...]
    kafka_bootstrap: str

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], source: str = "<mapping>") -> NodeConfig:
        allowed = {"broker", "redis_startup_nodes", "kafka_bootstrap", "redis", "kafka"}
        unknown = sorted(set(mapping) - allowed)
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; allowed keys: "
                              "broker (table), redis_startup_nodes (list of 'host:port'), "
                              "kafka_bootstrap ('host:port')")
        startup = mapping.get("redis_startup_nodes")
        if startup is None and isinstance(mapping.get("redis"), Mapping):
            startup = mapping["redis"].get("startup_nodes")
        bootstrap = mapping.get("kafka_bootstrap")
        if bootstrap is None and isinstance(mapping.get("kafka"), Mapping):
            bootstrap = mapping["kafka"].get("bootstrap")
        if not startup:
            raise ConfigError(f"{source}: redis_startup_nodes is missing: expected a list of 'host:port'")
        nodes = tuple(_host_port(source, "redis_startup_nodes", item) for item in startup)
        if not isinstance(bootstrap, str) or not bootstrap:
            raise ConfigError(f"{source}: kafka_bootstrap = {bootstrap!r}: expected 'host:port'")
        _host_port(source, "kafka_bootstrap", bootstrap)
        broker = BrokerConfig.from_mapping(mapping.get("broker", {}), source=f"{source} [broker]")
        return cls(broker=broker, redis_startup_nodes=nodes, kafka_bootstrap=bootstrap)

    @classmethod
    def load(cls, path: str | Path) -> NodeConfig:
        return cls.from_mapping(read_node_config_file(path), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return {"broker": self.broker.to_dict(),
                "redis_startup_nodes": [f"{h}:{p}" for h, p in self.redis_startup_nodes],
                "kafka_bootstrap": self.kafka_bootstrap}


def _host_port(source: str, key: str, item: Any) -> tuple[str, int]:
    if isinstance(item, str) and ":" in item:
        host, _, port = item.rpartition(":")
    elif isinstance(item, (list, tuple)) and len(item) == 2:
        host, port = item
    else:
        raise ConfigError(f"{source}: {key}: {item!r} is not 'host:port'")
    try:
        port_number = int(port)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {key}: {item!r}: port must be an integer") from None
    if not 0 < port_number < 65536:
        raise ConfigError(f"{source}: {key}: {item!r}: port must be 1..65535")
    return str(host), port_number


def _coerce(source: str, key: str, value: Any, default: Any) -> Any:
    if key == "defects":
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: defects = {value!r}: expected a list of defect names")
        return tuple(value)
    if key == "application_clients":
        try:
            return parse_rules(source, value)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    if key == "producer_acks" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # TOML/JSON users write acks = 1
    if isinstance(default, bool) or isinstance(value, bool):
        raise ConfigError(f"{source}: {key} = {value!r}: booleans are not accepted here")
    if isinstance(default, int):
        if not isinstance(value, int):
            raise ConfigError(f"{source}: {key} = {value!r}: expected an integer")
    elif isinstance(default, float):
        if not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {key} = {value!r}: expected a number")
        return float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} = {value!r}: expected a string")
    return value


def _int_range(source: str, key: str, value: Any, low: int, high: int, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        extra = f" ({why})" if why else ""
        raise ConfigError(f"{source}: {key} = {value!r}: expected an integer in {low}..{high}{extra}")


def _positive(source: str, key: str, value: Any, zero_ok: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value >= 0 if zero_ok else value > 0)
    if not ok:
        raise ConfigError(f"{source}: {key} = {value!r}: expected a number {'>= 0' if zero_ok else '> 0'}")


def _choice(source: str, key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{source}: {key} = {value!r}: expected one of {', '.join(map(repr, allowed))}")


def read_node_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a node config JSON file (callers may override endpoints before validating)."""
    path = Path(path)
    try:
        mapping = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(mapping, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    return mapping
