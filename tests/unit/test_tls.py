"""TLS listeners of a target as deployed: the [target.tls] keys (refused at load where they cannot apply, exit
3), scenario.json and its schema, the run's CA and server certificate (a chain that verifies for the target's
address, localhost and the server name, and for nothing else; checked by an in-memory TLS handshake, no
network), the files and placeholders the target gets, and the probes and clients that use them."""

from __future__ import annotations

import ipaddress
import json
import ssl
import stat
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from cryptography import x509
from support.scenarios import EXTERNAL, SCENARIO_SCHEMA

from contracts.exit_codes import EXIT_USAGE
from contracts.scenario import ScenarioError, parse_scenario, scenario_from_mapping
from contracts.tls import TlsSpec
from harness.tls import (
    ClientTls,
    certificate_names,
    client_tls,
    failure_words,
    is_lasting,
    make_certificates,
    tls_placeholders,
    write_target_tls,
)
from ordeal.cli import main

TLS_ON = "[target.tls]\nenabled = true\n"


def _load(extra: str, base: str = EXTERNAL):
    return parse_scenario(base + extra, source="x.toml")


def _refusal(extra: str, base: str = EXTERNAL) -> str:
    with pytest.raises(ScenarioError) as error:
        _load(extra, base)
    return str(error.value)


# -- the scenario keys ---------------------------------------------------------------------------------
def test_no_tls_table_means_plain_mqtt():
    scenario = _load("")
    assert scenario.target.tls == TlsSpec() and not scenario.target.tls.enabled
    assert scenario.to_dict()["target"]["tls"] == {"enabled": False, "server_name": "", "verify": True}


def test_the_tls_keys_are_written_to_scenario_json_and_read_back_the_same():
    scenario = _load('[target.tls]\nenabled = true\nserver_name = "mqtt.example.test"\nverify = false\n')
    assert scenario.target.tls == TlsSpec(enabled=True, server_name="mqtt.example.test", verify=False)
    written = scenario.to_dict()
    assert written["target"]["tls"] == {"enabled": True, "server_name": "mqtt.example.test", "verify": False}
    jsonschema.validate(written, SCENARIO_SCHEMA)
    assert scenario_from_mapping(json.loads(json.dumps(written)), source="scenario.json").target.tls == \
        scenario.target.tls


def test_verify_is_on_unless_switched_off():
    assert _load(TLS_ON).target.tls == TlsSpec(enabled=True, server_name="", verify=True)


@pytest.mark.parametrize("extra,message", [
    ('[target.tls]\nserver_name = "a.test"\n', "x.toml: [target.tls] enabled is required: true = every MQTT "
                                               "connection of the run uses TLS"),
    ('[target.tls]\nenabled = "yes"\n', "x.toml: [target.tls] enabled = 'yes': must be true or false"),
    (TLS_ON + "verify = 1\n", "x.toml: [target.tls] verify = 1: must be true or false"),
    (TLS_ON + 'ca_file = "/etc/ssl/ca.pem"\n', "x.toml: [target.tls] unknown key 'ca_file'; allowed keys: enabled, "
                                               "server_name, verify"),
    (TLS_ON + 'server_name = "not a name!"\n', "x.toml: [target.tls] server_name = 'not a name!': must be a host "
                                              "name (letters, digits, '-' and '.'"),
    (TLS_ON + 'server_name = "-bad.test"\n', "server_name = '-bad.test': must be a host name"),
    (TLS_ON + "server_name = 7\n", "x.toml: [target.tls] server_name = 7: must be a string"),
    ("tls = true\n", "x.toml: [target] tls = True: must be a table: [target.tls] with enabled = true"),
])
def test_bad_tls_keys_are_refused_naming_the_key_and_what_is_expected(extra, message):
    assert message in _refusal(extra)


@pytest.mark.parametrize("server_name", ["localhost", "mqtt.example.test", "broker-1.cluster.local.", "127.0.0.5",
                                         "::1"])
def test_host_names_and_addresses_are_server_names(server_name):
    assert _load(TLS_ON + f'server_name = "{server_name}"\n').target.tls.server_name == server_name


def test_the_reference_target_takes_no_tls():
    reference = '[scenario]\nname = "x"\nduration_s = 10\n[target]\nkind = "reference"\n'
    assert ('x.toml: [target] tls = \'...\': the reference broker serves plain MQTT; [target.tls] applies to an '
            'external target (kind = "external")') in _refusal(TLS_ON, reference)


@pytest.mark.parametrize("extra,key,placeholder", [
    ('config_file = "m.conf"\nconfig_text = "certfile {tls_cert}"\n', "config_text", "{tls_cert}"),
    ('[target.env]\nCA = "{tls_ca}"\n', "env.CA", "{tls_ca}"),
    ('[target.files]\n"k.conf" = "keyfile {tls_key}"\n', "files.k.conf", "{tls_key}"),
    ('stop = ["sh", "-c", "ls {tls_dir}"]\n', "stop", "{tls_dir}"),
])
def test_a_tls_placeholder_without_tls_is_refused_at_load_naming_the_key(extra, key, placeholder):
    message = _refusal(extra)
    assert message == (f"x.toml: [target] {key} = '{placeholder}': the TLS placeholders need [target.tls] enabled "
                       "= true (without it the run makes no certificates)")
    assert _load(extra + TLS_ON).target.tls.enabled  # with TLS the same keys load


