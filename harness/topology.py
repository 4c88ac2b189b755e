"""The local topology provider: Redis Cluster + Tansu (+ its S3 server) + reference-broker nodes, as
real processes under one run directory (data/<node>/, logs/<node>.log, topology.json).

    with LocalTopology(TopologyConfig(), run_dir) as topology:
        topology.redis_startup_nodes(); topology.kafka_bootstrap(); topology.endpoints()

Start-up is all or nothing: if any part fails, everything already started is stopped before the error
propagates.  Addresses: inside a private network namespace (harness/netns.py) every node gets its own
127.0.0.x; on the host network everything is on 127.0.0.1 with free ports (harness/addresses.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from harness import netns
from harness.addresses import AddressPlan
from harness.binaries import REPO_ROOT
from harness.kafka import TansuNode, create_topics, storage_node
from harness.node import Node, ProcessNode, port_accepts
from harness.redis_cluster import RedisCluster, RedisNode
from harness.topology_config import TopologyConfig

REDIS_PORT, KAFKA_PORT, S3_PORT, MQTT_PORT = 6379, 9092, 5555, 1883

# The reference brokers' --config file: a ready file; a callable that writes it once Redis and Kafka are
# up; a mapping of broker settings (the scenario's [broker] table) written with the endpoints; or None
# (default broker settings, written with the endpoints).
BrokerConfig = Path | Callable[["LocalTopology"], Path] | Mapping | None


def _broker_ready(node: ProcessNode) -> bool:
    """docs/architecture.md: the MQTT port accepts and the node's log says ready."""
    return port_accepts(node.host, node.port) and " ready" in node.log_since_start()


