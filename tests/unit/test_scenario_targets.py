"""External targets in the scenario model: what they promise, and faults / protocols that cannot apply to
them refused at load (never at run time after the broker started), naming fault, target and why."""

from __future__ import annotations

import pytest
from support.scenarios import EXTERNAL

from contracts.scenario import ScenarioError, parse_scenario


def _load(extra: str = "", target: str = ""):
    text = EXTERNAL + target + "\n" + extra  # target keys follow [target]'s start line
    return parse_scenario(text, source="x.toml")


@pytest.mark.parametrize("extra,needle", [
    ("[faults]\nmix = { redis_failover = 1 }\n",
     "mix.redis_failover: cannot apply to x.toml: [target] 'mq' (external): redis_failover needs the reference "
     "topology's Redis Cluster"),
    ("[faults]\nmix = { process_kill = 1 }\ntargets = { process_kill = ['redis-master-of:{subscriber}'] }\n",
     "targets.process_kill = 'redis-master-of:{subscriber}': cannot apply to x.toml: [target] 'mq' (external): "
     "it selects 'redis-master-of:{subscriber}', a node of the reference topology"),
    ("[faults]\nmix = { process_stop = 1 }\ntargets = { process_stop = ['node:kafka'] }\n",
     "there is no node 'kafka'; this target has one node: node:mq"),
    ("[faults]\nmix = { net_partition = 1 }\nparams = { net_partition = { a = 'client', b = 'redis' } }\n",
     "params.net_partition.b = 'redis': cannot apply to x.toml: [target] 'mq' (external): it has no redis nodes"),
])
def test_a_fault_that_cannot_apply_to_an_external_target_is_refused_at_load(extra, needle):
    with pytest.raises(ScenarioError) as error:
        _load(extra)
    assert needle in str(error.value)


def test_faults_that_apply_to_an_external_target_load_with_its_node_as_default():
    scenario = _load("[faults]\nmix = { process_kill = 1, process_pause = 1, net_isolate = 1, client_flap = 1, "
                     "net_partition = 1 }\nparams = { net_partition = { a = 'client', b = 'node:mq' } }\n")
    assert scenario.faults.targets_of("process_kill") == ("node:mq",)
    assert scenario.faults.targets_of("net_isolate") == ("node:mq",)
    assert scenario.faults.targets_of("client_flap") == ("{subscriber}",)


def test_mqtt5_to_a_311_only_target_is_refused_at_load_with_the_protocol_reason():
    with pytest.raises(ScenarioError) as error:
        _load("[workload]\nprotocol_mix = { mqtt311 = 1, mqtt5 = 1 }\n", target='mqtt_versions = ["3.1.1"]')
    assert "protocol_mix sends MQTT 5" in str(error.value) and "does not speak MQTT 5" in str(error.value)
    assert _load("[workload]\nprotocol_mix = { mqtt311 = 1, mqtt5 = 0 }\n", target='mqtt_versions = ["3.1.1"]')


def test_the_declaration_round_trips_and_no_reference_default_applies():
    bare = _load().to_dict()["target"]["promises"]
    assert bare == {"mqtt_versions": ["3.1.1", "5"], "queue_limit": None, "queue_policy": "none",
                    "persistence": "kill", "message_ttl_s": None}
    declared = _load(target='queue_limit = 100\nqueue_policy = "drop_newest"\npersistence = "graceful"')
    promises = declared.to_dict()["target"]["promises"]
    assert (promises["queue_limit"], promises["queue_policy"], promises["persistence"]) == (100, "drop_newest",
                                                                                            "graceful")
    from contracts.scenario import scenario_from_mapping

    assert scenario_from_mapping(declared.to_dict(), source="again").target == declared.target


@pytest.mark.parametrize("target,needle", [
    ("queue_limit = 100", "queue_limit and queue_policy go together"),
    ('queue_policy = "drop_oldest"', "queue_limit and queue_policy go together"),
    ('persistence = "sometimes"', "[target] persistence = 'sometimes': must be one of 'power', 'kill', 'graceful', 'none'"),
    ('mqtt_versions = ["4"]', "unknown MQTT version '4'"),
])
def test_bad_declarations_name_the_key(target, needle):
    with pytest.raises(ScenarioError) as error:
        _load(target=target)
    assert needle in str(error.value)


def test_several_config_files_and_environment_variables():
    scenario = _load(target='env = { HOME = "{data_dir}", RABBITMQ_NODENAME = "rabbit@localhost" }\n'
                            '[target.files]\n"a.conf" = "x {port}"\n"enabled_plugins" = "[rabbitmq_mqtt]."\n')
    assert dict(scenario.target.files) == {"a.conf": "x {port}", "enabled_plugins": "[rabbitmq_mqtt]."}
    assert dict(scenario.target.env)["RABBITMQ_NODENAME"] == "rabbit@localhost"
