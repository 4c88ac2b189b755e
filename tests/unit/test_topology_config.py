"""Pure parts of the topology: configuration validation, CLUSTER NODES parsing, address plans."""

from __future__ import annotations

import re

import pytest

from harness import binaries
from harness.addresses import AddressAllocator
from harness.running_redis_cluster import _view, parse_cluster_nodes
from harness.topology_config import TopologyConfig, TopologyConfigError

SOURCE = "smoke.toml"


def test_defaults_are_three_masters_with_one_replica_each() -> None:
    config = TopologyConfig.from_mapping({}, source=SOURCE)
    assert (config.redis_masters, config.redis_replicas_per_master, config.redis_nodes) == (3, 1, 6)
    assert config.broker_nodes == 0 and config.redis_appendfsync == "everysec"
    assert config.to_dict()["redis_node_timeout_ms"] == 1000


def test_valid_mapping_is_taken_over() -> None:
    config = TopologyConfig.from_mapping({"redis_masters": 4, "redis_replicas_per_master": 0,
                                          "redis_appendfsync": "always", "kafka_storage": "memory",
                                          "broker_nodes": 2, "ready_timeout_s": 20}, source=SOURCE)
    assert config.redis_nodes == 4 and config.broker_nodes == 2
    assert config.ready_timeout_s == 20.0 and isinstance(config.ready_timeout_s, float)


def test_unknown_key_names_the_key_and_the_allowed_ones() -> None:
    with pytest.raises(TopologyConfigError) as error:
        TopologyConfig.from_mapping({"redis_master": 3}, source=SOURCE)
    message = str(error.value)
    assert message.startswith(f"{SOURCE}: [topology]") and "'redis_master'" in message and "redis_masters" in message


@pytest.mark.parametrize(("key", "value", "minimum"), [
    ("redis_masters", 2, 3), ("redis_replicas_per_master", -1, 0), ("redis_node_timeout_ms", 10, 100),
    ("broker_nodes", -1, 0)])
def test_sizes_below_the_minimum_name_key_value_and_minimum(key: str, value: int, minimum: int) -> None:
    expected = f"{SOURCE}: [topology] {key} = {value}: must be >= {minimum}"
    with pytest.raises(TopologyConfigError, match=re.escape(expected)):
        TopologyConfig.from_mapping({key: value}, source=SOURCE)


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("redis_appendfsync", "sometimes", "'always', 'everysec', 'no'"),
    ("kafka_storage", "postgres", "'s3', 's3rver', 'moto', 'memory', 'none'")])
def test_bad_choice_lists_what_is_allowed(key: str, value: str, allowed: str) -> None:
    with pytest.raises(TopologyConfigError) as error:
        TopologyConfig.from_mapping({key: value}, source=SOURCE)
    assert f"{key} = {value!r}" in str(error.value) and allowed in str(error.value)


@pytest.mark.parametrize(("key", "value"), [("redis_masters", "3"), ("redis_masters", True),
                                            ("redis_appendfsync", 1), ("ready_timeout_s", "fast")])
def test_wrong_types_are_refused(key: str, value: object) -> None:
    with pytest.raises(TopologyConfigError, match=rf"{key} = .* must be"):
        TopologyConfig.from_mapping({key: value}, source=SOURCE)


def test_relative_redis_server_path_is_refused() -> None:
    with pytest.raises(TopologyConfigError, match="redis_server = 'bin/redis'"):
        TopologyConfig.from_mapping({"redis_server": "bin/redis"}, source=SOURCE)


def test_missing_binary_names_the_key_and_the_binary() -> None:
    config = TopologyConfig(redis_server="/nonexistent/redis-server")
    with pytest.raises(binaries.MissingBinaryError, match="redis_server = '/nonexistent/redis-server'"):
        config.resolve_binaries()


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        TopologyConfig().redis_masters = 5  # type: ignore[misc]


NODES = """\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.2:6379@16379 myself,master - 0 0 1 connected 0-5460
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.3:6379@16379 master - 0 1 2 connected 5461-10922 [10923->-abc]
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.4:6379@16379 master,fail? - 0 1 3 connected 10923-16383
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.5:6379@16379 slave 07c37dfeb235213a872192d90877d0cd55635b91 0 1 1 connected
"""


def test_parse_cluster_nodes() -> None:
    entries = parse_cluster_nodes(NODES)
    assert [e.address for e in entries] == ["127.0.0.2:6379", "127.0.0.3:6379", "127.0.0.4:6379", "127.0.0.5:6379"]
    first, second, third, replica = entries
    assert first.is_master and "myself" in first.flags and first.slots == ((0, 5460),)
    assert second.slots == ((5461, 10922),)  # the migrating slot is not owned
    assert third.failing and not first.failing
    assert not replica.is_master and replica.master_id == first.node_id
    assert second.owns_slot(5461) and not second.owns_slot(10923)


def test_views_ignore_flags_that_differ_per_observer() -> None:
    here = parse_cluster_nodes(NODES)
    elsewhere = parse_cluster_nodes(NODES.replace("myself,master", "master"))
    assert _view(here) == _view(elsewhere)
    promoted = parse_cluster_nodes(NODES.replace("slave 07c37dfeb235213a872192d90877d0cd55635b91",
                                                 "master -"))
    assert _view(here) != _view(promoted)


def test_distinct_addresses_count_up_through_127_0_x() -> None:
    allocator = AddressAllocator()
    allocator._next_host = 253
    hosts = [allocator._next_address() for _ in range(3)]
    assert hosts == ["127.0.0.253", "127.0.0.254", "127.0.1.1"]


def test_network_faults_are_refused_outside_the_private_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import netns

    monkeypatch.delenv(netns.MARKER, raising=False)
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert not netns.can_isolate()
    with pytest.raises(netns.IsolationUnavailable, match="a partition needs the run's private network namespace"):
        netns.require_isolation("a partition")
    with pytest.raises(netns.IsolationUnavailable, match="uid 1000.*without --isolated"):
        netns.enter_private_netns()
    monkeypatch.setenv(netns.MARKER, "private")
    netns.require_isolation("a partition")  # inside: allowed


def test_s3rver_with_several_broker_nodes_is_refused_with_the_reason() -> None:
    with pytest.raises(TopologyConfigError) as error:
        TopologyConfig.from_mapping({"kafka_storage": "s3rver", "broker_nodes": 2}, source=SOURCE)
    message = str(error.value)
    assert message.startswith(f"{SOURCE}: [topology]") and "kafka_storage = 's3rver': with broker_nodes = 2" in message
    assert "conditional writes" in message and "docs/topology.md" in message
    assert TopologyConfig.from_mapping({"kafka_storage": "s3rver", "broker_nodes": 1}, source=SOURCE).broker_nodes == 1
    assert TopologyConfig.from_mapping({"kafka_storage": "moto", "broker_nodes": 3}, source=SOURCE).broker_nodes == 3


@pytest.mark.parametrize(("storage", "role", "loses"), [
    ("s3", "storage", True), ("moto", "storage", True), ("s3rver", "storage", False),
    ("s3", "kafka", False), ("s3rver", "kafka", False), ("memory", "kafka", True), ("s3", "redis", False)])
def test_which_kills_lose_the_whole_kafka_log(storage: str, role: str, loses: bool) -> None:
    why = TopologyConfig(kafka_storage=storage).destructive_kill_loses_log(role)
    assert bool(why) == loses
    if role == "storage" and loses:
        assert 'kafka_storage = "s3rver"' in why
