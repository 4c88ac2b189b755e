"""Fault descriptions, parameter validation, selectors and the pure parsers of the nemesis."""

from __future__ import annotations

import json

import pytest

from faults.base import Check, Evidence, FaultSpec, FaultSpecError
from faults.catalog import FAULT_KINDS, build_fault, is_client_fault, kinds_by_category, validate_spec
from faults.network import chain_name, drop_rules, parse_class_stats, parse_counters
from faults.probes import proc_state
from faults.redis_cluster_view import client_messages_key, parse_cluster_nodes
from faults.selectors import parse_group, parse_selector

EXPECTED_KINDS = {
    "process_kill", "process_stop", "process_pause", "process_restart", "redis_failover",
    "net_partition", "net_partition_oneway", "net_partition_ring", "net_isolate", "net_lossy", "net_bandwidth",
    "client_flap", "client_reconnect_storm", "redis_write_stall", "redis_outage", "kafka_outage_during_save",
    "link_latency", "link_bandwidth", "link_slow_close", "link_timeout", "link_reset_peer",
    "disk_full", "file_truncate", "file_bitflip",
    "clock_offset", "clock_jump", "clock_strobe", "clock_drift",
    "power_loss",
}


def test_every_kind_registered_with_a_one_line_description():
    assert set(FAULT_KINDS) == EXPECTED_KINDS
    for name, description in FAULT_KINDS.items():
        assert description and "\n" not in description, name
    assert kinds_by_category()["client"] == ["client_flap", "client_reconnect_storm"]
    assert is_client_fault("client_flap") and not is_client_fault("process_kill")


def test_unknown_kind_names_it_and_lists_allowed():
    with pytest.raises(FaultSpecError) as error:
        validate_spec({"id": "f1", "kind": "proces_kill", "target": "kafka"})
    assert "'proces_kill'" in str(error.value) and "process_kill" in str(error.value)
    assert "'f1'" in str(error.value)


def test_unknown_param_names_it_and_lists_allowed():
    with pytest.raises(FaultSpecError) as error:
        validate_spec({"id": "f2", "kind": "net_lossy", "params": {"a": "broker", "b": "redis", "pct": 5}})
    message = str(error.value)
    assert "pct" in message and "percent" in message and "direction" in message


@pytest.mark.parametrize("params, fragment", [
    ({"a": "broker", "b": "redis", "percent": 0}, ">= 1"),
    ({"a": "broker", "b": "redis", "percent": 101}, "<= 100"),
    ({"a": "broker", "b": "redis", "percent": "30"}, "expected percent: int"),
    ({"a": "broker", "b": "redis", "percent": True}, "expected percent: int"),
    ({"a": "broker", "b": "redis", "direction": "sideways"}, "'both', 'oneway'"),
    ({"a": "brokers", "b": "redis"}, "network group member 'brokers'"),
    ({"b": "redis"}, "missing required parameter a"),
])
def test_bad_params_are_named(params, fragment):
    with pytest.raises(FaultSpecError) as error:
        validate_spec({"id": "x", "kind": "net_lossy", "params": params})
    assert fragment in str(error.value)


def test_defaults_are_filled_and_ints_become_floats():
    spec = validate_spec({"id": "s", "kind": "process_stop", "target": "redis-master-of:sub-1",
                          "params": {"timeout_s": 3}})
    assert spec == FaultSpec("s", "process_stop", "redis-master-of:sub-1",
                             {"timeout_s": 3.0, "wait_promotion": True})
    lossy = validate_spec({"id": "l", "kind": "net_lossy", "params": {"a": ["broker", "kafka"], "b": "redis"}})
    assert lossy.params["percent"] == 30 and lossy.params["direction"] == "both"


