"""The [workload] MQTT 5 delivery options: validated at load (errors name the key), carried into the plan for the
MQTT 5 clients only, and invisible in the plan.json of a scenario that does not use them."""

from __future__ import annotations

import json

import pytest

from contracts.scenario import (
    ScenarioError,
    find_scenario,
    load_scenario,
    parse_scenario,
    scenario_from_mapping,
)
from properties.generate import make_plan
from properties.plan import Plan

BASE = """
[scenario]
name = "mqtt5-options"
duration_s = 3
[workload]
pairs = 4
rate_per_publisher = 2
protocol_mix = { mqtt311 = 1, mqtt5 = 1 }
"""
OPTIONS = """mqtt5_properties = true
subscription_identifiers = true
retain_as_published = true
receive_maximum = 2
maximum_packet_size = 300
"""


def test_the_options_reach_the_mqtt5_clients_of_the_plan_only():
    plan = make_plan(parse_scenario(BASE + OPTIONS), 3)
    subscribers = plan.subscribers()
    assert {c.protocol for c in subscribers} == {4, 5}, "seed 3 must give both versions"
    for index, client in enumerate(subscribers):
        [subscription] = client.subscriptions
        v5 = client.protocol == 5
        assert subscription.sub_id == (index + 1 if v5 else None)
        assert subscription.retain_as_published is v5
        assert (client.receive_maximum, client.maximum_packet_size) == ((2, 300) if v5 else (None, None))
    protocols = {c.client_id: c.protocol for c in plan.publishers()}
    assert {protocols[p.publisher] for p in plan.publishes if p.properties} == {5}
    assert all(p.properties for p in plan.publishes if protocols[p.publisher] == 5)
    assert Plan.from_json(plan.to_json()) == plan


def test_the_options_change_no_draw_of_the_plan():
    without, with_options = make_plan(parse_scenario(BASE), 5), make_plan(parse_scenario(BASE + OPTIONS), 5)
    assert [(p.offset_s, p.publisher, p.seq, p.qos) for p in without.publishes] == \
        [(p.offset_s, p.publisher, p.seq, p.qos) for p in with_options.publishes]
    assert without.subscriber_actions == with_options.subscriber_actions


def test_unused_options_leave_plan_json_as_before():
    """A scenario without them writes no key of theirs (plan.json byte-identical to one of an older Ordeal), and
    such a plan reads back with the defaults."""
    text = make_plan(load_scenario(find_scenario("p2p-expiry")), 1).to_json()
    for key in ("properties", "sub_id", "retain_as_published", "receive_maximum", "maximum_packet_size"):
        assert f'"{key}"' not in text
    data = json.loads(text)
    assert Plan.from_dict(data).to_json() == text
    assert not any(p.properties for p in Plan.from_dict(data).publishes)


def test_scenario_json_round_trip_keeps_the_options():
    scenario = parse_scenario(BASE + OPTIONS)
    again = scenario_from_mapping(scenario.to_dict())
    assert again.workload == scenario.workload
    plain = parse_scenario(BASE)
    assert scenario_from_mapping(plain.to_dict()).workload.receive_maximum is None  # null reads back as "not sent"


@pytest.mark.parametrize("extra, message", [
    ("receive_maximum = 0", r"\[workload\] receive_maximum = 0: must be >= 1 and <= 65535"),
    ("receive_maximum = 70000", r"\[workload\] receive_maximum = 70000: must be <= 65535"),
    ("maximum_packet_size = 0", r"\[workload\] maximum_packet_size = 0: must be >= 1"),
    ("maximum_packet_size = '1k'", r"\[workload\] maximum_packet_size = '1k': must be an integer"),
    ("mqtt5_properties = 1", r"\[workload\] mqtt5_properties = 1: must be true or false"),
    ("subscription_identifiers = 'yes'", r"\[workload\] subscription_identifiers = 'yes': must be true or false"),
])
def test_bad_values_name_the_key(extra, message):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(BASE + extra + "\n", source="s.toml")


@pytest.mark.parametrize("key", ["mqtt5_properties = true", "subscription_identifiers = true",
                                 "retain_as_published = true", "receive_maximum = 2", "maximum_packet_size = 300"])
def test_an_mqtt5_option_without_mqtt5_clients_is_refused(key):
    text = BASE.replace("protocol_mix = { mqtt311 = 1, mqtt5 = 1 }", "protocol_mix = { mqtt311 = 1 }")
    name = key.split(" =")[0]
    with pytest.raises(ScenarioError, match=rf"s.toml: \[workload\] {name} = .*only MQTT 5 clients send it"):
        parse_scenario(text + key + "\n", source="s.toml")
    if key.endswith("true"):  # the near miss: switched off, it needs no MQTT 5 client
        parse_scenario(text + key.replace("true", "false") + "\n", source="s.toml")


def test_the_shipped_mqtt5_scenarios_use_them():
    assert load_scenario(find_scenario("mqtt5-delivery")).workload.subscription_identifiers
    assert load_scenario(find_scenario("mqtt5-receive-maximum")).workload.receive_maximum == 2
    assert load_scenario(find_scenario("mqtt5-packet-size")).workload.maximum_packet_size == 160
    for name in ("p2p-smoke", "mosquitto-smoke"):
        workload = load_scenario(find_scenario(name)).workload
        assert workload.mqtt5_properties and workload.subscription_identifiers, name
