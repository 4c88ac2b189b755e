"""Client credentials of a target as deployed: the [target.credentials] keys (shared and per client, literal
and from the environment), refused at load when a variable is missing (exit 3), never written in clear
(scenario.json and its schema), the probe's CONNECT bytes with a user name and password (MQTT 3.1.1 and 5
§3.1.2.8-9, §3.1.3.4-5), the CONNACK refusals in words, and a refusal ending the executor's loop."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from support.scenarios import EXTERNAL, SCENARIO_SCHEMA

from contracts.credentials import MASK, PROBE_CLIENT_ID
from contracts.history_schema import Kind
from contracts.scenario import (
    ScenarioError,
    default_scenarios_dir,
    load_scenario,
    parse_scenario,
    scenario_from_mapping,
)
from harness import connack
from harness.mqtt_probe import connect_packet
from ordeal.cli import main

SECRET = "s3cret-Ünïcode"


def _load(credentials: str):
    return parse_scenario(EXTERNAL + credentials, source="x.toml")


def _refusal(credentials: str) -> str:
    with pytest.raises(ScenarioError) as error:
        _load(credentials)
    return str(error.value)


# -- the scenario keys ---------------------------------------------------------------------------------
def test_no_credentials_means_anonymous_clients():
    scenario = _load("")
    assert not scenario.target.credentials
    assert scenario.target.credentials.for_client("test_sub_client_0_0") is None
    assert scenario.to_dict()["target"]["credentials"] == {}


def test_shared_literal_credentials_go_to_every_client_and_are_masked():
    scenario = _load(f'[target.credentials]\nusername = "ordeal"\npassword = "{SECRET}"\n')
    for client in ("test_pub_client_0_0", "test_sub_client_2_0", PROBE_CLIENT_ID):
        credential = scenario.target.credentials.for_client(client)
        assert (credential.username, credential.password) == ("ordeal", SECRET)
    assert scenario.to_dict()["target"]["credentials"] == {"username": "ordeal", "password": MASK}
    assert SECRET not in json.dumps(scenario.to_dict()) and SECRET not in repr(scenario)


def test_a_username_without_a_password_is_allowed():
    credential = _load('[target.credentials]\nusername = "device"\n').target.credentials.shared
    assert (credential.username, credential.password) == ("device", None)


def test_per_client_entries_take_the_first_match_and_others_fall_back_to_the_shared(monkeypatch):
    monkeypatch.setenv("SUB_PASSWORD", "from-env")
    scenario = _load('[target.credentials]\nusername = "shared"\npassword = "p0"\n'
                     '[[target.credentials.clients]]\nmatch = "test_sub_client_0_*"\nusername = "first"\n'
                     'password_env = "SUB_PASSWORD"\n'
                     '[[target.credentials.clients]]\nmatch = "test_sub_*"\nusername = "other-subs"\npassword = "p2"\n')
    credentials = scenario.target.credentials

    def user(client: str):
        credential = credentials.for_client(client)
        return credential.username, credential.password

    assert user("test_sub_client_0_0") == ("first", "from-env")
    assert user("test_sub_client_1_0") == ("other-subs", "p2")
    assert user("test_pub_client_0_0") == ("shared", "p0")
    assert scenario.to_dict()["target"]["credentials"] == {
        "username": "shared", "password": MASK,
        "clients": [{"match": "test_sub_client_0_*", "username": "first", "password_env": "SUB_PASSWORD"},
                    {"match": "test_sub_*", "username": "other-subs", "password": MASK}]}


def test_per_client_entries_alone_leave_unmatched_clients_anonymous():
    credentials = _load('[[target.credentials.clients]]\nmatch = "test_pub_*"\nusername = "pub"\n').target.credentials
    assert credentials.for_client("test_pub_client_0_0").username == "pub"
    assert credentials.for_client("test_sub_client_0_0") is None
    assert credentials.unmatched(["test_pub_client_0_0"]) == []
    assert credentials.unmatched(["test_sub_client_0_0"]) == ["test_pub_*"]


def test_credentials_from_the_environment_are_read_at_load_and_keep_the_variable_name(monkeypatch):
    monkeypatch.setenv("MQTT_USER", "env-user")
    monkeypatch.setenv("MQTT_PASSWORD", SECRET)
    scenario = _load('[target.credentials]\nusername_env = "MQTT_USER"\npassword_env = "MQTT_PASSWORD"\n')
    shared = scenario.target.credentials.shared
    assert (shared.username, shared.password) == ("env-user", SECRET)
    written = scenario.to_dict()
    assert written["target"]["credentials"] == {"username_env": "MQTT_USER", "password_env": "MQTT_PASSWORD"}
    assert SECRET not in json.dumps(written)
    # the target's commands get the variables with the values the clients use
    assert scenario.target.credentials.environment() == {"MQTT_USER": "env-user", "MQTT_PASSWORD": SECRET}
    again = scenario_from_mapping(written, source="scenario.json")
    assert again.target.credentials.shared.password == SECRET  # read from the variable again, not from the file


def test_a_default_is_used_only_when_the_variable_is_unset_and_is_masked(monkeypatch):
    text = '[target.credentials]\nusername = "u"\npassword_env = "MQTT_PW"\npassword_default = "fallback"\n'
    monkeypatch.delenv("MQTT_PW", raising=False)
    scenario = _load(text)
    assert scenario.target.credentials.shared.password == "fallback"
    assert scenario.target.credentials.environment() == {"MQTT_PW": "fallback"}
    assert scenario.to_dict()["target"]["credentials"]["password_default"] == MASK
    monkeypatch.setenv("MQTT_PW", "set")
    assert _load(text).target.credentials.shared.password == "set"


# -- refused at load ---------------------------------------------------------------------------------------
def test_a_missing_environment_variable_is_refused_naming_file_key_and_variable(monkeypatch):
    monkeypatch.delenv("MQTT_PASSWORD", raising=False)
    message = _refusal('[target.credentials]\nusername = "u"\npassword_env = "MQTT_PASSWORD"\n')
    assert message.startswith("x.toml: [target.credentials] password_env = 'MQTT_PASSWORD': the environment "
                              "variable MQTT_PASSWORD is not set"), message
    monkeypatch.setenv("MQTT_PASSWORD", "")  # near miss: set, even empty, is set
    assert _load('[target.credentials]\nusername = "u"\npassword_env = "MQTT_PASSWORD"\n')


def test_a_missing_variable_of_a_per_client_entry_names_the_entry(monkeypatch):
    monkeypatch.delenv("NO_SUCH_USER_VAR", raising=False)
    message = _refusal('[[target.credentials.clients]]\nmatch = "test_*"\nusername = "a"\n'
                       '[[target.credentials.clients]]\nmatch = "x*"\nusername_env = "NO_SUCH_USER_VAR"\n')
    assert "x.toml: [[target.credentials.clients]] #2 username_env = 'NO_SUCH_USER_VAR': the environment variable " \
           "NO_SUCH_USER_VAR is not set" in message


def test_plan_through_the_cli_exits_3_on_a_missing_variable_and_0_once_it_is_set(tmp_path, monkeypatch):
    path = tmp_path / "auth.toml"
    path.write_text(EXTERNAL + '[target.credentials]\nusername = "u"\npassword_env = "ORDEAL_TEST_MISSING_PW"\n')
    monkeypatch.delenv("ORDEAL_TEST_MISSING_PW", raising=False)
    result = CliRunner().invoke(main, ["plan", str(path), "--summary"])
    assert result.exit_code == 3, result.output
    assert "[target.credentials] password_env = 'ORDEAL_TEST_MISSING_PW'" in result.output
    assert "the environment variable ORDEAL_TEST_MISSING_PW is not set" in result.output
    monkeypatch.setenv("ORDEAL_TEST_MISSING_PW", "x")
    assert CliRunner().invoke(main, ["plan", str(path), "--summary"]).exit_code == 0


@pytest.mark.parametrize("credentials,needle", [
    ('[target.credentials]\nusername = "u"\npasword = "x"\n', "[target.credentials] unknown key 'pasword'"),
    ('[target.credentials]\npassword = "x"\n', "[target.credentials] needs a user name"),
    ('[target.credentials]\nusername = "u"\npassword = "x"\npassword_env = "P"\n',
     "[target.credentials] password = '***': give password or password_env, not both"),
    ('[target.credentials]\nusername = "u"\npassword_default = "x"\n',
     "[target.credentials] password_default = '***': is the value used when password_env's variable is not set"),
    ('[target.credentials]\nusername = ""\n', "[target.credentials] username = '': must be a non-empty string"),
    ('[target.credentials]\nusername = "u"\npassword = 7\n', "[target.credentials] password = '***': must be a string"),
    ('[target.credentials]\nusername_env = "9X"\n', "username_env = '9X': must be an environment variable's name"),
    ('[[target.credentials.clients]]\nusername = "u"\n', "[[target.credentials.clients]] #1 match is required"),
    ('[[target.credentials.clients]]\nmatch = "a*"\nusername = "u"\n[[target.credentials.clients]]\nmatch = "a*"\n'
     'username = "v"\n', "clients = ['a*']: each match pattern may appear once"),
    ('[target.credentials]\nusername = "u"\nmatch = "a*"\n', "[target.credentials] unknown key 'match'"),
    ('[target]\ncredentials = "u:x"\n', "[target] credentials = '...': must be a table"),
])
def test_bad_credentials_are_refused_naming_the_key_and_never_the_password(credentials, needle):
    if credentials.startswith("[target]\n"):  # the key given on [target] itself
        text = EXTERNAL + credentials.removeprefix("[target]\n")
        with pytest.raises(ScenarioError) as error:
            parse_scenario(text, source="x.toml")
        message = str(error.value)
    else:
        message = _refusal(credentials)
    assert needle in message, message
    assert "'x'" not in message  # a password's value is never shown


def test_the_reference_target_takes_no_credentials_it_accepts_anonymous_clients():
    text = '[scenario]\nname = "r"\nduration_s = 5\n[target]\nkind = "reference"\n[target.credentials]\nusername = "u"\n'
    with pytest.raises(ScenarioError, match=r"\[target\] credentials = '...': the reference broker accepts anonymous"):
        parse_scenario(text, source="r.toml")


# -- what is written ----------------------------------------------------------------------------------------
def test_scenario_json_with_credentials_matches_its_schema_and_a_clear_password_does_not(monkeypatch):
    monkeypatch.setenv("SUB_PASSWORD", SECRET)
    scenario = _load(f'[target.credentials]\nusername = "u"\npassword = "{SECRET}"\n'
                     '[[target.credentials.clients]]\nmatch = "test_sub_*"\nusername = "s"\npassword_env = "SUB_PASSWORD"\n')
    document = json.loads(json.dumps(scenario.to_dict()))
    jsonschema.validate(document, SCENARIO_SCHEMA)
    leaked = json.loads(json.dumps(document))
    leaked["target"]["credentials"]["password"] = SECRET
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(leaked, SCENARIO_SCHEMA)
    leaked = json.loads(json.dumps(document))
    leaked["target"]["credentials"]["clients"][0]["password"] = SECRET
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(leaked, SCENARIO_SCHEMA)


def test_the_shipped_auth_scenario_reads_its_password_from_the_environment(monkeypatch):
    monkeypatch.setenv("ORDEAL_MQTT_PASSWORD", SECRET)
    monkeypatch.delenv("ORDEAL_MQTT_USERNAME", raising=False)
    scenario = load_scenario(default_scenarios_dir() / "mosquitto-auth.toml")
    shared = scenario.target.credentials.shared
    assert (shared.username, shared.password) == ("ordeal", SECRET)
    assert scenario.target.credentials.environment() == {"ORDEAL_MQTT_USERNAME": "ordeal",
                                                         "ORDEAL_MQTT_PASSWORD": SECRET}
    assert SECRET not in json.dumps(scenario.to_dict())
    assert "allow_anonymous false" in scenario.target.config_text
    assert scenario.log_preset == "mosquitto"


def test_a_per_client_pattern_that_fits_no_client_of_the_plan_is_a_plan_note():
    from properties.generate import make_plan, plan_notes

    scenario = _load('[[target.credentials.clients]]\nmatch = "test_sub_client_9*"\nusername = "u"\n'
                     '[[target.credentials.clients]]\nmatch = "test_sub_*"\nusername = "v"\n')
    notes = plan_notes(scenario, make_plan(scenario, 1))
    assert len(notes) == 1 and "match = 'test_sub_client_9*' fits no client of the plan" in notes[0]


# -- the CONNECT packet --------------------------------------------------------------------------------------
def test_connect_packet_311_carries_user_name_and_password_after_the_client_id():
    packet = connect_packet(4, "c", "u", "pw")
    assert packet == bytes.fromhex("1014" "00044d515454" "04" "c2" "003c" "000163" "000175" "00027077")
    # flags: user name (bit 7), password (bit 6), clean session (bit 1) [MQTT-3.1.2-18/-19, -21]


def test_connect_packet_5_carries_them_after_the_empty_properties():
    packet = connect_packet(5, "c", "u", "pw")
    assert packet == bytes.fromhex("1015" "00044d515454" "05" "c2" "003c" "00" "000163" "000175" "00027077")


def test_connect_packet_without_credentials_and_with_a_user_name_only():
    assert connect_packet(4, "c") == bytes.fromhex("100d" "00044d515454" "04" "02" "003c" "000163")
    assert connect_packet(5, "c", "ü") == bytes.fromhex("1012" "00044d515454" "05" "82" "003c" "00" "000163"
                                                        "0002c3bc")
    with pytest.raises(ValueError, match="a password needs a user name"):
        connect_packet(4, "c", None, "pw")


# -- CONNACK refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("level,code,text,auth", [
    (4, 5, "not authorized (CONNACK 5)", True),
    (4, 4, "bad user name or password (CONNACK 4)", True),
    (4, 3, "server unavailable (CONNACK 3)", False),
    (5, 0x87, "not authorized (CONNACK 0x87)", True),
    (5, 0x86, "bad user name or password (CONNACK 0x86)", True),
    (5, 0x8C, "bad authentication method (CONNACK 0x8C)", True),
    (5, 0x88, "server unavailable (CONNACK 0x88)", False),
    (5, 0x8A, "banned (CONNACK 0x8A)", False),
])
def test_connack_codes_in_words_and_which_refuse_the_credentials(level, code, text, auth):
    assert connack.words(level, code) == text
    assert connack.is_auth_refusal(level, code) is auth


def test_paho_s_311_reason_codes_are_mapped_back_to_the_return_code_on_the_wire():
    refused = ReasonCode(PacketTypes.CONNACK, "Not authorized")
    assert connack.wire_code(4, refused.getName(), refused.value) == 5
    assert connack.wire_code(5, refused.getName(), refused.value) == 0x87


def _session(tmp_path: Path, credential=None, protocol: int = 4):
    from harness.clients import ClientSession, Counters, NonBlockingConnectClient, SelectorLoop
    from harness.history import HistoryRecorder
    from properties.plan import SUBSCRIBER, ClientPlan

    recorder = HistoryRecorder(tmp_path / "history", run_id="r", meta={})
    plan = ClientPlan(client_id="test_sub_client_0_0", role=SUBSCRIBER, protocol=protocol, node=0)
    refusals: list[str] = []
    session = ClientSession(plan=plan, recorder=recorder, loop=SelectorLoop(), counters=Counters(),
                            address_of=lambda node: ("127.0.0.1", 1, "mosquitto"), publisher_names={},
                            credential=credential)
    session.on_refused = refusals.append
    session.node_name = "mosquitto"
    session.paho = NonBlockingConnectClient(CallbackAPIVersion.VERSION2, client_id=plan.client_id)
    return session, recorder, refusals


@pytest.mark.parametrize("protocol,code_text,wire", [(4, "not authorized (CONNACK 5)", 5),
                                                     (5, "not authorized (CONNACK 0x87)", 0x87)])
def test_a_refused_connack_is_recorded_in_words_and_reported_to_the_executor(tmp_path, monkeypatch, protocol,
                                                                              code_text, wire):
    import harness.clients
    from contracts.credentials import Credential
    from harness.history import read_history

    def no_cut(client):  # a cut inside paho's CONNACK handling re-entered loop_read and deadlocked
        raise AssertionError("the refused connection must be left to paho, which closes it")

    monkeypatch.setattr(harness.clients, "_cut", no_cut)
    session, recorder, refusals = _session(tmp_path, Credential(username="ordeal", password=SECRET), protocol)
    session._on_connect(session.paho, None, None, ReasonCode(PacketTypes.CONNACK, "Not authorized"), None)
    recorder.close()
    [row] = [r for r in read_history(tmp_path / "history").to_pylist() if r["kind"] == Kind.CONNECT_FAIL]
    assert row["reason_code"] == wire and json.loads(row["detail"])["error"] == f"CONNACK refused: {code_text}"
    assert refusals == [
        f"the broker (mosquitto) refused the CONNECT of test_sub_client_0_0: {code_text}; the MQTT "
        f"{'5' if protocol == 5 else '3.1.1'} client sent user name 'ordeal' and a password ([target.credentials], "
        "docs/scenarios.md \"Client credentials\")"]
    assert SECRET not in refusals[0]


def test_a_refusal_that_is_not_about_credentials_is_not_reported(tmp_path):
    session, recorder, refusals = _session(tmp_path)
    session._on_connect(session.paho, None, None, ReasonCode(PacketTypes.CONNACK, "Server unavailable"), None)
    recorder.close()
    assert refusals == []


def test_an_anonymous_refusal_says_no_credentials_were_sent(tmp_path):
    session, recorder, refusals = _session(tmp_path)
    session._on_connect(session.paho, None, None, ReasonCode(PacketTypes.CONNACK, "Bad user name or password"), None)
    recorder.close()
    assert "bad user name or password (CONNACK 4); the MQTT 3.1.1 client sent no credentials (anonymous)" in refusals[0]


def test_the_executor_s_loop_ends_once_on_a_refusal(tmp_path):
    from harness.executor import CredentialsRefused, Executor
    from harness.history import HistoryRecorder
    from properties.generate import make_plan

    scenario = _load('[target.credentials]\nusername = "u"\npassword = "p"\n')
    recorder = HistoryRecorder(tmp_path / "history", run_id="r", meta={})
    executor = Executor(make_plan(scenario, 1), [("127.0.0.1", 1, "mq")], recorder,
                        credentials=scenario.target.credentials)
    try:
        assert all(s.credential.username == "u" for s in executor.sessions.values())
        executor._pump(time.monotonic() + 0.01)  # nothing refused: the loop runs on
        executor._refused("the broker (mq) refused the CONNECT of test_sub_client_0_0: not authorized (CONNACK 5)")
        executor._refused("a later refusal is not the news")
        with pytest.raises(CredentialsRefused, match=r"test_sub_client_0_0: not authorized \(CONNACK 5\)"):
            executor._pump(time.monotonic() + 0.01)
        executor._pump(time.monotonic() + 0.01)  # the teardown's loop turns go on
    finally:
        executor.loop.close()
        recorder.close()


# -- the target's own probes -------------------------------------------------------------------------------
def _target(tmp_path: Path, credentials: str):
    from harness.external_target import ExternalTarget
    from harness.history import HistoryRecorder

    scenario = parse_scenario(EXTERNAL.replace('name = "mq"', 'name = "mq"\nhost = "127.0.0.1"\nport = 1')
                              + credentials, source="x.toml")
    recorder = HistoryRecorder(tmp_path / "history", run_id="r", meta={})
    return ExternalTarget(scenario, tmp_path, recorder), recorder


def test_the_readiness_and_protocol_probes_send_the_probe_s_credentials(tmp_path, monkeypatch):
    from harness import mqtt_probe

    sent = []

    def answer(host, port, *, level, timeout_s, client_id, username, password, tls):
        assert tls is None  # no [target.tls]: plain MQTT
        sent.append((level, client_id, username, password))
        return mqtt_probe.ConnectResult(True, "CONNACK 0", code=0)

    monkeypatch.setattr(mqtt_probe, "mqtt_connect", answer)
    target, recorder = _target(tmp_path, '[target.credentials]\nusername = "u"\npassword = "p"\n'
                                         '[[target.credentials.clients]]\nmatch = "ordeal-*"\nusername = "probe"\n')
    try:
        assert target._ready(type("Node", (), {"host": "127.0.0.1", "port": 1})())
        target.check_protocols()
    finally:
        recorder.close()
    assert sent == [(4, PROBE_CLIENT_ID, "probe", None)] * 2  # the workload here sends MQTT 3.1.1 only


@pytest.mark.parametrize("level,code,words", [(4, 5, "not authorized (CONNACK 5)"),
                                              (5, 0x86, "bad user name or password (CONNACK 0x86)")])
def test_a_probe_refused_for_its_credentials_ends_the_start_at_once_naming_the_refusal(tmp_path, monkeypatch,
                                                                                      level, code, words):
    from harness import mqtt_probe
    from harness.external_target import TargetError

    monkeypatch.setattr(mqtt_probe, "mqtt_connect", lambda *a, **k: mqtt_probe.ConnectResult(
        False, words, code=code, refused_credentials=True))
    target, recorder = _target(tmp_path, "" if level == 4 else '[target.credentials]\nusername = "u"\npassword = "p"\n')
    node = type("Node", (), {"host": "127.0.0.1", "port": 1})()
    try:
        if level == 4:
            with pytest.raises(TargetError, match=r"^mq refused the CONNECT of ordeal-probe: not authorized "
                                                  r"\(CONNACK 5\); the MQTT 3.1.1 client sent no credentials"):
                target._ready(node)
        else:
            target.spec = dataclasses.replace(target.spec, mqtt_versions=("5",))
            with pytest.raises(TargetError, match=r"ordeal-probe: bad user name or password \(CONNACK 0x86\); "
                                                  r"the MQTT 5 client sent user name 'u' and a password"):
                target._ready(node)
    finally:
        recorder.close()


def test_a_probe_refused_for_another_reason_only_keeps_the_target_not_ready(tmp_path, monkeypatch):
    from harness import mqtt_probe

    monkeypatch.setattr(mqtt_probe, "mqtt_connect", lambda *a, **k: mqtt_probe.ConnectResult(
        False, "server unavailable (CONNACK 3)", code=3))
    target, recorder = _target(tmp_path, "")
    try:
        assert target._ready(type("Node", (), {"host": "127.0.0.1", "port": 1})()) is False
    finally:
        recorder.close()