@pytest.mark.parametrize("fault, fragment", [
    ({"id": "t", "kind": "process_kill"}, "needs a target"),
    ({"id": "t", "kind": "process_kill", "target": "redis-master"}, "not understood"),
    ({"id": "t", "kind": "process_kill", "target": "broker:0"}, "N >= 1"),
    ({"id": "t", "kind": "net_partition", "target": "kafka", "params": {"a": "broker", "b": "redis"}},
     "takes no target"),
    ({"id": "t", "kind": "client_flap"}, "client id"),
    ({"id": "t", "kind": "client_flap", "target": "sub-1", "params": {"node": "broker:x"}}, "broker:N"),
    ({"id": "t", "kind": "client_reconnect_storm", "params": {"sessions": 0}}, "'all' or a number"),
    ({"id": "t", "kind": "process_kill", "target": "kafka", "when": 3}, "unknown field(s) when"),
    ({"id": "", "kind": "process_kill"}, "'id' must be"),
])
def test_bad_targets_and_fields_are_named(fault, fragment):
    with pytest.raises(FaultSpecError) as error:
        validate_spec(fault)
    assert fragment in str(error.value)


def test_selectors_round_trip():
    for text in ("node:redis-7001", "redis-master-of:sub-1", "redis-replica-of:sub-1", "redis-random-master",
                 "redis-random-replica", "kafka", "storage", "broker:2", "broker-random",
                 "broker-holding:sub-3"):
        assert str(parse_selector(text)) == text
    assert parse_group(["redis", "client:pub-1", "broker:1"]) == ("redis", "client:pub-1", "broker:1")


def test_client_faults_have_no_nemesis_implementation():
    spec = validate_spec({"id": "c", "kind": "client_flap", "target": "sub-1"})
    assert spec.params == {"mode": "abrupt", "reconnect": True, "clean_start": False, "node": "same"}
    with pytest.raises(FaultSpecError, match="played by the executor"):
        build_fault(spec)


def test_evidence_bit_needs_every_check_and_at_least_one():
    assert not Evidence(()).bit
    good, bad = Check("a", {}, True), Check("b", {"x": 1}, False)
    assert Evidence.of(good).bit and not Evidence.of(good, bad).bit
    assert json.loads(json.dumps(Evidence.of(good, bad).to_dict()))["checks"][1]["observed"] == {"x": 1}


CLUSTER_NODES = """\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.2:6379@16379 myself,master - 0 1426238317239 1 connected 0-5460
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.3:6379@16379,host master,fail - 0 1426238316232 2 connected 5461-10922 [10923->-e7d1]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.4:6379@16379 master - 0 1426238318243 7 connected 10923-16383
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.5:6379@16379 slave 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 0 1426238316232 2 connected
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.6:6379@16379 slave 07c37dfeb235213a872192d90877d0cd55635b91 0 1426238317741 1 connected
"""


def test_parse_cluster_nodes():
    entries = parse_cluster_nodes(CLUSTER_NODES)
    assert [entry.address for entry in entries] == [f"127.0.0.{i}:6379" for i in range(2, 7)]
    assert entries[0].is_master and entries[0].slots == ((0, 5460),)
    assert entries[1].is_failed and entries[1].slots == ((5461, 10922),)  # the migrating slot is not owned
    assert entries[3].master_id == entries[1].node_id and not entries[3].is_master
    assert entries[2].config_epoch == 7 and entries[2].owns_slot(16383)
    assert client_messages_key("sub-1") == "{sub-1}_messages"


def test_drop_rules():
    assert drop_rules("drop", ["127.0.0.3", "127.0.0.2"], ["127.0.0.9"], None, "both") == [
        "ip saddr { 127.0.0.2, 127.0.0.3 } ip daddr { 127.0.0.9 } counter drop",
        "ip saddr { 127.0.0.9 } ip daddr { 127.0.0.2, 127.0.0.3 } counter drop",
    ]
    assert drop_rules("drop", ["127.0.0.2"], ["127.0.0.9"], 25, "oneway") == [
        "ip saddr { 127.0.0.2 } ip daddr { 127.0.0.9 } numgen random mod 100 < 25 counter drop"]
    assert drop_rules("isolate", ["127.0.0.4"], [], None, "both") == [
        "ip saddr 127.0.0.4 ip daddr != 127.0.0.4 counter drop",
        "ip daddr 127.0.0.4 ip saddr != 127.0.0.4 counter drop"]
    assert chain_name("a b/c") != chain_name("a_b_c") and chain_name("a b/c").startswith("f_a_b_c_")


