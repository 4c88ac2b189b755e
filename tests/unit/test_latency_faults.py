"""Link faults (faults/latency.py): spec validation names the fault id, the parameter and the allowed values (the
link, and a target that is not a node on it, refused at load); which links a plan needs routed, and which of them
before the nodes start; the expected added round trip; the probes' Kafka request; the proxy's toxic parsing
(harness/toxiproxy/server.py), the clients' endpoints through the proxies, and the Tansu / Redis node settings
that advertise / announce a proxy."""

from __future__ import annotations

import pytest

from contracts.scenario import ScenarioError, parse_scenario
from faults.base import FaultSpecError
from faults.catalog import PROVIDER_GAPS, build_fault, external_refusal, provider_supports, validate_spec
from faults.latency import (
    BROKER_KAFKA,
    BROKER_REDIS,
    CLIENT_BROKER,
    LINK_KINDS,
    LINKS,
    PREPARED_LINKS,
    api_versions_request,
    proxied_links,
)
from harness.toxiproxy.routing import proxied_endpoints
from harness.toxiproxy.server import ApiError, parse_toxic
from properties.plan import FaultSlot


def spec(kind: str, **params):
    return {"id": "slow1", "kind": kind, "target": "broker:1", "params": params}


def test_defaults_are_filled():
    full = validate_spec(spec("link_latency"))
    assert full.params == {"latency_ms": 200, "jitter_ms": 0, "link": CLIENT_BROKER, "direction": "both",
                           "toxicity": 1.0}
    assert validate_spec(spec("link_bandwidth")).params["rate_kbps"] == 100
    assert validate_spec(spec("link_slow_close")).params["delay_ms"] == 1000
    assert validate_spec(spec("link_timeout")).params["timeout_ms"] == 0
    assert validate_spec(spec("link_reset_peer", timeout_ms=500)).params["timeout_ms"] == 500


@pytest.mark.parametrize(("kind", "params", "names"), [
    ("link_latency", {"latency_ms": 0}, ["'latency_ms'", ">= 1"]),
    ("link_latency", {"latency_ms": "100"}, ["'latency_ms'", "int"]),
    ("link_latency", {"jitter_ms": -1}, ["'jitter_ms'", ">= 0"]),
    ("link_latency", {"direction": "sideways"}, ["'direction'", "'both', 'upstream', 'downstream'"]),
    ("link_latency", {"link": "broker-mysql"}, ["'link'", "'client-broker', 'broker-kafka', 'broker-redis'"]),
    ("link_latency", {"link": "kafka"}, ["'link'", "'client-broker', 'broker-kafka', 'broker-redis'"]),
    ("link_bandwidth", {"rate_kbps": 0}, ["'rate_kbps'", ">= 1"]),
    ("link_slow_close", {"delay_ms": 600_001}, ["'delay_ms'", "<= 600000"]),
    ("link_timeout", {"timeout_ms": True}, ["'timeout_ms'", "int"]),
    ("link_reset_peer", {"toxicity": 1.5}, ["'toxicity'", "<= 1.0"]),
    ("link_reset_peer", {"latency_ms": 100}, ["unknown parameter", "latency_ms", "timeout_ms"]),
])
def test_bad_parameters_name_the_fault_the_parameter_and_what_is_allowed(kind, params, names):
    with pytest.raises(FaultSpecError) as error:
        validate_spec(spec(kind, **params))
    message = str(error.value)
    assert "'slow1'" in message and f"'{kind}'" in message, message
    for name in names:
        assert name in message, message


def test_good_twin_of_each_bad_parameter_passes():
    assert validate_spec(spec("link_latency", latency_ms=1, jitter_ms=0, direction="upstream")).params["latency_ms"] == 1
    assert validate_spec(spec("link_slow_close", delay_ms=600_000)).params["delay_ms"] == 600_000
    assert validate_spec(spec("link_reset_peer", toxicity=1)).params["toxicity"] == 1.0


