"""What both topology providers' topologies share (harness/local/, harness/containers/): the node lists by
role, the broker nodes' config file, and the description written as topology.json.  A provider adds how the
nodes start and stop."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from harness import netns
from harness.kafka import create_topics
from harness.node import Node
from harness.running_redis_cluster import RedisCluster
from harness.topology_config import TopologyConfig

REDIS_PORT, KAFKA_PORT, S3_PORT, MQTT_PORT = 6379, 9092, 5555, 1883

# The reference brokers' --config file: a ready file; a callable that writes it once Redis and Kafka are
# up; a mapping of broker settings (the scenario's [broker] table) written with the endpoints; or None
# (default broker settings, written with the endpoints).
BrokerConfig = Path | Callable[["TopologyBase"], Path] | Mapping | None


class TopologyBase:
    """The node lists and description of a topology (contracts.topology.ServiceTopology); a provider sets
    ``addresses`` and implements start / stop."""

    client_hosts: str | None = None  # faults/selectors.py: the "client" group's address, when fixed
    client_bind_address = ""  # the address the clients bind, when the provider fixes one
    network_fault_place: str | None = None  # faults/network.py: "bridge" for nft bridge-family chains
    link_proxies: dict | None = None  # faults/latency.py: the links routed through a toxiproxy, when any

    def __init__(self, config: TopologyConfig | None, run_dir: Path | str, broker_config: BrokerConfig) -> None:
        self.config = config or TopologyConfig()
        self.run_dir = Path(run_dir).resolve()
        self.broker_config = broker_config
        self.redis_nodes: list = []
        self.redis: RedisCluster | None = None
        self.kafka = None
        self.storage = None
        self.brokers: list = []
        self.timings: dict[str, float] = {}
        self.started = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

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