def test_parse_counters_and_class_stats():
    nft = {"nftables": [{"metainfo": {}}, {"chain": {"name": "x"}},
                        {"rule": {"expr": [{"match": {}}, {"counter": {"packets": 4, "bytes": 240}},
                                           {"drop": None}]}}]}
    assert parse_counters(json.dumps(nft)) == [{"packets": 4, "bytes": 240}]
    tc = ("class htb 1:10 root prio 0 rate 800Kbit ceil 800Kbit burst 65Kb cburst 65Kb \n"
          " Sent 356113 bytes 35 pkt (dropped 1, overlimits 12 requeues 0) \n backlog 210b 3p requeues 0\n"
          " lended: 33 borrowed: 0 giants: 0\n\n"
          "class htb 1:11 root prio 0 rate 8Mbit ceil 8Mbit burst 256Kb cburst 256Kb \n"
          " Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n")
    assert parse_class_stats(tc, "1:10") == {"packets": 35, "bytes": 356113, "overlimits": 12, "drops": 1}
    assert parse_class_stats(tc, "1:11") == {"packets": 0, "bytes": 0, "overlimits": 0, "drops": 0}
    assert parse_class_stats(tc, "1:12") is None


def test_proc_state_of_self_and_of_nothing():
    import os

    assert proc_state(os.getpid()) in ("R", "S")
    assert proc_state(None) is None


def test_group_exclusions():
    from types import SimpleNamespace

    from faults.base import FaultNotApplicable
    from faults.selectors import resolve_group

    brokers = [SimpleNamespace(name=f"broker-{i}", host=f"127.0.0.{i + 10}", port=1883) for i in (1, 2, 3)]
    topology = SimpleNamespace(redis_nodes=[], brokers=brokers, kafka=None, storage=None)
    import random

    rng = random.Random(1)
    assert resolve_group(topology, ["broker", "-broker:1"], rng) == {"broker-2": "127.0.0.12",
                                                                     "broker-3": "127.0.0.13"}
    cache: dict = {}
    picked = resolve_group(topology, "broker-random", rng, cache=cache)
    rest = resolve_group(topology, ["broker", "-broker-random"], rng, cache=cache)
    assert len(picked) == 1 and set(picked).isdisjoint(rest) and len(rest) == 2
    with pytest.raises(FaultNotApplicable, match="everything excluded"):
        resolve_group(topology, ["broker:1", "-broker:1"], rng)
    with pytest.raises(FaultSpecError, match="only exclusions"):
        parse_group(["-redis"])
    with pytest.raises(FaultSpecError, match="leading '-' excludes"):
        parse_group(["redis", "-nonsense"])


def test_client_fault_helpers_are_deterministic():
    import random

    from faults.base import FaultNotApplicable
    from faults.client import reconnect_node, storm_sessions

    subscribers = [f"sub-{i}" for i in range(10)]
    assert storm_sessions({"sessions": "all"}, subscribers, random.Random(1)) == sorted(subscribers)
    picked = storm_sessions({"sessions": 3}, subscribers, random.Random("7:storm"))
    assert len(picked) == 3 and picked == storm_sessions({"sessions": 3}, subscribers[::-1],
                                                         random.Random("7:storm"))
    assert storm_sessions({"sessions": 30}, subscribers, random.Random(1)) == sorted(subscribers)
    assert reconnect_node("same", 1, 3, random.Random(0)) == 1
    assert reconnect_node("other", 2, 3, random.Random(0)) == 0
    assert reconnect_node("other", 0, 1, random.Random(0)) == 0
    assert reconnect_node("broker:2", 0, 2, random.Random(0)) == 1
    assert 0 <= reconnect_node("random", 0, 3, random.Random(0)) < 3
    with pytest.raises(FaultNotApplicable, match="has 2 broker node"):
        reconnect_node("broker:3", 0, 2, random.Random(0))


