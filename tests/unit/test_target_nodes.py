"""Clustered external targets in the scenario model: [[target.nodes]], [target.formation], the clients' home
nodes, and the one selector vocabulary (node:NAME, broker:N, broker-random, broker-minority, broker-majority,
broker-holding:CLIENT) checked at load and resolved against a running topology."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import jsonschema
import pytest
from support.scenarios import EXTERNAL, SCENARIO_SCHEMA

import faults.catalog  # noqa: F401  (registers the fault kinds)
from contracts.scenario import ScenarioError, parse_scenario, scenario_from_mapping
from contracts.target_nodes import majority_size, minority_size
from faults.base import FaultNotApplicable
from faults.network import drop_rules
from faults.selectors import resolve_group, resolve_node, resolve_nodes

THREE = """
[[target.nodes]]
name = "n1"
[[target.nodes]]
name = "n2"
[[target.nodes]]
name = "n3"
"""


def _load(nodes: str = THREE, extra: str = "", target: str = ""):
    return parse_scenario(EXTERNAL + target + "\n" + nodes + "\n" + extra, source="x.toml")


def _refused(nodes: str = THREE, extra: str = "", target: str = "") -> str:
    with pytest.raises(ScenarioError) as error:
        _load(nodes, extra, target)
    assert str(error.value).startswith("x.toml: "), error.value
    return str(error.value)


# -- declaring the nodes -----------------------------------------------------------------------------------

def test_a_single_node_target_is_one_node_named_like_the_target():
    scenario = parse_scenario(EXTERNAL, source="x.toml")
    (node,) = scenario.target.node_specs()
    assert (node.name, node.role, node.start) == ("mq", "broker", scenario.target.start)
    assert scenario.broker_nodes() == ("mq",) and not scenario.target.clustered
    assert "nodes" not in scenario.to_dict()["target"]


def test_nodes_inherit_the_target_s_keys_and_override_them():
    scenario = _load("""