def test_a_target_is_a_node_selector():
    with pytest.raises(FaultSpecError, match="'slow1'.*needs a target"):
        validate_spec({"id": "slow1", "kind": "link_latency"})
    with pytest.raises(FaultSpecError, match="'slow1'"):
        validate_spec({"id": "slow1", "kind": "link_latency", "target": "brokr:1"})


@pytest.mark.parametrize(("link", "target", "names"), [
    (BROKER_KAFKA, "broker:1", ["'broker:1'", "link 'broker-kafka'", "kafka (or node:kafka)"]),
    (BROKER_KAFKA, "redis-random-master", ["'redis-random-master'", "link 'broker-kafka'", "kafka"]),
    (BROKER_KAFKA, "storage", ["'storage'", "link 'broker-kafka'"]),
    (BROKER_KAFKA, "node:s3", ["'node:s3'", "link 'broker-kafka'"]),
    (BROKER_REDIS, "kafka", ["'kafka'", "link 'broker-redis'", "redis-master-of:CLIENT", "redis-all"]),
    (BROKER_REDIS, "broker-random", ["'broker-random'", "link 'broker-redis'"]),
    (BROKER_REDIS, "node:broker-2", ["'node:broker-2'", "link 'broker-redis'"]),
    (CLIENT_BROKER, "redis-master-of:sub", ["'redis-master-of:sub'", "link 'client-broker'", "broker:N"]),
    (CLIENT_BROKER, "kafka", ["'kafka'", "link 'client-broker'"]),
    (CLIENT_BROKER, "node:redis-7001", ["'node:redis-7001'", "link 'client-broker'"]),
])
def test_a_target_off_the_link_names_the_fault_the_link_and_its_targets(link, target, names):
    with pytest.raises(FaultSpecError) as error:
        validate_spec({"id": "slow1", "kind": "link_latency", "target": target, "params": {"link": link}})
    message = str(error.value)
    assert "'slow1'" in message and "targets.link_latency" in message, message
    for name in names:
        assert name in message, message


@pytest.mark.parametrize(("link", "target"), [
    (BROKER_KAFKA, "kafka"), (BROKER_KAFKA, "node:kafka"),
    (BROKER_REDIS, "redis-master-of:sub"), (BROKER_REDIS, "redis-replica-of:sub"), (BROKER_REDIS, "redis-all"),
    (BROKER_REDIS, "redis-random-master"), (BROKER_REDIS, "redis-random-replica"), (BROKER_REDIS, "node:redis-5"),
    (CLIENT_BROKER, "broker:2"), (CLIENT_BROKER, "broker-holding:sub"), (CLIENT_BROKER, "broker-minority"),
    (CLIENT_BROKER, "node:broker-1"),
])
def test_a_target_on_the_link_passes(link, target):
    for kind in LINK_KINDS:
        full = validate_spec({"id": "slow1", "kind": kind, "target": target, "params": {"link": link}})
        assert full.params["link"] == link and full.target == target


SCENARIO = """
[scenario]
name = "links"
duration_s = 8
[workload]
pattern = "p2p"
pairs = 1
rate_per_publisher = 5
qos_mix = { qos1 = 1 }
[faults]
mix = { link_latency = 1 }
"""


def test_a_scenario_with_a_backend_link_needs_its_target():
    params = 'params = { link_latency = { link = "broker-kafka" } }\n'
    with pytest.raises(ScenarioError, match="targets.link_latency.*'broker-random' is not a node on link "
                                            "'broker-kafka'"):
        parse_scenario(SCENARIO + params)  # the default target of the link kinds is a broker node
    scenario = parse_scenario(SCENARIO + params + 'targets = { link_latency = ["kafka"] }\n')
    assert dict(scenario.faults.targets)["link_latency"] == ("kafka",)
    # links drawn from choices are checked against every target (the fixed parameters, here the default link,
    # are a variant too): one target list cannot serve two links
    with pytest.raises(ScenarioError, match="targets.link_latency = 'kafka'.*is not a node on link"):
        parse_scenario(SCENARIO + 'targets = { link_latency = ["kafka"] }\n'
                       'choices = { link_latency = { link = ["broker-kafka", "broker-redis"] } }\n')


