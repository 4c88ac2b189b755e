"""A broker that listens only with TLS, tested as deployed: the shipped scenarios/mosquitto-tls.toml (Debian's
Mosquitto, ``listener`` + ``cafile`` / ``certfile`` / ``keyfile`` from the run's own CA) passes a smoke run over
TLS and writes the server's key nowhere but ``tls/server.key``; the same broker with clients that do not speak
TLS, or that verify it against another CA than the one its certificate comes from, ends unknown (exit 2)
naming the TLS failure.  The workload clients' handshake on the shared selector loop: verified, refused for
another CA, and not spinning while a broker never answers it.  Everything on 127.0.0.1.  A missing Mosquitto
fails under CI=true (tests/support/capabilities.py)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.capabilities import missing_capability
from support.dirs import searchable_tmp
from support.mosquitto import free_port, running_mosquitto

from contracts.exit_codes import EXIT_PASS, EXIT_UNKNOWN
from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from contracts.tls import TlsSpec
from harness.history import HistoryRecorder, read_history
from harness.run import SilentReporter, run_scenario
from harness.tls import client_tls, make_certificates, write_target_tls

pytestmark = [pytest.mark.integration]

TLS_TABLE = """[target.tls]                  # the only listener speaks TLS: so does every MQTT connection of the run
enabled = true
"""


class Messages(SilentReporter):
    """What `ordeal run` would print: the run's messages (the outcome among them)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def _owner() -> str:
    """The user Mosquitto drops root to (it reads its certificates after that), when run as root."""
    if os.geteuid() != 0:
        return ""
    try:
        return pwd.getpwnam("mosquitto").pw_name
    except KeyError:
        return ""


@pytest.fixture
def base():
    """A directory Mosquitto can reach after it drops root (pytest's own tmp is 0700)."""
    if shutil.which("mosquitto") is None:
        missing_capability("mosquitto not installed: run scripts/bootstrap.sh (as root it installs the mosquitto "
                           "package with apt-get)")
    with searchable_tmp("ordeal-tls-") as directory:
        yield directory


@pytest.fixture
def runs(base):
    out = base / "runs"
    out.mkdir()
    out.chmod(0o755)
    text = find_scenario("mosquitto-tls").read_text()
    assert TLS_TABLE in text and "certfile {tls_cert}" in text  # the copies below edit these
    return out, text


