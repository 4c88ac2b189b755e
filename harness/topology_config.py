"""The size and settings of the local topology: the ``[topology]`` table of a scenario TOML.

``TopologyConfig.from_mapping(mapping, source=...)`` validates a plain mapping and says, for every bad
entry, which key, what value, and what is allowed.  Binaries are checked by ``resolve_binaries()``
(called by LocalTopology.start() before anything is started)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts import scenario as scenario_model
from harness import binaries

APPENDFSYNC = ("always", "everysec", "no")
KAFKA_STORAGE = ("s3", "s3rver", "moto", "memory", "none")
REDIS_SERVER_NAMES = ("auto", "redis-server", "valkey-server")


class TopologyConfigError(ValueError):
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

    MINIMUMS = {"redis_masters": 3, "redis_replicas_per_master": 0, "redis_node_timeout_ms": 100,
                "broker_nodes": 0, "ready_timeout_s": 1}
    WHY = {"redis_masters": "a Redis Cluster needs at least 3 masters to elect a new master",
           "redis_replicas_per_master": "", "redis_node_timeout_ms": "", "broker_nodes": "",
           "ready_timeout_s": ""}

    def __post_init__(self) -> None:
        self._validate("TopologyConfig")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, source: str = "[topology]") -> TopologyConfig:
        mapping = dict(mapping or {})
        allowed = cls.keys()
        unknown = sorted(k for k in mapping if k not in allowed)
        if unknown:
            raise TopologyConfigError(
                f"{source}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"allowed keys: {', '.join(allowed)}")
        defaults = cls()
        for key, value in mapping.items():
            expected = type(getattr(defaults, key))
            _check_type(source, key, value, expected)
        values = {k: (float(v) if isinstance(getattr(defaults, k), float) else v) for k, v in mapping.items()}
        try:
            config = dataclasses.replace(defaults, **values)
        except TopologyConfigError as error:
            raise TopologyConfigError(str(error).replace("TopologyConfig", source, 1)) from None
        return config

    def _validate(self, source: str) -> None:
        for key, minimum in self.MINIMUMS.items():
            value = getattr(self, key)
            _check_type(source, key, value, type(getattr(TopologyConfig, key)))
            if value < minimum:
                why = f" ({self.WHY[key]})" if self.WHY[key] else ""
                raise TopologyConfigError(f"{source}: {key} = {value!r} is below the minimum {minimum}{why}")
        for key, allowed in (("redis_appendfsync", APPENDFSYNC), ("kafka_storage", KAFKA_STORAGE)):
            value = getattr(self, key)
            if value not in allowed:
                raise TopologyConfigError(
                    f"{source}: {key} = {value!r} is not allowed; use one of {', '.join(map(repr, allowed))}")
        if self.kafka_storage == "s3rver" and self.broker_nodes > 1:
            raise TopologyConfigError(
                f"{source}: kafka_storage = 's3rver' with broker_nodes = {self.broker_nodes}: s3rver ignores S3 "
                "conditional writes, so two broker nodes producing to one partition at once get the same offset "
                "and acknowledged records are overwritten (docs/topology.md \"Kafka: Tansu on S3\").  Use "
                "kafka_storage = 's3' (moto) with several broker nodes, or broker_nodes = 1 with s3rver.")
        if not isinstance(self.redis_server, str) or not self.redis_server:
            raise TopologyConfigError(f"{source}: redis_server must be one of {REDIS_SERVER_NAMES} or a path")
        if self.redis_server not in REDIS_SERVER_NAMES and not Path(self.redis_server).is_absolute():
            raise TopologyConfigError(
                f"{source}: redis_server = {self.redis_server!r}: use one of "
                f"{', '.join(map(repr, REDIS_SERVER_NAMES))} or an absolute path to an executable")

    @property
    def redis_nodes(self) -> int:
        return self.redis_masters * (1 + self.redis_replicas_per_master)

    def resolve_binaries(self) -> dict[str, Path]:
        """Every binary this configuration needs; raises MissingBinaryError naming the key and binary."""
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


def _check_type(source: str, key: str, value: Any, expected: type) -> None:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if isinstance(value, bool) or not isinstance(value, expected):
        raise TopologyConfigError(
            f"{source}: {key} = {value!r} must be {'an integer' if expected is int else 'a number' if expected is float else 'a string'}")


# The scenario model (contracts/scenario.py) imports no stage: the [topology] table is registered into it here.
scenario_model.register_topology_model(scenario_model.TopologyModel(
    normalise=lambda mapping, source: TopologyConfig.from_mapping(mapping, source=source).to_dict(),
    kill_loses_log=lambda mapping, role: TopologyConfig.from_mapping(mapping).destructive_kill_loses_log(role),
))