def test_a_doubled_brace_is_a_literal_not_a_placeholder():
    assert not _load('config_file = "m.conf"\nconfig_text = "# {{tls_cert}} is not used"\n').target.tls.enabled


def test_a_refused_tls_scenario_exits_3(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(EXTERNAL + '[target.tls]\nenabled = "on"\n')
    result = CliRunner().invoke(main, ["plan", str(path), "--seed", "1"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "[target.tls] enabled = 'on': must be true or false" in result.output


# -- the run's certificates -----------------------------------------------------------------------------
def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> None:
    """A TLS handshake between the two contexts over memory buffers; raises the client's SSLError."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(to_client, to_server, server_hostname=server_hostname)
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    if name == "client":
                        raise
                    return  # the server gave up: the client's answer (its alert) is what failed
        server_in.write(to_server.read())
        to_client.write(server_out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory whose tls/ holds certificates for 127.0.0.3 and the name mqtt.example.test."""
    directory = tmp_path_factory.mktemp("run")
    write_target_tls(directory, TlsSpec(enabled=True, server_name="mqtt.example.test"), ["127.0.0.3"])
    return directory


def _server(run_dir: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(run_dir / "tls" / "server.pem", run_dir / "tls" / "server.key")
    return context


def test_the_certificate_names_the_hosts_localhost_and_the_server_name():
    assert certificate_names(["127.0.0.3", "127.0.0.4", "127.0.0.3"], "mqtt.test") == [
        "127.0.0.3", "127.0.0.4", "localhost", "mqtt.test"]
    made = make_certificates(certificate_names(["127.0.0.3"]))
    leaf = x509.load_pem_x509_certificates(made.chain_pem)[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.3")]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    ca = x509.load_pem_x509_certificate(made.ca_pem)
    assert leaf.issuer == ca.subject and ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


@pytest.mark.parametrize("name", ["127.0.0.3", "localhost", "mqtt.example.test"])
def test_the_chain_verifies_against_the_run_s_ca_for_each_of_its_names(run_dir, name):
    tls = client_tls(run_dir, TlsSpec(enabled=True))
    _handshake(_server(run_dir), tls.context(), name)


def test_the_chain_does_not_verify_for_another_address(run_dir):
    tls = client_tls(run_dir, TlsSpec(enabled=True))
    with pytest.raises(ssl.SSLCertVerificationError) as error:
        _handshake(_server(run_dir), tls.context(), "127.0.0.9")
    assert is_lasting(error.value)
    assert "certificate did not verify against the run's CA" in failure_words(error.value, tls)
    assert "127.0.0.9" in failure_words(error.value, tls)  # "IP address mismatch, ... not valid for '127.0.0.9'"


def test_another_ca_does_not_verify_the_chain_unless_verify_is_off(run_dir, tmp_path):
    other = tmp_path / "other"
    write_target_tls(other, TlsSpec(enabled=True), ["127.0.0.3"])
    strict = client_tls(other, TlsSpec(enabled=True))
    with pytest.raises(ssl.SSLCertVerificationError) as error:
        _handshake(_server(run_dir), strict.context(), "127.0.0.3")
    words = failure_words(error.value, strict)
    assert words.startswith(f"TLS: the broker's certificate did not verify against the run's CA {other}/tls/ca.pem: ")
    assert "[target.tls] server_name / verify" in words
    lenient = client_tls(other, TlsSpec(enabled=True, verify=False))
    _handshake(_server(run_dir), lenient.context(), "127.0.0.3")  # encrypted, not authenticated


def test_the_files_are_written_with_the_key_readable_by_its_owner_only(run_dir):
    tls = run_dir / "tls"
    assert sorted(p.name for p in tls.iterdir()) == ["ca.pem", "server.key", "server.pem"]
    assert stat.S_IMODE((tls / "server.key").stat().st_mode) == 0o600
    assert (tls / "ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" in (tls / "server.key").read_text()


def test_what_is_described_names_the_files_and_never_the_key(tmp_path):
    described = write_target_tls(tmp_path, TlsSpec(enabled=True, server_name="mqtt.test"), ["127.0.0.3"])
    key = (tmp_path / "tls" / "server.key").read_text()
    body = "".join(key.splitlines()[1:-1])
    assert described["names"] == ["127.0.0.3", "localhost", "mqtt.test"]
    assert described["key"] == str(tmp_path.resolve() / "tls" / "server.key")
    assert len(described["ca_sha256"].split(":")) == 32
    assert body[:40] not in json.dumps(described)


def test_nothing_is_made_without_tls(tmp_path):
    assert write_target_tls(tmp_path, TlsSpec(), ["127.0.0.1"]) is None
    assert not (tmp_path / "tls").exists()
    assert tls_placeholders(tmp_path, TlsSpec()) == {} and client_tls(tmp_path, TlsSpec()) is None


def test_the_placeholders_and_the_clients_name_the_run_s_files(tmp_path):
    spec = TlsSpec(enabled=True, server_name="mqtt.test")
    tls = tmp_path.resolve() / "tls"
    assert tls_placeholders(tmp_path, spec) == {"tls_dir": str(tls), "tls_ca": str(tls / "ca.pem"),
                                                "tls_cert": str(tls / "server.pem"), "tls_key": str(tls / "server.key")}
    client = client_tls(tmp_path, spec)
    assert client == ClientTls(ca_file=str(tls / "ca.pem"), server_name="mqtt.test", verify=True)
    assert client.server_hostname("127.0.0.3") == "mqtt.test"
    assert ClientTls(ca_file="x").server_hostname("127.0.0.3") == "127.0.0.3"


def test_a_missing_ca_file_says_so(tmp_path):
    from harness.tls import TlsError

    with pytest.raises(TlsError, match="the run's CA file .*ca.pem does not exist"):
        client_tls(tmp_path, TlsSpec(enabled=True)).context()


# -- the target, its probes and the clients ----------------------------------------------------------------
def _target(tmp_path: Path, extra: str):
    from harness.external_target import ExternalTarget
    from harness.history import HistoryRecorder

    text = EXTERNAL.replace('name = "mq"', 'name = "mq"\nhost = "127.0.0.3"\nport = 1').replace('"mosquitto"', '"sh"')
    scenario = parse_scenario(text + extra, source="x.toml")
    recorder = HistoryRecorder(tmp_path / "history", run_id="r", meta={})
    return ExternalTarget(scenario, tmp_path, recorder), recorder


def test_the_target_gets_its_certificates_and_placeholders_before_it_starts(tmp_path):
    target, recorder = _target(tmp_path, 'config_file = "m.conf"\nconfig_text = """\ncafile {tls_ca}\n'
                                         'certfile {tls_cert}\nkeyfile {tls_key}\n"""\n' + TLS_ON)
    try:
        target.prepare()
    finally:
        recorder.close()
    tls = tmp_path.resolve() / "tls"
    assert (tmp_path / "m.conf").read_text() == (f"cafile {tls}/ca.pem\ncertfile {tls}/server.pem\n"
                                                  f"keyfile {tls}/server.key\n")
    leaf = x509.load_pem_x509_certificates((tls / "server.pem").read_bytes())[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.3") in sans.get_values_for_type(x509.IPAddress)


def test_the_probes_speak_tls_and_a_lasting_tls_failure_ends_the_start_at_once(tmp_path, monkeypatch):
    from harness import mqtt_probe
    from harness.external_target import TargetError

    seen = []

    def answer(host, port, **kwargs):
        seen.append(kwargs["tls"])
        return mqtt_probe.ConnectResult(False, "TLS: the broker's certificate did not verify against the run's CA "
                                               "x: unable to get local issuer certificate", tls_failed=True)

    monkeypatch.setattr(mqtt_probe, "mqtt_connect", answer)
    target, recorder = _target(tmp_path, TLS_ON + 'server_name = "mqtt.test"\n')
    try:
        with pytest.raises(TargetError, match=r"^mq \(127\.0\.0\.3:1\): TLS: the broker's certificate did not "
                                              r"verify against the run's CA x: unable to get local issuer"):
            target._probe("127.0.0.3", 1, 4)
    finally:
        recorder.close()
    assert seen == [ClientTls(ca_file=str(tmp_path.resolve() / "tls" / "ca.pem"), server_name="mqtt.test")]


def test_a_failure_that_may_pass_only_keeps_the_target_not_ready(tmp_path, monkeypatch):
    from harness import mqtt_probe

    monkeypatch.setattr(mqtt_probe, "mqtt_connect", lambda *a, **k: mqtt_probe.ConnectResult(
        False, "TLS: the broker closed the connection during the TLS handshake"))
    target, recorder = _target(tmp_path, TLS_ON)
    try:
        assert target._probe("127.0.0.3", 1, 4).ok is False
    finally:
        recorder.close()
    assert not is_lasting(ssl.SSLEOFError()) and not is_lasting(ConnectionResetError())


def test_a_workload_client_with_tls_is_configured_before_it_connects(tmp_path):
    from paho.mqtt.enums import CallbackAPIVersion

    from harness.clients import NonBlockingConnectClient

    write_target_tls(tmp_path, TlsSpec(enabled=True), ["127.0.0.3"])
    client = NonBlockingConnectClient(CallbackAPIVersion.VERSION2, client_id="c")
    client.use_tls(client_tls(tmp_path, TlsSpec(enabled=True, server_name="mqtt.test")), "127.0.0.3")
    assert client._ssl and client.tls_server_name == "mqtt.test" and client._ssl_context.check_hostname
    sentinel = object()
    assert client._ssl_wrap_socket(sentinel) is sentinel  # wrapped on the loop once the TCP connect is done
    assert client._tls_handshaking and client.tls_error == ""