def test_failure_path_kinds_validate_and_fill_defaults():
    stall = validate_spec({"id": "s", "kind": "redis_write_stall", "target": "redis-master-of:c1"})
    assert stall.params == {"max_ms": 120_000, "probe_timeout_s": 0.5}
    outage = validate_spec({"id": "o", "kind": "redis_outage", "target": "redis-random-master"})
    assert outage.params == {"scope": "master", "spare_lease_master": True}
    kafka = validate_spec({"id": "k", "kind": "kafka_outage_during_save", "target": "kafka",
                           "params": {"stall_master": "redis-master-of:c1", "hold_max_s": 2}})
    assert kafka.params == {"mode": "kill", "stall_master": "redis-master-of:c1", "hold_max_s": 2.0}
    for fault, fragment in [
        ({"id": "s", "kind": "redis_write_stall", "target": "redis-random-master", "params": {"max_ms": 10}},
         "parameter 'max_ms' = 10: must be >= 100"),
        ({"id": "o", "kind": "redis_outage", "target": "kafka", "params": {"scope": "everything"}},
         "expected one of 'master', 'cluster'"),
        ({"id": "o", "kind": "redis_outage", "target": None}, "needs a target"),
        ({"id": "k", "kind": "kafka_outage_during_save", "target": "kafka", "params": {"stall_master": "redis"}},
         "parameter 'stall_master' = 'redis': expected a node selector"),
        ({"id": "k", "kind": "kafka_outage_during_save", "target": "kafka", "params": {"mode": "sigstop"}},
         "expected one of 'kill', 'stop', 'pause'"),
    ]:
        with pytest.raises(FaultSpecError) as error:
            validate_spec(fault)
        assert fragment in str(error.value), str(error.value)
    assert type(build_fault(stall)).__name__ == "WriteStallFault"


def test_failure_path_helpers(tmp_path):
    from types import SimpleNamespace

    from faults.failure_paths import BrokerLogWatch, broker_check, probe_key
    from faults.redis_cluster_view import ClusterEntry

    assert drop_rules("reject", ["127.0.0.5"], ["127.0.0.2"], None, "oneway") == [
        "ip saddr { 127.0.0.5 } ip daddr { 127.0.0.2 } meta l4proto tcp counter reject with tcp reset"]
    entry = ClusterEntry("id", "127.0.0.2:6379", frozenset({"master"}), None, 1, True, ((5461, 10922),))
    from redis.crc import key_slot
    assert 5461 <= key_slot(probe_key(entry).encode()) <= 10922
    log = tmp_path / "broker-1.log"
    log.write_text("before: processing failed (attempt 9): x\n")
    watch = BrokerLogWatch(SimpleNamespace(brokers=[SimpleNamespace(name="broker-1", log_path=log)]))
    with log.open("a") as out:  # only what is written after the watch began counts
        out.write("W tbmq.msg.persisted: processing failed (attempt 1): ConnectionError; retrying\n"
                  "W tbmq.msg.persisted: processing failed (attempt 2): ConnectionError; retrying\n"
                  "E tbmq.msg.persisted: giving up on 3 records after 3 attempts (x); committing anyway\n")
    seen = watch.since()
    assert seen["counts"] == {"processing_failed": 2, "gave_up": 1, "committing_anyway": 1}
    assert seen["max_attempt"] == 2 and len(seen["lines"]) == 3
    assert broker_check(watch, ("gave_up",), "x").ok and not broker_check(watch, ("commit_failed",), "x").ok
