"""Every topology, node handle and target class provides every member of its declared interface
(contracts/topology.py), checked on real instances built without starting anything: the members are looked
up on the class and in the instance's own attributes, so no property runs (a container node's pid would ask
its engine)."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.model  # noqa: F401  (registers the [topology] and [broker] tables)
from contracts.scenario import load_scenario, with_provider
from contracts.target_nodes import NodeSpec
from contracts.topology import AddressMode, NodeHandle, ServiceTopology, Target, Topology
from harness.containers.node import ContainerNode
from harness.containers.target import ContainerExternalTarget
from harness.containers.topology import ContainerRedisNode, ContainerTopology
from harness.external_target import ExternalNode, ExternalTarget, ExternalTopology
from harness.local.host_topology import LocalTopology
from harness.local.redis_processes import RedisNode
from harness.local.tansu import TansuNode
from harness.node import ProcessNode
from harness.providers import make_target, topology_class
from harness.reference_target import ReferenceTarget
from harness.topology_config import TopologyConfig

REPO = Path(__file__).resolve().parents[2]
EXTERNAL = REPO / "scenarios" / "mosquitto-kill.toml"
REFERENCE = REPO / "scenarios" / "p2p-smoke.toml"


def members(protocol: type) -> set[str]:
    """The names a Protocol declares: its annotated attributes, methods and properties (and its bases')."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (object,) or klass.__module__ == "typing":
            continue
        names.update(getattr(klass, "__annotations__", {}))
        names.update(name for name, value in vars(klass).items()
                     if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))
    return names


def missing(instance: object, protocol: type) -> list[str]:
    own = set(vars(instance))
    return sorted(name for name in members(protocol)
                  if name not in own and not any(name in vars(klass) for klass in type(instance).__mro__))


def _process_node(tmp_path: Path) -> ProcessNode:
    return ProcessNode("n", "broker", "127.0.0.1", 1883, ["true"], log_path=tmp_path / "n.log",
                       data_dir=tmp_path / "n")


def _container_node(cls: type, tmp_path: Path) -> ContainerNode:
    return cls(SimpleNamespace(run_id="test"), "redis-11", "redis", "image", "10.123.0.11", 6379, ["x"],
               network="ordeal-test", run_dir=tmp_path)


def test_the_protocols_declare_what_the_stages_use():
    assert {"redis_nodes", "kafka", "storage", "brokers", "config", "addresses", "client_hosts",
            "network_fault_place", "nodes"} <= members(Topology)
    assert {"redis_startup_nodes", "kafka_bootstrap", "endpoints", "client_bind_address"} <= members(ServiceTopology)
    assert {"white_box", "topology", "key_prefix", "reuse", "reset_s", "heal_ready_timeout_s", "snapshot",
            "log_files"} <= members(Target)


def test_every_node_handle_class_is_a_node_handle(tmp_path):
    nodes = [_process_node(tmp_path),
             RedisNode("redis-1", "127.0.0.1", 7001, Path("/bin/true"), run_dir=tmp_path, appendfsync="everysec",
                       node_timeout_ms=1000),
             TansuNode(Path("/bin/true"), "127.0.0.1", 9092, tmp_path, None, ""),
             ExternalNode(SimpleNamespace(spec=SimpleNamespace(ready="mqtt")), NodeSpec("mq"), "mq", "mqtt-broker",
                          "127.0.0.1", 1883, ["true"],
                          log_path=tmp_path / "mq.log", data_dir=tmp_path / "mq"),
             _container_node(ContainerNode, tmp_path),
             _container_node(ContainerRedisNode, tmp_path)]
    for node in nodes:
        assert missing(node, NodeHandle) == [], type(node).__name__


def test_both_providers_topologies_are_service_topologies(tmp_path):
    for topology in (LocalTopology(TopologyConfig(), tmp_path / "local", address_mode="loopback"),
                     ContainerTopology(TopologyConfig(provider="containers"), tmp_path / "containers")):
        assert missing(topology, ServiceTopology) == [], type(topology).__name__
        assert missing(topology.addresses, AddressMode) == []


def test_the_external_topology_is_a_topology(tmp_path):
    node = _process_node(tmp_path)
    node.role = "mqtt-broker"
    topology = ExternalTopology(SimpleNamespace(nodes=[node]), "loopback")
    assert missing(topology, Topology) == []
    assert missing(topology.addresses, AddressMode) == []


def test_every_target_class_is_a_target(tmp_path):
    external = load_scenario(EXTERNAL)
    reference = load_scenario(REFERENCE)
    config = TopologyConfig.from_mapping(reference.topology)
    targets = [ExternalTarget(external, tmp_path / "e", None),
               ContainerExternalTarget(with_provider(external, "containers"), tmp_path / "c", None),
               ReferenceTarget(reference, tmp_path / "r", None, config, LocalTopology),
               ReferenceTarget(reference, tmp_path / "rc", None, config, ContainerTopology)]
    for target in targets:
        assert missing(target, Target) == [], type(target).__name__


@pytest.mark.parametrize(("path", "provider", "expected"), [
    (EXTERNAL, None, ExternalTarget), (EXTERNAL, "containers", ContainerExternalTarget),
    (REFERENCE, None, ReferenceTarget), (REFERENCE, "containers", ReferenceTarget)])
def test_the_provider_switch_chooses_the_target_class(tmp_path, path, provider, expected):
    scenario = load_scenario(path)
    if provider:
        scenario = with_provider(scenario, provider)
    target = make_target(scenario, tmp_path, None)
    assert type(target) is expected
    if expected is ReferenceTarget:
        assert type(target.topology) is topology_class(provider or "local")
