"""A broker that refuses anonymous clients, tested as deployed: the shipped scenarios/mosquitto-auth.toml
(Debian's Mosquitto, ``allow_anonymous false``, a password file made by the start command from the same
variables the clients read) passes a smoke run with credentials and writes the password nowhere in clear;
the same scenario without credentials, or with a wrong password for one subscriber, ends unknown (exit 2)
naming the CONNACK refusal.  A missing Mosquitto fails under CI=true (tests/support/capabilities.py)."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from support.capabilities import missing_capability

from contracts.exit_codes import EXIT_PASS, EXIT_UNKNOWN
from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from harness.history import read_history
from harness.run import SilentReporter, run_scenario

pytestmark = [pytest.mark.integration]

CREDENTIALS_TABLE = """[target.credentials]          # every client (and the readiness probe) sends these
username_env = "ORDEAL_MQTT_USERNAME"
username_default = "ordeal"
password_env = "ORDEAL_MQTT_PASSWORD"
password_default = "ordeal-auth-demo"
"""


class Messages(SilentReporter):
    """What `ordeal run` would print: the run's messages (the outcome among them)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


@pytest.fixture
def auth(monkeypatch):
    """A fresh password in the environment (the broker's password file and the clients read it), and a
    run directory parent Mosquitto can reach after it drops root."""
    for program in ("mosquitto", "mosquitto_passwd"):
        if shutil.which(program) is None:
            missing_capability(f"{program} not installed: run scripts/bootstrap.sh (as root it installs the "
                               "mosquitto package with apt-get)")
    secret = "pw-" + secrets.token_hex(12)
    monkeypatch.setenv("ORDEAL_MQTT_PASSWORD", secret)
    monkeypatch.setenv("ORDEAL_MQTT_USERNAME", "ordeal-test")
    base = Path(tempfile.mkdtemp(prefix="ordeal-auth-", dir="/tmp"))  # pytest's own tmp is 0700
    base.chmod(0o755)
    out = base / "runs"
    out.mkdir()
    out.chmod(0o755)
    text = find_scenario("mosquitto-auth").read_text()
    assert CREDENTIALS_TABLE in text  # the copies below edit this table
    try:
        yield secret, out, text
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.spark
@pytest.mark.timeout(900)  # a run, then the check on the shared Spark Connect server (a JVM start when cold)
def test_mosquitto_auth_with_credentials_passes_and_writes_no_password_in_clear(auth):
    from ordeal.pipeline import run as run_and_check

    secret, out, _text = auth
    result = run_and_check(find_scenario("mosquitto-auth"), 1, out, print_table=False)
    assert result.exit_code == EXIT_PASS, (result.summary.get("error"), result.summary.get("check"))
    rows = read_history(result.run_dir / "history").to_pylist()
    connects = [r for r in rows if r["kind"] == Kind.CONNECT]
    assert {r["protocol"] for r in connects} == {4, 5}, "both MQTT versions logged in"
    assert not [r for r in rows if r["kind"] == Kind.CONNECT_FAIL]
    log = (result.run_dir / "logs" / "mosquitto.log").read_text()
    assert "u'ordeal-test'" in log, "the broker saw the user name from the environment"
    assert "not authorised" not in log
    scenario_json = json.loads((result.run_dir / "scenario.json").read_text())
    assert scenario_json["target"]["credentials"]["password_env"] == "ORDEAL_MQTT_PASSWORD"
    leaks = [str(path.relative_to(result.run_dir)) for path in result.run_dir.rglob("*")
             if path.is_file() and secret.encode() in path.read_bytes()]
    assert leaks == [], f"the password is written in clear into {leaks}"


def test_mosquitto_auth_without_credentials_ends_unknown_naming_the_connack_refusal(auth):
    _secret, out, text = auth
    anonymous = out.parent / "mosquitto-auth-anonymous.toml"
    anonymous.write_text(text.replace(CREDENTIALS_TABLE, ""))
    messages = Messages()
    result = run_scenario(anonymous, 1, out, check=False, reporter=messages)
    assert result.exit_code == EXIT_UNKNOWN
    error = result.summary["error"]
    assert ("mosquitto refused the CONNECT of ordeal-probe: not authorized (CONNACK 5); the MQTT 3.1.1 client "
            "sent no credentials (anonymous)") in error, error
    assert any("refused the CONNECT of ordeal-probe: not authorized (CONNACK 5)" in line for line in messages.lines)
    assert result.summary["counts"]["connects"] == 0 and result.summary["counts"]["published"] == 0


def test_one_subscriber_with_a_wrong_password_ends_the_run_unknown_naming_it(auth):
    _secret, out, text = auth
    wrong = out.parent / "mosquitto-auth-wrong.toml"
    wrong.write_text(text.replace(CREDENTIALS_TABLE, CREDENTIALS_TABLE + (
        '\n[[target.credentials.clients]]\nmatch = "test_sub_client_1_*"\nusername_env = "ORDEAL_MQTT_USERNAME"\n'
        'password = "not-the-password"\n')))
    result = run_scenario(wrong, 1, out, check=False)
    assert result.exit_code == EXIT_UNKNOWN
    error = result.summary["error"]
    assert "CredentialsRefused: the broker (mosquitto) refused the CONNECT of test_sub_client_1_0: not authorized " \
           "(CONNACK " in error, error
    assert "sent user name 'ordeal-test' and a password" in error and "not-the-password" not in error
    rows = read_history(result.run_dir / "history").to_pylist()
    [refused] = [r for r in rows if r["kind"] == Kind.CONNECT_FAIL]  # the run ended at the first refusal
    assert refused["client"] == "test_sub_client_1_0" and refused["reason_code"] in (5, 0x87)
    assert json.loads(refused["detail"])["error"].startswith("CONNACK refused: not authorized (CONNACK ")
    assert "test_sub_client_1_0" not in {r["client"] for r in rows if r["kind"] == Kind.CONNECT}
    assert not any(b"not-the-password" in p.read_bytes() for p in Path(result.run_dir).rglob("*")
                   if p.is_file() and p.name not in ("scenario.toml",))