[target.env]
SHARED = "a"
WHO = "target"
[[target.nodes]]
name = "db"
role = "service"
start = ["redis-server"]
port = 6400
[[target.nodes]]
name = "b1"
[target.nodes.env]
WHO = "b1"
[[target.nodes]]
name = "b2"
ready = "port"
ready_timeout_s = 99
""")
    db, b1, b2 = scenario.target.node_specs()
    assert (db.role, db.start, db.ready, db.port) == ("service", ("redis-server",), "port", 6400)
    assert b1.start == scenario.target.start and dict(b1.env) == {"SHARED": "a", "WHO": "b1"}
    assert (b2.ready, b2.ready_timeout_s, b1.ready, b1.ready_timeout_s) == ("port", 99.0, "mqtt", 10.0)
    assert scenario.broker_nodes() == ("b1", "b2")  # the service is no MQTT endpoint


def test_the_declared_nodes_read_back_from_scenario_json_unchanged_and_match_its_schema():
    scenario = _load(THREE.replace('name = "n2"', 'name = "n2"\nport = 1999\n[target.nodes.env]\nX = "y"'),
                     target='[target.formation]\nready = ["true"]\nholding = ["echo", "{client}"]',
                     extra='[workload]\nhome_node = "seeded"\n[workload.home_nodes]\ntest_pub_client_0_0 = "n2"\n')
    written = json.loads(json.dumps(scenario.to_dict()))
    jsonschema.validate(written, SCENARIO_SCHEMA)
    again = scenario_from_mapping(written, source="scenario.json")
    assert again.target == scenario.target and again.workload == scenario.workload


@pytest.mark.parametrize("nodes,needle", [
    (THREE.replace('"n2"', '"n1"'), "[[target.nodes]] #2 name = 'n1': duplicate node name (node #1 is also called that)"),
    ('[[target.nodes]]\nname = "a"\nhost = "127.0.0.5"\nport = 1883\n[[target.nodes]]\nname = "b"\n'
     'host = "127.0.0.5"\nport = 1883\n', "[[target.nodes]] #2 port = 1883: duplicate address 127.0.0.5:1883"),
    ('[[target.nodes]]\nname = "a b"\n', "[[target.nodes]] #1 name = 'a b': may only contain"),
    ('[[target.nodes]]\nport = 1\n', "[[target.nodes]] #1 name is required"),
    ('[[target.nodes]]\nname = "a"\nrole = "db"\n', "[[target.nodes]] #1 role = 'db': must be one of 'broker', 'service'"),
    ('[[target.nodes]]\nname = "a"\nrole = "service"\n', "no node has role \"broker\""),
    ('[[target.nodes]]\nname = "a"\nhost = "10.0.0.1"\n', "must be a loopback address"),
    ('[[target.nodes]]\nname = "a"\nspeed = 1\n', "[[target.nodes]] #1 unknown key 'speed'"),
])
def test_bad_nodes_are_refused_at_load_naming_the_node_and_key(nodes, needle):
    assert needle in _refused(nodes)


def test_a_target_with_nodes_takes_no_host_or_port_of_its_own():
    assert "gives each node its own host and port" in _refused(target='port = 1883')


def test_a_formation_needs_several_nodes_and_a_holding_command_names_the_client():
    assert "forms a cluster of several nodes" in _refused(
        '[[target.nodes]]\nname = "a"\n', target='[target.formation]\nready = ["true"]')
    assert "must name the client with {client}" in _refused(target='[target.formation]\nholding = ["true"]')
    assert "must be a list of argv lists" in _refused(target='[target.formation]\nsteps = ["true"]')


def test_the_containers_provider_refuses_a_clustered_target():
    assert "runs an external target as one container" in _refused(extra='[topology]\nprovider = "containers"\n')


# -- faults on the nodes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,needle", [
    ("[faults]\nmix = { process_kill = 1 }\ntargets = { process_kill = ['node:n4'] }\n",
     "targets.process_kill = 'node:n4': cannot apply to x.toml: [target] 'mq' (external): there is no node 'n4'; "
     "this target's nodes: node:n1, node:n2, node:n3 (brokers: broker:1..3)"),
    ("[faults]\nmix = { process_stop = 1 }\ntargets = { process_stop = ['broker:4'] }\n", "there is no broker:4"),
    ("[faults]\nmix = { net_partition = 1 }\nparams = { net_partition = { a = 'node:n1', b = 'node:x' } }\n",
     "params.net_partition.b = 'node:x': cannot apply"),
])
def test_a_selector_naming_no_node_is_refused_at_load(extra, needle):
    assert needle in _refused(extra=extra)


def test_a_partition_between_nodes_of_a_one_node_target_is_refused_at_load():
    with pytest.raises(ScenarioError) as error:
        parse_scenario(EXTERNAL + "[faults]\nmix = { net_partition = 1 }\nparams = { net_partition = { a = "
                       "'broker:1', b = 'broker' } }\n", source="x.toml")
    assert ("params.net_partition.a = 'broker:1': cannot apply to x.toml: [target] 'mq' (external): a partition "
            "between broker nodes needs at least two; this target has one node: node:mq") in str(error.value)
    with pytest.raises(ScenarioError) as error:
        parse_scenario(EXTERNAL + "[faults]\nmix = { process_kill = 1 }\ntargets = { process_kill = ['broker:2'] }\n",
                       source="x.toml")
    assert "there is no broker:2; this target has one node: node:mq" in str(error.value)


def test_cluster_faults_load_and_default_to_a_random_broker_node():
    scenario = _load(extra="[faults]\nmix = { process_kill = 1, process_pause = 1, net_partition = 1, "
                           "net_isolate = 1 }\ntargets = { process_pause = ['broker-minority'], net_isolate = "
                           "['broker-majority', 'broker-holding:test_sub_client_0_0'] }\n"
                           "params = { net_partition = { a = 'broker-minority', b = ['broker', "
                           "'-broker-minority'] } }\n")
    assert scenario.faults.targets_of("process_kill") == ("broker-random",)
    assert scenario.faults.targets_of("process_pause") == ("broker-minority",)


def test_minority_and_majority_sizes():
    assert [minority_size(n) for n in (1, 2, 3, 4, 5)] == [1, 1, 1, 1, 2]
    assert [majority_size(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def _topology(count: int = 3):
    brokers = [SimpleNamespace(name=f"n{i}", host=f"127.0.0.{i + 1}", role="mqtt-broker") for i in range(1, count + 1)]
    holding = {"c1": "n2"}
    return SimpleNamespace(brokers=brokers, redis_nodes=[], kafka=None, storage=None,
                           holding_node=lambda client: holding[client])


def test_set_selectors_resolve_to_seeded_minorities_and_majorities():
    topology = _topology(5)
    minority = resolve_nodes(topology, "broker-minority", random.Random(1))
    majority = resolve_nodes(topology, "broker-majority", random.Random(1))
    assert len(minority) == 2 and len(majority) == 3
    assert [n.name for n in resolve_nodes(topology, "broker-minority", random.Random(1))] == [n.name for n in minority]
    assert [n.name for n in resolve_nodes(topology, "broker:3", random.Random(1))] == ["n3"]
    with pytest.raises(FaultNotApplicable, match="names a set of nodes"):
        resolve_node(topology, "broker-majority", random.Random(1))


def test_broker_holding_asks_the_target_and_halves_are_complementary():
    topology = _topology(3)
    assert resolve_node(topology, "broker-holding:c1", random.Random(0)).name == "n2"
    cache: dict = {}
    rng = random.Random(7)
    a = resolve_group(topology, "broker-minority", rng, cache=cache)
    b = resolve_group(topology, ["broker", "-broker-minority"], rng, cache=cache)
    assert len(a) == 1 and len(b) == 2 and not set(a) & set(b)


def test_isolating_a_set_keeps_its_own_traffic():
    assert drop_rules("isolate", ["127.0.0.2"], [], None, "both") == [
        "ip saddr 127.0.0.2 ip daddr != 127.0.0.2 counter drop", "ip daddr 127.0.0.2 ip saddr != 127.0.0.2 counter drop"]
    assert drop_rules("isolate", ["127.0.0.3", "127.0.0.2"], [], None, "both")[0] == (
        "ip saddr { 127.0.0.2, 127.0.0.3 } ip daddr != { 127.0.0.2, 127.0.0.3 } counter drop")


# -- clients spread across the nodes --------------------------------------------------------------------------

def _plan(extra: str, seed: int = 3):
    from properties.generate import make_plan

    scenario = _load(extra="[workload]\npairs = 3\n" + extra)
    return scenario, make_plan(scenario, seed)


def test_home_nodes_round_robin_over_the_broker_nodes():
    _, plan = _plan("")
    assert [c.node for c in plan.clients] == [0, 1, 2, 0, 1, 2]


def test_home_nodes_fixed_per_client_and_seeded():
    _, plan = _plan('[workload.home_nodes]\ntest_sub_client_0_0 = "n3"\n')
    assert {c.client_id: c.node for c in plan.clients}["test_sub_client_0_0"] == 2
    scenario = _load(extra='[workload]\npairs = 8\nhome_node = "seeded"\n')
    from properties.generate import make_plan

    nodes = {c.node for c in make_plan(scenario, 5).clients}
    assert nodes <= {0, 1, 2} and len(nodes) > 1
    assert [c.node for c in make_plan(scenario, 5).clients] == [c.node for c in make_plan(scenario, 5).clients]


def test_reconnects_to_another_node_change_node():
    scenario = _load(extra="[workload]\npairs = 2\n[subscribers]\ndisconnects_per_minute = 30\n"
                           "reconnect_node = \"other\"\n")
    from properties.generate import make_plan

    plan = make_plan(scenario, 11)
    for client in plan.clients:
        connects = [a.node for a in plan.subscriber_actions if a.client_id == client.client_id and a.action == "connect"]
        assert all(a != b for a, b in zip(connects, connects[1:], strict=False)), connects


@pytest.mark.parametrize("extra,needle", [
    ('[workload.home_nodes]\ntest_sub_client_0_0 = "n9"\n',
     "[workload] home_nodes.test_sub_client_0_0 = 'n9': no broker node of that name; the broker nodes: n1, n2, n3"),
    ('[workload.home_nodes]\nnobody = "n1"\n', "[workload] home_nodes.nobody = 'n1': no client 'nobody' in this workload"),
    ('[workload]\nhome_node = "nearest"\n', "home_node = 'nearest': must be one of 'round-robin', 'seeded'"),
])
def test_bad_home_nodes_are_refused_at_load(extra, needle):
    assert needle in _refused(extra=extra)


def test_a_majorities_ring_of_five_cuts_the_five_non_neighbour_pairs_and_each_node_sees_a_majority():
    from faults.network import ring_cuts

    ring = [f"127.0.0.{i}" for i in range(2, 7)]
    cuts = ring_cuts(ring)
    assert len(cuts) == 5 and all(abs(ring.index(x) - ring.index(y)) in (2, 3) for x, y in cuts)
    seen = {node: {node} | {other for other in ring if (node, other) not in cuts and (other, node) not in cuts}
            for node in ring}
    assert all(len(view) == 3 for view in seen.values()) and len({frozenset(v) for v in seen.values()}) == 5
    assert ring_cuts(ring[:3]) == [] and len(ring_cuts([f"127.0.1.{i}" for i in range(7)])) == 7
    assert drop_rules("ring", ring, [], None, "both")[:2] == [
        "ip saddr 127.0.0.2 ip daddr 127.0.0.4 counter drop", "ip saddr 127.0.0.4 ip daddr 127.0.0.2 counter drop"]


def test_a_majorities_ring_on_three_nodes_is_refused_at_load_and_loads_on_five():
    assert "a majorities ring needs at least 5 broker nodes" in _refused(extra="[faults]\nmix = { net_partition_ring = 1 }\n")
    five = "".join(f'[[target.nodes]]\nname = "n{i}"\n' for i in range(1, 6))
    assert _load(five, "[faults]\nmix = { net_partition_ring = 1 }\n").faults.mix


def test_a_session_lost_across_nodes_names_both_nodes_and_its_twin_on_one_node_says_so():
    from spark_checkers.guarantees import Guarantees
    from spark_checkers.rules.catalog import explain
    from spark_checkers.timeline import build_timeline

    guarantees = Guarantees.from_scenario(json.loads(json.dumps(_load().to_dict())))

    def rows(second_node: str) -> list[dict]:
        common = {"client": "s", "protocol": 4, "clean_start": False, "detail": None}
        return [{**common, "kind": "connect", "seq": 1, "t_mono_us": 1_000_000, "node": "n1", "session_present": False},
                {**common, "kind": "disconnect", "seq": 2, "t_mono_us": 2_000_000, "node": "n1"},
                {**common, "kind": "connect", "seq": 3, "t_mono_us": 3_000_000, "node": second_node,
                 "session_present": False}]

    moved = build_timeline("r", rows("n2"), guarantees)
    (witness,) = moved.violations["durability.session_lost"]
    assert "s reconnected at 2.000 s on n2, its session last on n1 (offline since" in explain(
        "durability.session_lost", witness, moved)
    same = build_timeline("r", rows("n1"), guarantees)
    assert "on n1, the node its session was on" in explain("durability.session_lost",
                                                          same.violations["durability.session_lost"][0], same)


@pytest.mark.parametrize("persistence,killed,allowed", [
    ("none", "n2", True),          # a kill the cluster never promised to survive, on one of its nodes
    ("none", "n1+n3", True),       # ... on a minority of them
    ("kill", "n2", False),         # near-miss: the same loss where the cluster promised to survive a kill
])
def test_a_session_lost_to_a_kill_of_a_cluster_node_is_judged_by_the_cluster_s_promise(persistence, killed, allowed):
    from spark_checkers.guarantees import Guarantees
    from spark_checkers.timeline import build_timeline

    scenario = _load(target=f'persistence = "{persistence}"')
    guarantees = Guarantees.from_scenario(json.loads(json.dumps(scenario.to_dict())))
    common = {"client": "s", "protocol": 4, "clean_start": False, "detail": None}
    fault = {"kind": "fault_start", "fault_id": "f01", "fault_kind": "process_kill", "node": killed, "client": None,
             "detail": None}
    rows = [{**common, "kind": "connect", "seq": 1, "t_mono_us": 1_000_000, "node": "n2", "session_present": False},
            {**fault, "seq": 2, "t_mono_us": 1_900_000},
            {**fault, "kind": "fault_evidence", "seq": 3, "t_mono_us": 1_950_000, "bit": True},
            {**common, "kind": "disconnect", "seq": 4, "t_mono_us": 2_000_000, "node": "n2"},
            {**common, "kind": "connect", "seq": 5, "t_mono_us": 3_000_000, "node": "n1", "session_present": False}]
    timeline = build_timeline("r", rows, guarantees)
    assert bool(timeline.violations.get("durability.session_lost_allowed")) is allowed
    assert bool(timeline.violations.get("durability.session_lost")) is not allowed
