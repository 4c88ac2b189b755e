"""Any broker under the full nemesis: the shipped real-broker scenarios, run end to end against
Debian's Mosquitto and RabbitMQ's MQTT plugin, with the kill / stop / partition in the history, its
evidence, heal and attribution, and verdicts judged against what each target declares.

The runs are made unchecked and then checked in one Spark batch (one JVM for all of them).  A missing broker
fails under CI=true with the fix (tests/support/capabilities.py; skips elsewhere): CI installs both through
scripts/bootstrap.sh."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.capabilities import missing_capability

from contracts.history_schema import Kind
from contracts.scenario import ScenarioError, find_scenario, parse_scenario
from harness.history import read_history
from harness.run import run_scenario
from ordeal.pipeline import check_runs_later

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(2400)]

RABBITMQ = "/usr/lib/rabbitmq/bin/rabbitmq-server"
SCENARIOS = ("mosquitto-kill", "mosquitto-stop", "mosquitto-partition", "mosquitto-limit", "rabbitmq-kill")


def _require_brokers() -> None:
    missing = [name for name, present in (("mosquitto", shutil.which("mosquitto")),
                                          ("rabbitmq-server", Path(RABBITMQ).exists())) if not present]
    if missing:  # under CI=true this fails (tests/support/capabilities.py): CI installs both through bootstrap
        missing_capability(f"{', '.join(missing)} not installed: run scripts/bootstrap.sh (as root it installs "
                           "them with apt-get)")


@pytest.fixture(scope="module")
def runs():
    """name -> (run_dir, summary, report, rows) for every shipped real-broker scenario, seed 1."""
    _require_brokers()
    out = Path(tempfile.mkdtemp(prefix="ordeal-brokers-", dir="/tmp"))
    out.chmod(0o755)  # Mosquitto drops root: it must reach its data directory
    try:
        made = {name: run_scenario(find_scenario(name), 1, out, check=False) for name in SCENARIOS}
        check_runs_later([made[name].run_dir for name in SCENARIOS])
        yield {name: (result.run_dir, json.loads((result.run_dir / "summary.json").read_text()),
                      json.loads((result.run_dir / "report.json").read_text()),
                      read_history(result.run_dir / "history").to_pylist())
               for name, result in made.items()}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _verdicts(report) -> dict[str, str]:
    return {item["id"]: item["verdict"] for item in report["invariants"]}


def _fault_rows(rows, kind):
    return [r for r in rows if r["fault_id"] and r["fault_kind"] == kind]


def _assert_process_fault_with_evidence(rows, kind, action):
    fault = _fault_rows(rows, kind)
    kinds = [r["kind"] for r in fault]
    assert Kind.FAULT_START in kinds and Kind.FAULT_HEAL in kinds and Kind.FAULT_ERROR not in kinds, kinds
    evidence = {json.loads(r["detail"])["stage"]: r for r in fault if r["kind"] == Kind.FAULT_EVIDENCE}
    assert evidence["apply"]["bit"] and evidence["heal"]["bit"], evidence
    checks = {c["what"]: c["observed"] for c in json.loads(evidence["apply"]["detail"])["checks"]}
    assert checks["port refuses"]["port"] == "refuses" and checks["pid gone"]["state"] in (None, "Z")
    actions = [json.loads(r["detail"])["action"] for r in rows if r["kind"] == Kind.NODE_EVENT and r["fault_id"]]
    assert actions == [action, "start"], actions  # the nemesis' own action, then the restart at heal
    return fault[0]["fault_id"]


def _assert_losses_attributed(report, fault_id):
    for item in report["invariants"]:
        if item["id"] in ("durability.lost", "durability.lost_allowed") and item["count"]:
            assert all(w["data"]["fault"]["fault_id"] == fault_id for w in item["witnesses"]), item["witnesses"]


@pytest.mark.parametrize("name,kind,action", [("mosquitto-kill", "process_kill", "kill"),
                                              ("mosquitto-stop", "process_stop", "stop")])
def test_mosquitto_kill_and_graceful_stop_run_to_a_verdict_with_evidence_and_attribution(runs, name, kind, action):
    run_dir, summary, report, rows = runs[name]
    assert report["verdict"] in ("pass", "fail"), [(i["id"], i["reason"]) for i in report["invariants"]
                                                   if i["verdict"] == "unknown"]
    fault_id = _assert_process_fault_with_evidence(rows, kind, action)
    assert _verdicts(report)["meta.fault_bit"] == "pass"
    assert [f["fault_id"] for f in report["faults"]] == [fault_id]
    _assert_losses_attributed(report, fault_id)
    assert report["guarantees"]["promises"]["persistence"] == "graceful"
    # the clients saw the broker go: server-side disconnects or refused connects during the fault
    assert any(r["kind"] in (Kind.CONNECT_FAIL, Kind.DISCONNECT) and r["client"] for r in rows)


def test_a_client_broker_partition_on_mosquitto_bites_and_heals(runs):
    run_dir, summary, report, rows = runs["mosquitto-partition"]
    partitions = [r for r in rows if r["kind"] == Kind.FAULT_EVIDENCE and r["fault_kind"].startswith("net_")]
    heals = [json.loads(r["detail"]) for r in partitions if json.loads(r["detail"])["stage"] == "heal"]
    assert heals and all(r["bit"] for r in partitions), partitions
    for heal in heals:  # the drop counters saw packets: the proof it bit
        counters = [c for c in heal["checks"] if "counter" in c["what"] or "packets" in json.dumps(c["observed"])]
        assert counters and all(c["ok"] for c in counters), heal
    assert _verdicts(report)["meta.fault_bit"] == "pass"
    assert report["verdict"] in ("pass", "fail")
    topology = json.loads((run_dir / "topology.json").read_text())
    assert topology["address_mode"] == "distinct" and not topology["mqtt"]["mosquitto"].startswith("127.0.0.1:")


def test_a_small_mosquitto_queue_is_judged_against_its_declared_drop_newest_policy(runs):
    run_dir, summary, report, rows = runs["mosquitto-limit"]
    verdicts = _verdicts(report)
    assert report["guarantees"]["promises"]["queue_policy"] == "drop_newest"
    assert report["guarantees"]["promises"]["queue_limit"] == 10
    assert verdicts["limits.trim_not_oldest"] == "not_applicable"
    for rule in ("limits.over_limit", "limits.trimmed_under_limit", "limits.trim_not_newest"):
        assert verdicts[rule] in ("pass", "fail"), (rule, report["invariants"])
    acked = {(r["publisher"], r["pub_seq"]) for r in rows if r["kind"] == Kind.PUBLISH_ACK}
    delivered = {(r["publisher"], r["pub_seq"]) for r in rows if r["kind"] == Kind.DELIVERY}
    assert len(acked - delivered) > 0, "the backlogs overflowed the queue of 10: some acked messages dropped"


def test_rabbitmq_311_kill_and_restart_runs_to_a_verdict(runs):
    run_dir, summary, report, rows = runs["rabbitmq-kill"]
    assert report["verdict"] in ("pass", "fail"), [(i["id"], i["reason"]) for i in report["invariants"]
                                                   if i["verdict"] == "unknown"]
    fault_id = _assert_process_fault_with_evidence(rows, "process_kill", "kill")
    _assert_losses_attributed(report, fault_id)
    assert {r["protocol"] for r in rows if r["kind"] == Kind.CONNECT} == {4}
    log = (run_dir / "logs" / "rabbitmq.log").read_text(errors="replace")
    assert log.count("=== ordeal: start") == 2 and "enoent" not in log  # /proc works after the restart


def test_mqtt5_against_rabbitmq_is_refused_at_load_with_the_protocol_reason(tmp_path):
    text = find_scenario("rabbitmq-kill").read_text().replace("protocol_mix = { mqtt311 = 1 }",
                                                              "protocol_mix = { mqtt311 = 1, mqtt5 = 1 }")
    with pytest.raises(ScenarioError) as error:
        parse_scenario(text, source="rabbitmq-mqtt5.toml")
    assert ("protocol_mix sends MQTT 5 but rabbitmq-mqtt5.toml: [target] 'rabbitmq' (external) declares "
            "mqtt_versions = ['3.1.1']: it does not speak MQTT 5") in str(error.value)
    bad = tmp_path / "rabbitmq-mqtt5.toml"
    bad.write_text(text)
    done = subprocess.run([sys.executable, "-m", "ordeal.cli", "run", str(bad), "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "does not speak MQTT 5" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_broker_that_refuses_mqtt5_at_connect_is_an_unknown_naming_the_protocol(tmp_path):
    """Undeclared, the refusal is found when the target starts: unknown, naming protocol version 5."""
    _require_brokers()
    text = find_scenario("rabbitmq-kill").read_text()
    text = (text.replace('mqtt_versions = ["3.1.1"]      # 3.10\'s plugin refuses an MQTT 5 CONNECT', "")
            .replace("protocol_mix = { mqtt311 = 1 }", "protocol_mix = { mqtt311 = 1, mqtt5 = 1 }")
            .replace("[faults]\nmix = { process_kill = 1 }", "[faults]\nmix = {}")
            .replace('targets = { process_kill = ["node:rabbitmq"] }', ""))
    scenario = tmp_path / "rabbitmq-undeclared.toml"
    scenario.write_text(text)
    out = tmp_path / "runs"
    out.mkdir()
    out.chmod(0o755)
    result = run_scenario(scenario, 1, out, check=False)
    assert result.exit_code == 2
    assert "refused an MQTT CONNECT for protocol version 5" in result.summary["error"], result.summary["error"]
