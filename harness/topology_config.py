"""The size and settings of the local topology: the ``[topology]`` table of a scenario TOML.

``TopologyConfig.from_mapping(mapping, source=...)`` validates a plain mapping and says, for every bad
entry, which key, what value, and what is allowed.  Binaries are checked by ``resolve_binaries()``
(called by the local provider's LocalTopology.start() before anything is started)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from contracts import scenario as scenario_model
from contracts.errors import UsageError
from contracts.validation import Section
from harness import binaries

APPENDFSYNC = ("always", "everysec", "no")
KAFKA_STORAGE = ("s3", "s3rver", "moto", "memory", "none")
REDIS_SERVER_NAMES = ("auto", "redis-server", "valkey-server")
# Where the topology runs: "local" (host processes, harness/local/host_topology.py) or "containers" (harness/containers/).
PROVIDERS = ("local", "containers")


class TopologyConfigError(UsageError):
    """A [topology] setting is wrong; the message names the key and what is allowed."""


@dataclass(frozen=True)
class TopologyConfig:
    # Redis Cluster
    redis_masters: int = 3
    redis_replicas_per_master: int = 1
    redis_appendfsync: str = "everysec"
    redis_node_timeout_ms: int = 1000
    redis_server: str = "auto"  # "auto" | "redis-server" | "valkey-server" | a path
    # Kafka-protocol broker (Tansu).  "s3": moto (in memory; honours S3 conditional writes, which Tansu
    # relies on to hand out offsets).  "s3rver": disk-backed, survives a storage kill, but ignores
    # conditional writes, so concurrent producers to one partition lose records (docs/topology.md).
    kafka_storage: str = "s3"
    # reference-broker nodes (python -m reference_broker); 0 = none
    broker_nodes: int = 0
    # seconds the whole start-up may take before it is declared failed
    ready_timeout_s: float = 60.0
    # "local" (host processes) or "containers" (the same parts as containers; `ordeal run --provider`)
    provider: str = "local"

    def __post_init__(self) -> None:
        _cross_check(self, lambda key, value, expected: TopologyConfigError(
            f"TopologyConfig: {key} = {value!r}: {expected}"))

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, source: str = "<topology>") -> TopologyConfig:
        """The [topology] table of ``source`` (a file name), read through the one validation vocabulary
        (contracts/validation.py): every error names the file, the key, the value and what is allowed."""
        s = _TopologyTable(source, "topology", dict(mapping or {}))
        d = cls()
        values: dict[str, Any] = {
            "redis_masters": s.integer("redis_masters", d.redis_masters),
            "redis_replicas_per_master": s.integer("redis_replicas_per_master", d.redis_replicas_per_master,
                                                   minimum=0),
            "redis_appendfsync": s.string("redis_appendfsync", d.redis_appendfsync, choices=APPENDFSYNC),
            "redis_node_timeout_ms": s.integer("redis_node_timeout_ms", d.redis_node_timeout_ms, minimum=100),
            "redis_server": s.string("redis_server", d.redis_server, non_empty=True),
            "kafka_storage": s.string("kafka_storage", d.kafka_storage, choices=KAFKA_STORAGE),
            "broker_nodes": s.integer("broker_nodes", d.broker_nodes, minimum=0),
            "ready_timeout_s": s.number("ready_timeout_s", d.ready_timeout_s, minimum=1),
            "provider": s.string("provider", d.provider, choices=PROVIDERS),
        }
        s.finish()
        if values["redis_masters"] < 3:
            raise s.fail("redis_masters", values["redis_masters"],
                         "must be >= 3 (a Redis Cluster needs at least 3 masters to elect a new master)")
        _cross_check(SimpleNamespace(**values), s.fail)
        return cls(**values)

    @property
    def redis_nodes(self) -> int:
        return self.redis_masters * (1 + self.redis_replicas_per_master)

    def resolve_binaries(self) -> dict[str, Path]:
        """Every binary this configuration needs; raises MissingBinaryError naming the key and binary."""
        if self.provider == "containers":
            return {}  # the containers provider runs images (`ordeal images build`), not host binaries
        found: dict[str, Path] = {"redis": binaries.redis_server(self.redis_server)}
        if self.kafka_storage != "none":
            found["tansu"] = binaries.tansu()
        storage = self.storage_kind()
        if storage == "s3rver":
            found["s3rver"] = binaries.require_s3rver()
        elif storage == "moto":
            found["moto"] = binaries.moto_server()
        return found

    def destructive_kill_loses_log(self, role: str) -> str:
        """Why a kill / stop / restart of the node with this role ('kafka' or 'storage') would lose the whole
        Kafka log here, or '' when it loses nothing acknowledged.  Such a fault tests nothing about the
        broker under test: the Kafka stand-in forgets what it acknowledged."""
        if role == "storage" and self.storage_kind() == "moto":
            return (f"kafka_storage = {self.kafka_storage!r} keeps the Kafka log in moto_server's memory: killing "
                    "the storage node loses the whole log.  Set [topology] kafka_storage = \"s3rver\" (disk-backed, "
                    "survives a kill; one broker node only) to kill the storage server")
        if role == "kafka" and self.kafka_storage == "memory":
            return ("kafka_storage = 'memory' keeps the Kafka log in Tansu's memory: killing the Kafka broker "
                    "loses the whole log.  Use kafka_storage = \"s3\" (the default; Tansu restarts on its bucket)")
        return ""

    def storage_kind(self) -> str:
        """The S3 server actually used: 's3rver', 'moto', or '' (no S3 server)."""
        if self.kafka_storage == "s3":
            return "moto"
        return self.kafka_storage if self.kafka_storage in ("s3rver", "moto") else ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _cross_check(config: Any, fail: Callable[[str, Any, str], Exception]) -> None:
    """The rules between keys, for a table read from a file and for a config built in code alike."""
    if config.kafka_storage == "s3rver" and config.broker_nodes > 1:
        raise fail("kafka_storage", "s3rver",
                   f"with broker_nodes = {config.broker_nodes}: s3rver ignores S3 conditional writes, so two "
                   "broker nodes producing to one partition at once get the same offset and acknowledged "
                   "records are overwritten (docs/topology.md \"Kafka: Tansu on S3\").  Use "
                   "kafka_storage = 's3' (moto) with several broker nodes, or broker_nodes = 1 with s3rver.")
    if config.provider == "containers" and config.kafka_storage == "s3rver":
        raise fail("kafka_storage", "s3rver",
                   "with provider = 'containers': there is no s3rver image; use kafka_storage = 's3' "
                   "(moto) or 'memory', or provider = 'local'")
    if config.redis_server not in REDIS_SERVER_NAMES and not Path(config.redis_server).is_absolute():
        raise fail("redis_server", config.redis_server,
                   f"use one of {', '.join(map(repr, REDIS_SERVER_NAMES))} or an absolute path to an executable")


class _TopologyTable(Section):
    """The [topology] table: its errors are TopologyConfigErrors."""

    error = TopologyConfigError


# The scenario model (contracts/scenario.py) imports no stage: the [topology] table is registered into it here.
scenario_model.register_topology_model(scenario_model.TopologyModel(
    normalise=lambda mapping, source: TopologyConfig.from_mapping(mapping, source=source).to_dict(),
    kill_loses_log=lambda mapping, role: TopologyConfig.from_mapping(mapping).destructive_kill_loses_log(role),
))
