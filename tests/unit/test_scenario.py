"""Scenario loading: every shipped file loads; bad files give errors naming file, key, value and rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.scenario import (
    ScenarioError,
    default_scenarios_dir,
    find_scenario,
    load_scenario,
    parse_scenario,
    scenario_from_mapping,
)

SHIPPED = sorted(default_scenarios_dir().glob("*.toml"))

MINIMAL = """
[scenario]
name = "t"
duration_s = 1
"""


def test_the_required_scenarios_are_shipped():
    names = {p.stem for p in SHIPPED}
    assert {"p2p-smoke", "p2p-offline-backlog", "p2p-wraparound", "p2p-limit-trim", "p2p-expiry",
            "p2p-nightly", "mosquitto-smoke"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_load_and_round_trip(path: Path):
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    normalised = scenario.to_dict()
    json.dumps(normalised)  # JSON-able
    again = scenario_from_mapping(normalised, source=str(path))
    assert again.to_dict() == normalised


def test_defaults_are_filled_in():
    scenario = parse_scenario(MINIMAL, source="x.toml")
    d = scenario.to_dict()
    assert d["workload"]["payload_size"] == 62
    assert d["workload"]["qos_mix"] == {"qos1": 1.0}
    # the reference broker's promises come from its [broker] defaults (one source: BrokerConfig)
    assert d["target"] == {"kind": "reference", "promises": {
        "mqtt_versions": ["3.1.1", "5"], "queue_limit": 10000, "queue_policy": "drop_oldest",
        "persistence": "kill", "message_ttl_s": 604800,
        "features": {"will": True, "retained": True, "shared_subscriptions": "application clients"}}}
    assert d["scenario"]["drain_timeout_s"] == 60.0
    assert d["faults"]["mix"] == {}


@pytest.mark.parametrize("fsync, persistence", [("always", "power"), ("everysec", "kill"), ("no", "kill")])
def test_the_reference_broker_promises_a_power_loss_only_when_its_store_fsyncs_every_write(fsync, persistence):
    scenario = parse_scenario(MINIMAL + f'\n[topology]\nredis_appendfsync = "{fsync}"\n', source="x.toml")
    promises = scenario.to_dict()["target"]["promises"]
    assert promises["persistence"] == persistence
    again = scenario_from_mapping(scenario.to_dict(), source="x.json")  # scenario.json reads back as derived
    assert again.to_dict()["target"]["promises"] == promises


def test_wraparound_scenario_presets_near_the_wrap():
    assert load_scenario(find_scenario("p2p-wraparound")).workload.preset_last_packet_id > 65000


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, source="bad.toml")
    return str(info.value)


def test_unknown_key_is_named_with_the_allowed_ones():
    message = _error(MINIMAL + "\n[workload]\npairz = 3\n")
    assert message.startswith("bad.toml: [workload] unknown key 'pairz'; allowed keys:")
    assert "pairs" in message


def test_unknown_section():
    assert _error(MINIMAL + "\n[wrokload]\n") == (
        "bad.toml: unknown section [wrokload]; allowed sections: scenario, topology, target, broker, "
        "workload, subscribers, faults, checks")


def test_wrong_type_names_key_and_value():
    assert _error(MINIMAL + '\n[workload]\npairs = "3"\n') == "bad.toml: [workload] pairs = '3': must be an integer"


def test_impossible_values():
    assert _error(MINIMAL + "\n[workload]\npayload_size = 31\n") == (
        "bad.toml: [workload] payload_size = 31: must be >= 32 and <= 262144")
    assert _error(MINIMAL + "\n[workload]\npreset_last_packet_id = 65536\n") == (
        "bad.toml: [workload] preset_last_packet_id = 65536: must be <= 65535 and >= 0")
    assert _error(MINIMAL + "\n[scenario]\n".replace("[scenario]\n", "") + "[subscribers]\nabrupt_fraction = 1.5\n") \
        .endswith("abrupt_fraction = 1.5: must be <= 1.0 and >= 0.0")
    assert "must be >= drain_quiet_s" in _error(
        "[scenario]\nname='t'\nduration_s=1\ndrain_quiet_s=5\ndrain_timeout_s=2\n")
    assert _error("[scenario]\nname='t'\nduration_s=0\n") == "bad.toml: [scenario] duration_s = 0: must be > 0.0"


def test_choices_are_listed():
    assert _error("[scenario]\nname='t'\nduration_s=1\ntier='weekly'\n") == (
        "bad.toml: [scenario] tier = 'weekly': must be one of 'smoke', 'nightly', 'soak'")


def test_mixes_are_validated():
    assert "unknown QoS 'qos3'" in _error(MINIMAL + "\n[workload]\nqos_mix = { qos3 = 1 }\n")
    assert _error(MINIMAL + "\n[workload]\nqos_mix = { qos1 = 0 }\n").endswith(
        "needs at least one entry with a weight > 0")
    assert "message expiry needs MQTT 5 publishers" in _error(
        MINIMAL + '\n[workload]\nexpiry_mix = { "5" = 1 }\n')
    assert "keys must be \"none\" or a whole number" in _error(
        MINIMAL + '\n[workload]\nprotocol_mix = { mqtt5 = 1 }\nexpiry_mix = { soon = 1 }\n')


def test_fault_kinds_are_validated_against_the_registry():
    message = _error(MINIMAL + "\n[faults]\nmix = { redis_master_kill = 1 }\n")
    assert message.startswith("bad.toml: [faults] mix.redis_master_kill = 1: unknown fault kind")


def test_allowed_invariants_must_exist():
    message = _error(MINIMAL + "\n[checks]\nallowed = ['durability.lossy']\n")
    assert message.startswith("bad.toml: [checks] allowed = 'durability.lossy': unknown invariant id; known ids: ")
    assert "durability.lost" in message and "meta.checker_error" in message  # the valid choices, named


def test_external_target_rules():
    assert "needs the argv that starts it" in _error(MINIMAL + "\n[target]\nkind = 'external'\n")
    assert "must be a loopback address" in _error(
        MINIMAL + "\n[target]\nkind = 'external'\nhost = '10.0.0.1'\nstart = ['x']\n")
    assert "[broker] configures the local reference-broker topology only" in _error(
        MINIMAL + "\n[target]\nkind = 'external'\nstart = ['x']\n[broker]\nlimit = 3\n")
    # reference targets take no address: a stray key is a mistake, not a silent no-op
    assert "unknown key 'port'" in _error(MINIMAL + "\n[target]\nkind = 'reference'\nport = 1883\n")


def test_invalid_toml_and_missing_file(tmp_path: Path):
    assert _error("[scenario\n").startswith("bad.toml: not valid TOML:")
    with pytest.raises(ScenarioError, match="cannot read the scenario file"):
        load_scenario(tmp_path / "missing.toml")
    with pytest.raises(ScenarioError, match="no such scenario in .*; known: .*p2p-smoke"):
        find_scenario("p2p-smokey")


def test_topology_errors_name_the_key():
    message = _error(MINIMAL + "\n[topology]\nredis_masters = 2\n")
    assert message.startswith("bad.toml: [topology]")
    assert "redis_masters = 2" in message
    assert "broker_nodes = 0: the reference target needs at least 1 broker node" in _error(
        MINIMAL + "\n[topology]\nbroker_nodes = 0\n")


def _storage_kill(kind: str, target: str, storage: str | None) -> str:
    topology = f'\n[topology]\nkafka_storage = "{storage}"\n' if storage else ""
    return (MINIMAL + topology + f'\n[faults]\nmix = {{ {kind} = 1 }}\ntargets = {{ {kind} = ["{target}"] }}\n')


@pytest.mark.parametrize("kind", ["process_kill", "process_stop", "process_restart"])
@pytest.mark.parametrize("target", ["storage", "node:s3"])
def test_killing_the_in_memory_kafka_storage_is_refused_with_what_to_set(kind: str, target: str):
    message = _error(_storage_kill(kind, target, None))  # default storage: moto, in memory
    assert message.startswith("bad.toml: [faults]") and f"targets.{kind} = {target!r}" in message
    assert "loses the whole log" in message and 'kafka_storage = "s3rver"' in message


def test_storage_faults_that_keep_the_log_are_accepted():
    assert parse_scenario(_storage_kill("process_kill", "storage", "s3rver")).faults.targets_of("process_kill") == (
        "storage",)
    assert parse_scenario(_storage_kill("process_pause", "storage", None)).faults.mix  # memory kept while paused
    assert parse_scenario(_storage_kill("process_kill", "kafka", None)).faults.mix  # Tansu restarts on its bucket


def test_killing_tansu_on_its_memory_engine_is_refused():
    assert "kafka_storage = 'memory'" in _error(_storage_kill("process_kill", "kafka", "memory"))


def test_s3rver_with_two_broker_nodes_is_refused_on_load():
    message = _error(MINIMAL + '\n[topology]\nkafka_storage = "s3rver"\nbroker_nodes = 2\n')
    assert "bad.toml: [topology]" in message and "conditional writes" in message


def test_expiry_mixes_and_failure_path_keys_validate():
    # message expiry 0 is a valid interval (MQTT 5 §3.3.2.3.3); the range names it
    v5 = MINIMAL + "\n[workload]\nprotocol_mix = { mqtt5 = 1 }\n"
    scenario = parse_scenario(v5 + 'expiry_mix = { "0" = 1, none = 1 }\n')
    assert dict(scenario.workload.expiry_mix) == {None: 1.0, 0: 1.0}
    assert "a whole number of seconds 0..4294967295" in _error(v5 + 'expiry_mix = { "-1" = 1 }\n')
    # session expiry drawn per reconnect: 0, short, long; MQTT 5 subscribers only
    mixed = parse_scenario(v5 + '[subscribers]\nsession_expiry_mix = { "0" = 1, "2" = 2, "3600" = 1 }\n')
    assert mixed.subscribers.session_expiry_mix == ((0, 1.0), (2, 2.0), (3600, 1.0))
    assert mixed.to_dict()["subscribers"]["session_expiry_mix"] == {"0": 1.0, "2": 2.0, "3600": 1.0}
    assert scenario_from_mapping(mixed.to_dict()).subscribers == mixed.subscribers
    assert _error(MINIMAL + '[subscribers]\nsession_expiry_mix = { "2" = 1 }\n').endswith(
        "a session expiry interval needs MQTT 5 subscribers; give [workload] protocol_mix an mqtt5 weight > 0")
    assert _error(v5 + '[subscribers]\nsession_expiry_mix = { "soon" = 1 }\n') == (
        "bad.toml: [subscribers] session_expiry_mix.soon = 1.0: keys must be a whole number of seconds "
        "0..4294967295, e.g. \"0\", \"2\" or \"3600\"")
    assert _error(v5 + '[subscribers]\nsession_expiry_mix = { "2" = 0 }\n').endswith(
        "needs at least one entry with a weight > 0")
    # publishers reconnecting
    assert _error(MINIMAL + "[workload]\npublisher_disconnects_per_minute = -1\n") == (
        "bad.toml: [workload] publisher_disconnects_per_minute = -1: must be >= 0.0 and <= 600.0")
    assert "must satisfy 0.0 <= low <= high" in _error(MINIMAL + "[workload]\npublisher_offline_s = [2, 1]\n")
    # the preset at every offline window needs a preset value
    assert _error(MINIMAL + "[workload]\npreset_each_offline = true\n") == (
        "bad.toml: [workload] preset_each_offline = True: needs preset_last_packet_id > 0 (the value each offline "
        "window's session is preset to), e.g. preset_last_packet_id = 65500")
    assert _error(MINIMAL + "[workload]\npreset_each_offline = 1\npreset_last_packet_id = 9\n") == (
        "bad.toml: [workload] preset_each_offline = 1: must be true or false")


def test_a_scenario_json_written_before_the_declaration_named_its_features_reads_back():
    """Older run directories carry promises without "features": still the same declaration, not a mismatch."""
    stored = parse_scenario(MINIMAL).to_dict()
    del stored["target"]["promises"]["features"]
    again = scenario_from_mapping(stored, source="old/scenario.json")
    assert again.to_dict()["target"]["promises"]["features"]["shared_subscriptions"] == "application clients"