def test_the_backend_links_are_routed_before_the_nodes_start():
    assert LINKS == (CLIENT_BROKER, BROKER_KAFKA, BROKER_REDIS)
    assert set(PREPARED_LINKS) == {BROKER_KAFKA, BROKER_REDIS} and CLIENT_BROKER not in PREPARED_LINKS
    slots = [FaultSlot("a", "link_latency", "kafka", 1.0, 2.0, {"link": BROKER_KAFKA}),
             FaultSlot("b", "link_timeout", "redis-all", 3.0, 4.0, {"link": BROKER_REDIS})]
    assert proxied_links(slots) == {BROKER_KAFKA, BROKER_REDIS}
    assert proxied_links(slots) & set(PREPARED_LINKS) == {BROKER_KAFKA, BROKER_REDIS}


def test_the_kafka_probe_sends_an_api_versions_v0_request():
    request = api_versions_request(7, "ab")
    assert request == bytes.fromhex("0000000c" "0012" "0000" "00000007" "0002") + b"ab"
    assert int.from_bytes(request[:4], "big") == len(request) - 4  # size-prefixed


def test_tansu_advertises_the_proxy_and_hands_it_out_as_bootstrap(tmp_path):
    from harness.local.tansu import TansuNode

    plain = TansuNode(tmp_path / "tansu", "127.0.0.5", 9092, tmp_path, None, "memory")
    proxied = TansuNode(tmp_path / "tansu", "127.0.0.5", 9092, tmp_path, None, "memory",
                        advertised=("127.0.0.5", 40001))

    def flag(node, name):
        return node.argv[node.argv.index(name) + 1]

    assert flag(proxied, "--listener-url") == "tcp://127.0.0.5:9092"
    assert flag(proxied, "--advertised-listener-url") == "tcp://127.0.0.5:40001"
    assert proxied.bootstrap == "127.0.0.5:40001"
    assert flag(plain, "--advertised-listener-url") == "tcp://127.0.0.5:9092" and plain.bootstrap == "127.0.0.5:9092"


def test_a_redis_node_announces_the_proxy_port_and_its_own_bus(tmp_path):
    from harness.local.redis_processes import RedisNode

    def config(**extra):
        return RedisNode("redis-5", "127.0.0.5", 6379, tmp_path / "redis-server", run_dir=tmp_path,
                         appendfsync="everysec", node_timeout_ms=1000, **extra)._config_text().splitlines()

    announced = config(announce_port=40002)
    assert "cluster-announce-port 40002" in announced and "cluster-announce-bus-port 16379" in announced
    assert not [line for line in config() if line.startswith("cluster-announce")]  # near miss: no proxy, nothing announced


def test_proxied_links_only_for_link_faults():
    slots = [FaultSlot("k", "process_kill", "kafka", 1.0, 2.0, {}),
             FaultSlot("l", "link_latency", "broker:1", 1.0, 2.0, {"link": CLIENT_BROKER})]
    assert proxied_links(slots) == {CLIENT_BROKER}
    assert proxied_links(slots[:1]) == set()  # near miss: no link fault, no proxy
    assert proxied_links([{"kind": "link_timeout", "params": {}}]) == {CLIENT_BROKER}


def test_expected_added_round_trip_counts_each_delayed_stream():
    both = build_fault(validate_spec(spec("link_latency", latency_ms=150)))
    one = build_fault(validate_spec(spec("link_latency", latency_ms=150, direction="downstream")))
    assert both.expected_added_ms() == 300 and one.expected_added_ms() == 150
    assert both.streams == ("upstream", "downstream") and one.streams == ("downstream",)
    assert build_fault(validate_spec(spec("link_timeout"))).expected_added_ms() == 0