def _alien_files(base: Path) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 that are not the run's (readable by Mosquitto's user)."""
    alien = base / "alien"
    alien.mkdir()
    alien.chmod(0o755)
    made = make_certificates(["127.0.0.1", "localhost"])
    files = {"{tls_ca}": made.ca_pem, "{tls_cert}": made.chain_pem, "{tls_key}": made.key_pem}
    paths = {}
    for placeholder, pem in files.items():
        path = alien / placeholder.strip("{}")
        path.write_bytes(pem)
        path.chmod(0o644)
        paths[placeholder] = str(path)
    return paths


@pytest.mark.spark
@pytest.mark.timeout(900)  # a run, then the check on the shared Spark Connect server (a JVM start when cold)
def test_mosquitto_with_a_tls_only_listener_passes_a_smoke_run_over_tls(runs):
    from ordeal.pipeline import run as run_and_check

    out, _text = runs
    result = run_and_check(find_scenario("mosquitto-tls"), 1, out, print_table=False)
    assert result.exit_code == EXIT_PASS, (result.summary.get("error"), result.summary.get("check"))
    rows = read_history(result.run_dir / "history").to_pylist()
    connects = [r for r in rows if r["kind"] == Kind.CONNECT]
    assert {r["protocol"] for r in connects} == {4, 5}, "both MQTT versions connected over TLS"
    assert not [r for r in rows if r["kind"] == Kind.CONNECT_FAIL]
    assert result.summary["counts"]["delivered"] > 0
    scenario_json = json.loads((result.run_dir / "scenario.json").read_text())
    assert scenario_json["target"]["tls"] == {"enabled": True, "server_name": "", "verify": True}
    tls = result.run_dir / "tls"
    config = (result.run_dir / "mosquitto.conf").read_text()
    assert f"certfile {tls / 'server.pem'}" in config and f"keyfile {tls / 'server.key'}" in config
    # the broker served only TLS: a plain CONNECT to its port gets no CONNACK
    key_body = "".join((tls / "server.key").read_text().splitlines()[1:-1]).encode()
    leaks = [str(path.relative_to(result.run_dir)) for path in result.run_dir.rglob("*")
             if path.is_file() and path.name != "server.key" and key_body[:48] in path.read_bytes()]
    assert leaks == [], f"the server's private key is written into {leaks}"


def test_clients_that_do_not_speak_tls_end_the_run_unknown_naming_the_tls_listener(runs, base):
    out, text = runs
    plain_text = text.replace(TLS_TABLE, "[target.tls]\nenabled = false\n")
    for placeholder, path in _alien_files(base).items():  # the broker keeps a TLS listener of its own
        plain_text = plain_text.replace(placeholder, path)
    plain = base / "mosquitto-tls-plain.toml"
    plain.write_text(plain_text)
    messages = Messages()
    result = run_scenario(plain, 1, out, check=False, reporter=messages)
    assert result.exit_code == EXIT_UNKNOWN
    error = result.summary["error"]
    assert "TargetError: mosquitto (127.0.0.1:" in error, error
    assert ("the broker closed the connection without a CONNACK to an MQTT 3.1.1 CONNECT, and the port completes "
            "a TLS handshake: it is a TLS listener and the clients speak plain MQTT to it (set [target.tls] "
            "enabled = true") in error, error
    assert any("it is a TLS listener and the clients speak plain MQTT" in line for line in messages.lines)
    assert result.summary["counts"]["connects"] == 0 and result.summary["counts"]["published"] == 0


def test_a_broker_certificate_from_another_ca_ends_the_run_unknown_naming_the_verification(runs, base):
    out, text = runs
    alien = _alien_files(base)
    wrong_text = text.replace("{tls_cert}", alien["{tls_cert}"]).replace("{tls_key}", alien["{tls_key}"])
    wrong = base / "mosquitto-tls-wrong-ca.toml"
    wrong.write_text(wrong_text)
    result = run_scenario(wrong, 1, out, check=False)
    assert result.exit_code == EXIT_UNKNOWN
    error = result.summary["error"]
    assert (f"TLS: the broker's certificate did not verify against the run's CA {result.run_dir / 'tls' / 'ca.pem'}: "
            "unable to get local issuer certificate") in error, error
    assert "[target.tls] server_name / verify" in error
    assert "alert unknown ca" in (result.run_dir / "logs" / "mosquitto.log").read_text()  # the client said why
    assert result.summary["counts"]["connects"] == 0


# -- the workload clients' handshake on the selector loop ------------------------------------------------------
@pytest.fixture
def mosquitto(base):
    """A Mosquitto of the test's own with a TLS-only listener on 127.0.0.1, from the run's certificates."""

    write_target_tls(base, TlsSpec(enabled=True), ["127.0.0.1"], owner=_owner())
    tls = client_tls(base, TlsSpec(enabled=True))
    port = free_port()
    config = base / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\ncafile {tls.ca_file}\ncertfile {base}/tls/server.pem\n"
                      f"keyfile {base}/tls/server.key\nallow_anonymous true\nlog_dest stdout\n")
    with running_mosquitto(config, port, tls=tls):
        yield port, tls


def _session(tmp_path: Path, port: int, tls, client_id: str = "test_sub_client_0_0"):
    from harness.clients import ClientSession, Counters, SelectorLoop
    from properties.plan import SUBSCRIBER, ClientPlan, Subscription

    loop = SelectorLoop()
    recorder = HistoryRecorder(tmp_path / client_id, run_id="tls", meta={})
    plan = ClientPlan(client_id=client_id, role=SUBSCRIBER, protocol=5, node=0,
                      subscriptions=(Subscription("ordeal/tls/#", 1),), persistent=True, session_expiry_s=60)
    session = ClientSession(plan=plan, recorder=recorder, loop=loop, counters=Counters(),
                            address_of=lambda _node: ("127.0.0.1", port, "mosquitto"), publisher_names={}, tls=tls)
    return session, loop, recorder


def _pump(loop, until, timeout: float = 10.0) -> int:
    deadline, events = time.monotonic() + timeout, 0
    while not until() and time.monotonic() < deadline:
        events += loop.poll(0.05)
    return events


def _rows(recorder: HistoryRecorder, tmp_path: Path, client_id: str) -> list[dict]:
    recorder.close()
    return read_history(tmp_path / client_id).to_pylist()


def test_a_workload_client_connects_subscribes_and_receives_over_tls_on_the_loop(mosquitto, tmp_path):
    port, tls = mosquitto
    session, loop, recorder = _session(tmp_path, port, tls)
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-publisher", protocol=mqtt.MQTTv5)
    try:
        session.connect(clean_start=True, node=0, session_expiry_s=60, why="test")
        _pump(loop, lambda: session.subscribed)
        assert session.connected and session.subscribed
        publisher.tls_set_context(tls.context())
        publisher.connect("127.0.0.1", port)
        publisher.loop_start()
        for n in range(300):  # a burst: many PUBLISH packets behind one another in the TLS stream
            publisher.publish("ordeal/tls/burst", b"m%04d" % n, qos=1)
        _pump(loop, lambda: session.counters.delivered >= 300)
        assert session.counters.delivered == 300
        session.disconnect(abrupt=False, why="test")
        _pump(loop, lambda: False, timeout=0.3)
    finally:
        publisher.loop_stop()
        publisher.disconnect()
        loop.close()
    rows = _rows(recorder, tmp_path, session.client_id)
    assert [r["kind"] for r in rows if r["kind"] in (Kind.CONNECT, Kind.CONNECT_FAIL)] == [Kind.CONNECT]


def test_a_workload_client_verifying_against_another_ca_records_the_tls_failure(mosquitto, tmp_path, base):
    port, _tls = mosquitto
    other = base / "other"
    write_target_tls(other, TlsSpec(enabled=True), ["127.0.0.1"])
    session, loop, recorder = _session(tmp_path, port, client_tls(other, TlsSpec(enabled=True)))
    try:
        session.connect(clean_start=True, node=0, session_expiry_s=60, why="test")
        _pump(loop, lambda: session.paho is None)
    finally:
        loop.close()
    [failed] = [r for r in _rows(recorder, tmp_path, session.client_id) if r["kind"] == Kind.CONNECT_FAIL]
    error = json.loads(failed["detail"])["error"]
    # OpenSSL's words: the broker sends its CA with the chain (it is Mosquitto's cafile), which is not ours
    assert error.startswith(f"TLS: the broker's certificate did not verify against the run's CA {other}/tls/ca.pem: "
                            "self-signed certificate in certificate chain"), error


def test_a_handshake_the_broker_never_answers_waits_on_the_loop_without_spinning(tmp_path, base):
    """The TCP connect completes (the kernel's backlog) and the ClientHello is never read: the loop must sleep
    on the socket, not turn on it, until the CONNACK timeout ends the attempt."""
    write_target_tls(base, TlsSpec(enabled=True), ["127.0.0.1"])
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted, never read
        port = silent.getsockname()[1]
        session, loop, recorder = _session(tmp_path, port, client_tls(base, TlsSpec(enabled=True)))
        try:
            session.connect(clean_start=True, node=0, session_expiry_s=60, why="test")
            events = _pump(loop, lambda: False, timeout=1.0)
            assert events < 10, f"the loop turned {events} times on a handshake that waits for the broker"
            assert session.paho is not None and not session.connected
            session.check_connect_timeout(time.monotonic() + session.connect_timeout_s + 1)
        finally:
            loop.close()
    [failed] = [r for r in _rows(recorder, tmp_path, session.client_id) if r["kind"] == Kind.CONNECT_FAIL]
    assert json.loads(failed["detail"])["error"] == f"no CONNACK within {session.connect_timeout_s} s"