class LocalTopology:
    def __init__(self, config: TopologyConfig | None = None, run_dir: Path | str = "runs/up", *,
                 address_mode: str = "auto", broker_config: BrokerConfig = None) -> None:
        """address_mode: "distinct" (own 127.0.0.x per node), "loopback" (127.0.0.1, free ports), or
        "auto" (distinct inside a private network namespace, else loopback)."""
        self.config = config or TopologyConfig()
        self.run_dir = Path(run_dir).resolve()
        if address_mode == "auto":
            address_mode = "distinct" if netns.in_private_netns() else "loopback"
        self.addresses = AddressPlan(address_mode)
        self.broker_config = broker_config
        self.redis_nodes: list[RedisNode] = []
        self.redis: RedisCluster | None = None
        self.kafka: TansuNode | None = None
        self.storage: ProcessNode | None = None
        self.brokers: list[ProcessNode] = []
        self.timings: dict[str, float] = {}
        self.started = False

    # -- life --------------------------------------------------------------------------------------
    def __enter__(self) -> LocalTopology:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, with_brokers: bool = True) -> None:
        """with_brokers=False: Redis and Kafka only; the broker nodes are started later with ``start_brokers``
        (harness/keeper.py keeps Redis and Kafka between seeds and starts each seed's brokers in its run dir)."""
        if self.started or self.nodes():
            raise RuntimeError("this LocalTopology was already started; make a new one for a new run")
        data = self.run_dir / "data"
        if data.is_dir() and any(data.iterdir()):
            raise RuntimeError(f"run directory {self.run_dir} already holds node data from an earlier run "
                               "(data/); choose a new run directory")
        started = time.monotonic()
        found = self.config.resolve_binaries()  # before anything runs: a missing binary starts nothing
        try:
            self._start_redis(found["redis"])
            if self.config.kafka_storage != "none":
                self._start_kafka(found)
            # Redis readiness is awaited after Kafka started, so both come up in parallel
            self.redis.wait_ready(self.config.ready_timeout_s)
            self.timings["redis_ready_s"] = round(time.monotonic() - started, 3)
            if self.config.broker_nodes and with_brokers:
                self.start_brokers()
        except BaseException:
            self.stop()
            raise
        self.started = True
        self.timings["ready_s"] = round(time.monotonic() - started, 3)
        self.write_description()

    def _start_redis(self, binary: Path) -> None:
        began = time.monotonic()
        for _ in range(self.config.redis_nodes):
            host, port = self.addresses.allocate(REDIS_PORT, with_bus=True)
            self.redis_nodes.append(RedisNode(
                f"redis-{host.rsplit('.', 1)[1] if self.addresses.mode == 'distinct' else port}", host, port,
                binary, run_dir=self.run_dir, appendfsync=self.config.redis_appendfsync,
                node_timeout_ms=self.config.redis_node_timeout_ms))
        self.redis = RedisCluster(self.redis_nodes, self.config.redis_masters,
                                  self.config.redis_replicas_per_master)
        self.redis.start_processes()
        self.redis.create(timeout=self.config.ready_timeout_s)
        self.timings["redis_formed_s"] = round(time.monotonic() - began, 3)

    def _start_kafka(self, found: Mapping[str, Path]) -> None:
        began = time.monotonic()
        kind = self.config.storage_kind()
        if kind:
            host, port = self.addresses.allocate(S3_PORT)
            self.storage = storage_node(kind, found[kind], host, port, self.run_dir)
            self.storage.start()
            self.storage.wait_ready(self.config.ready_timeout_s)
        host, port = self.addresses.allocate(KAFKA_PORT)
        self.kafka = TansuNode(found["tansu"], host, port, self.run_dir, self.storage, kind)
        self.kafka.start()
        self.kafka.wait_ready(self.config.ready_timeout_s)
        self.timings["kafka_ready_s"] = round(time.monotonic() - began, 3)

    def start_brokers(self, run_dir: Path | None = None, addresses: list[tuple[str, int]] | None = None) -> None:
        """Start the broker nodes (logs and data under ``run_dir``, default the topology's; on ``addresses``,
        default newly allocated ones).  Stop them with ``stop_brokers``."""
        began = time.monotonic()
        run_dir = Path(run_dir or self.run_dir)
        config_path = self._broker_config_path()
        for index in range(1, self.config.broker_nodes + 1):
            host, port = addresses[index - 1] if addresses else self.addresses.allocate(MQTT_PORT)
            name = f"broker-{index}"
            argv = [sys.executable, "-m", "reference_broker", "--config", str(config_path),
                    "--node-id", name, "--listen", f"{host}:{port}"]
            node = ProcessNode(name, "broker", host, port, argv, log_path=run_dir / "logs" / f"{name}.log",
                               data_dir=run_dir / "data" / name, cwd=REPO_ROOT,
                               ready_check=_broker_ready)
            self.brokers.append(node)
            node.start()
        for node in self.brokers:
            node.wait_ready(self.config.ready_timeout_s)
        self.timings["brokers_ready_s"] = round(time.monotonic() - began, 3)

    def stop_brokers(self, timeout: float = 10.0) -> None:
        """Stop the broker nodes only (Redis and Kafka keep running) and forget them."""
        errors = []
        for node in self.brokers:
            try:
                node.stop(timeout)
            except Exception as error:  # noqa: BLE001 - keep stopping the others, report at the end
                errors.append(f"{node.name}: {error}")
        self.brokers = []
        if errors:
            raise RuntimeError("stopping the brokers: " + "; ".join(errors))

    def _broker_config_path(self) -> Path:
        if callable(self.broker_config):
            return Path(self.broker_config(self))
        if isinstance(self.broker_config, (str, Path)):
            return Path(self.broker_config)
        path = self.run_dir / "broker-config.json"
        path.write_text(json.dumps({
            "broker": dict(self.broker_config or {}),
            "redis_startup_nodes": [f"{h}:{p}" for h, p in self.redis_startup_nodes()],
            "kafka_bootstrap": self.kafka_bootstrap()}, indent=2))
        return path

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (brokers first, storage last); safe to call twice or after a failed start."""
        errors = []
        for node in [*self.brokers, self.kafka, *self.redis_nodes, self.storage]:
            if node is None:
                continue
            try:
                node.stop(timeout)
            except Exception as error:  # noqa: BLE001 - keep stopping the others, report at the end
                errors.append(f"{node.name}: {error}")
        self.started = False
        if errors:
            raise RuntimeError("stopping the topology: " + "; ".join(errors))

    # -- access ------------------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        return [n for n in [*self.redis_nodes, self.storage, self.kafka, *self.brokers] if n is not None]

    def node(self, name: str) -> Node:
        for node in self.nodes():
            if node.name == name:
                return node
        raise KeyError(f"no node named {name!r}; nodes: {[n.name for n in self.nodes()]}")

    def redis_startup_nodes(self) -> list[tuple[str, int]]:
        return [(n.host, n.port) for n in self.redis_nodes]

    def kafka_bootstrap(self) -> str:
        if self.kafka is None:
            raise RuntimeError("this topology has no Kafka broker (kafka_storage = 'none')")
        return self.kafka.bootstrap

    def create_topics(self, topics: Mapping[str, int]) -> None:
        create_topics(self.kafka_bootstrap(), topics)

    def endpoints(self) -> dict:
        return {
            "run_dir": str(self.run_dir),
            "address_mode": self.addresses.mode,
            "network_namespace": "private" if netns.in_private_netns() else "host",
            "redis": {"startup_nodes": [f"{h}:{p}" for h, p in self.redis_startup_nodes()],
                      "masters": self.config.redis_masters,
                      "replicas_per_master": self.config.redis_replicas_per_master},
            "kafka": {"bootstrap": self.kafka.bootstrap, "storage_engine": self.kafka.storage_engine}
            if self.kafka else None,
            "storage": {"kind": self.config.storage_kind(), "endpoint": f"http://{self.storage.address}"}
            if self.storage else None,
            "mqtt": {b.name: b.address for b in self.brokers},
            "nodes": [n.describe() for n in self.nodes()],
        }

    def write_description(self) -> Path:
        path = self.run_dir / "topology.json"
        path.write_text(json.dumps({**self.endpoints(), "config": self.config.to_dict(),
                                    "timings": self.timings}, indent=2))
        return path