def test_containers_provider_and_external_targets_refuse_link_faults():
    for kind in LINK_KINDS:
        assert not provider_supports("containers", kind) and provider_supports("local", kind)
        assert "toxiproxy" in PROVIDER_GAPS["containers"][kind]
        assert "broker -> Kafka, broker -> Redis" in PROVIDER_GAPS["containers"][kind]
        refusal = external_refusal(kind, ("broker:1",), [{}], (("mosquitto", "broker"),))
        assert "not routed" in refusal and "broker -> Redis" in refusal, refusal
    assert external_refusal("process_kill", ("broker:1",), [{}], (("mosquitto", "broker"),)) == ""


def test_toxic_parsing_as_toxiproxy():
    toxic = parse_toxic({"type": "latency", "attributes": {"latency": 100}})
    assert (toxic.name, toxic.stream, toxic.toxicity, toxic.attributes) == (
        "latency_downstream", "downstream", 1.0, {"latency": 100, "jitter": 0})
    updated = parse_toxic({"attributes": {"jitter": 5}}, existing=toxic)
    assert updated.attributes == {"latency": 100, "jitter": 5} and updated.name == toxic.name
    for body, words in [({"type": "slow"}, "invalid toxic type"), ({"type": "latency", "stream": "up"}, "stream"),
                        ({"type": "bandwidth", "attributes": {"latency": 1}}, "no attribute 'latency'"),
                        ({"type": "timeout", "attributes": {"timeout": -1}}, "non-negative"),
                        ({"type": "timeout", "toxicity": 2}, "toxicity")]:
        with pytest.raises(ApiError, match=words) as error:
            parse_toxic(body)
        assert error.value.status == 400


def test_endpoints_through_the_proxies():
    routed = {"api": "127.0.0.1:1", "links": {CLIENT_BROKER: {"broker-1": {"proxy": "p", "listen": "127.0.0.9:1883",
                                                                             "upstream": "127.0.0.4:1883"}}}}
    endpoints = [("127.0.0.4", 1883, "broker-1"), ("127.0.0.5", 1883, "broker-2")]
    assert proxied_endpoints(endpoints, routed) == [("127.0.0.9", 1883, "broker-1"), ("127.0.0.5", 1883, "broker-2")]
    assert proxied_endpoints(endpoints, None) == endpoints  # near miss: nothing routed, the nodes themselves


def probe(ping_ms, answered=True, ended=""):
    return {"address": "127.0.0.9:1883", "answered": answered, "connack_code": 0 if answered else None,
            "connect_ms": 1.0 if answered else None, "ping_ms": ping_ms, "ended": ended, "error": ""}


def test_latency_bites_only_with_at_least_half_the_expected_added_round_trip():
    latency = build_fault(validate_spec(spec("link_latency", latency_ms=100)))  # both ways: 200 ms expected
    bit = latency._bite_check("broker-1", probe([0.2, 0.3, 0.2]), probe([201.0, 199.5, 200.4]), 1.0)
    assert bit.ok and bit.observed["added_ms"] == 200.2 and bit.observed["expected_added_ms"] == 200.0
    missed = latency._bite_check("broker-1", probe([0.2, 0.3, 0.2]), probe([90.0, 95.0, 99.0]), 1.0)
    assert not missed.ok  # near miss: under half the expected
    unanswered = latency._bite_check("broker-1", probe([0.2]), probe([], answered=False, ended="silent"), 1.0)
    assert not unanswered.ok


def test_timeout_and_reset_checks_read_the_connections_fate():
    timeout = build_fault(validate_spec(spec("link_timeout")))
    assert timeout._bite_check("b", probe([0.2]), probe([], answered=False, ended="silent"), 1.0).ok
    assert not timeout._bite_check("b", probe([0.2]), probe([0.3]), 1.0).ok
    reset = build_fault(validate_spec(spec("link_reset_peer", timeout_ms=100)))
    assert reset._bite_check("b", probe([0.2]), probe([0.3], ended="reset"), 1.0).ok
    assert not reset._bite_check("b", probe([0.2]), probe([], answered=False, ended="silent"), 1.0).ok
