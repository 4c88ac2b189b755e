"""A target that dies outside every planned fault is noticed and judged: Debian's Mosquitto, started by a
wrapper that SIGKILLs it a few seconds into the workload (no fault in the plan), gives a ``node_event``
"exited" row with the node, the exit status and its last log lines, the report fails
``health.unplanned_exit`` with that witness in words, and the drain's outcome names the node.  The near-miss
twin, the same broker killed by a planned ``process_kill``, records no "exited" row.  A broker stopped with
SIGSTOP from outside the run (its wrapper, no fault in the plan) fails its health probe: a ``node_event``
"unresponsive" then "responsive" row, and ``health.unresponsive`` with the node named; the near-miss twin, the
same broker paused as long by a planned ``process_pause``, gives the same rows and no violation (the fault
covers them).  A process inside the target, declared as a node of its own, is what a fault reaches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.capabilities import missing_capability
from support.clusters import node_events
from support.dirs import searchable_tmp

from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from harness.history import read_history

pytestmark = [pytest.mark.integration]

# Mosquitto in the background, SIGKILLed after 4 s by its own wrapper: to the harness the node just exits.
WRAPPED_START = ('start = ["/bin/sh", "-c", "mosquitto -c {run_dir}/mosquitto.conf & broker=$!; sleep 4; '
                 'kill -9 $broker; wait $broker"]')


@pytest.fixture
def out():
    if shutil.which("mosquitto") is None:
        missing_capability("mosquitto not installed: run scripts/bootstrap.sh (as root it installs the mosquitto "
                           "package with apt-get)")
    with searchable_tmp("ordeal-death-") as base:  # Mosquitto drops root: o+x needed
        yield base


# Mosquitto in the background, stopped (SIGSTOP) after 3 s for 16 s by its own wrapper: to the harness the node
# is running but does not answer, and no fault of the plan paused it.
STOPPED_START = ('start = ["/bin/sh", "-c", "mosquitto -c {run_dir}/mosquitto.conf & broker=$!; sleep 3; '
                 'kill -STOP $broker; sleep 16; kill -CONT $broker; wait $broker"]')
PLAIN_START = 'start = ["mosquitto", "-c", "{run_dir}/mosquitto.conf"]'


def _scenario(base: Path, start: str, extra: str = "", duration_s: int = 10, drain_timeout_s: int = 8) -> Path:
    text = find_scenario("mosquitto-smoke").read_text()
    start_line = PLAIN_START
    assert start_line in text
    text = text.replace(start_line, start).replace("duration_s = 6", f"duration_s = {duration_s}").replace(
        "drain_timeout_s = 30", f"drain_timeout_s = {drain_timeout_s}").replace(
        'name = "mosquitto-smoke"', 'name = "death"')
    path = base / "death.toml"
    path.write_text(text + extra)
    return path


@pytest.mark.timeout(300)
def test_a_broker_that_dies_on_its_own_fails_unplanned_exit_with_node_status_and_log_lines(out):
    """The run as recorded, judged by the checkers' timeline (the rule's words as the report shows them; the
    report itself is built from the same witness on Spark: tests/checkers/ cover that path)."""
    from harness.run import SilentReporter, run_scenario
    from spark_checkers.guarantees import Guarantees
    from spark_checkers.rules.catalog import explain
    from spark_checkers.timeline import build_timeline

    result = run_scenario(_scenario(out, WRAPPED_START), 1, out / "runs", reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    exited = [r for r in rows if r["kind"] == Kind.NODE_EVENT and json.loads(r["detail"] or "{}").get("action") == "exited"]
    assert len(exited) == 1, [json.loads(r["detail"]) for r in rows if r["kind"] == Kind.NODE_EVENT]
    detail = json.loads(exited[0]["detail"])
    assert exited[0]["node"] == "mosquitto" and detail["exit_status"] == 137 and detail["planned"] is False
    assert any("mosquitto" in line.lower() for line in detail["log_tail"]), detail["log_tail"]
    scenario = json.loads((result.run_dir / "scenario.json").read_text())
    timeline = build_timeline("death", rows, Guarantees.from_scenario(scenario))
    (witness,) = timeline.violations["health.unplanned_exit"]
    words = explain("health.unplanned_exit", witness, timeline)
    assert words.startswith("node mosquitto exited at ") and "exit status 137" in words, words
    assert "its last log lines: " in words, words


@pytest.mark.timeout(300)
def test_a_planned_kill_is_no_unplanned_exit(out):
    from harness.run import SilentReporter, run_scenario

    faults = ("\n[faults]\nmix = { process_kill = 1 }\nquiet_s = [2, 3]\nduration_s = [1, 2]\ntail_s = 4\n"
              "max_faults = 1\n")
    result = run_scenario(_scenario(out, PLAIN_START, faults), 1,
                          out / "runs", reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    actions = [action for _node, action, _detail in node_events(rows)]
    assert "kill" in actions and "exited" not in actions, actions


def _health_stretches(rows: list[dict]) -> list[tuple[str, str, dict]]:
    return [event for event in node_events(rows) if event[1] in ("unresponsive", "responsive")]


@pytest.mark.timeout(300)
def test_a_broker_stopped_from_outside_the_run_fails_unresponsive_with_the_node_named(out):
    from harness.death_watch import UNRESPONSIVE_GRACE_S
    from harness.run import SilentReporter, run_scenario
    from spark_checkers.guarantees import Guarantees
    from spark_checkers.rules.catalog import explain
    from spark_checkers.timeline import build_timeline

    result = run_scenario(_scenario(out, STOPPED_START, drain_timeout_s=20), 1, out / "runs",
                          reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    stretches = _health_stretches(rows)
    assert [(node, action) for node, action, _ in stretches] == [("mosquitto", "unresponsive"),
                                                                ("mosquitto", "responsive")], stretches
    unresponsive = stretches[0][2]
    assert unresponsive["probe"].startswith("MQTT CONNECT ") and "no answer within" in unresponsive["error"]
    assert unresponsive["grace_s"] == UNRESPONSIVE_GRACE_S and unresponsive["failing_s"] >= UNRESPONSIVE_GRACE_S
    assert UNRESPONSIVE_GRACE_S <= stretches[1][2]["unresponsive_s"] <= 20, stretches
    scenario = json.loads((result.run_dir / "scenario.json").read_text())
    timeline = build_timeline("stopped", rows, Guarantees.from_scenario(scenario))
    (witness,) = timeline.violations["health.unresponsive"]
    assert witness["node"] == "mosquitto" and witness["t_to"] is not None
    words = explain("health.unresponsive", witness, timeline)
    assert words.startswith("node mosquitto stopped answering at ") and "no fault of the plan covered it" in words
    assert not timeline.violations.get("health.unplanned_exit"), "stopped, not exited"


@pytest.mark.timeout(300)
def test_near_miss_a_planned_pause_as_long_is_no_unresponsive_node(out):
    from harness.run import SilentReporter, run_scenario
    from spark_checkers.guarantees import Guarantees
    from spark_checkers.timeline import build_timeline

    faults = ("\n[faults]\nmix = { process_pause = 1 }\ntargets = { process_pause = ['node:mosquitto'] }\n"
              "quiet_s = [2, 3]\nduration_s = [15, 16]\ntail_s = 4\nmax_faults = 1\n")
    result = run_scenario(_scenario(out, PLAIN_START, faults, duration_s=24, drain_timeout_s=20), 1, out / "runs",
                          reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    actions = [action for _node, action, _detail in _health_stretches(rows)]
    # The probe saw the paused node fail as long (the watch records what it sees) ...
    assert actions == ["unresponsive", "responsive"], (actions, result.summary.get("error"))
    scenario = json.loads((result.run_dir / "scenario.json").read_text())
    timeline = build_timeline("paused", rows, Guarantees.from_scenario(scenario))
    assert [f.kind for f in timeline.faults] == ["process_pause"] and timeline.faults[0].bit
    # ... and the planned pause covers it: no violation.
    assert not timeline.violations.get("health.unresponsive"), timeline.violations.get("health.unresponsive")


SERVICE_NODES = """
[[target.nodes]]
name = "sidecar"
role = "service"
start = ["python3", "-m", "http.server", "{port}", "--bind", "{host}", "--directory", "{data_dir}"]
port = 8080
[[target.nodes]]
name = "mosquitto"
"""


@pytest.mark.timeout(300)
def test_a_process_inside_the_target_is_a_node_of_its_own_that_faults_reach(out):
    """A service node (here a plain HTTP server beside Mosquitto): started and ready before the broker, on
    its own address, killed by the nemesis as node:sidecar and brought back by the heal; the broker node stays
    the clients' only endpoint."""
    from harness.run import SilentReporter, run_scenario

    text = _scenario(out, 'start = ["mosquitto", "-c", "{conf_dir}/mosquitto.conf"]').read_text()
    text = text.replace('host = "127.0.0.1"\nport = 0                      # a free loopback port, chosen at run time\n', "")
    faults = ("\n[faults]\nmix = { process_kill = 1 }\ntargets = { process_kill = ['node:sidecar'] }\n"
              "quiet_s = [2, 3]\nduration_s = [1, 2]\ntail_s = 4\nmax_faults = 1\n")
    path = out / "service.toml"
    path.write_text(text.replace("[workload]", SERVICE_NODES + "\n[workload]") + faults)
    result = run_scenario(path, 1, out / "runs", reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    events = [(node, action) for node, action, _detail in node_events(rows)]
    faults_seen = [(r["kind"], r.get("detail")) for r in rows if r["kind"].startswith("fault")]
    assert events.index(("sidecar", "ready")) < events.index(("mosquitto", "start")), events
    assert ("sidecar", "kill") in events, (faults_seen, result.summary.get("error"))
    assert ("sidecar", "start") in events[events.index(("sidecar", "kill")):]
    evidence = [r for r in rows if r["kind"] == Kind.FAULT_EVIDENCE]
    assert evidence and all(r["bit"] for r in evidence) and {r["node"] for r in evidence} == {"sidecar"}
    assert {r["node"] for r in rows if r["kind"] == Kind.CONNECT} == {"mosquitto"}
    assert not [a for _n, a in events if a == "exited"]
    topology = json.loads((result.run_dir / "topology.json").read_text())
    assert topology["cluster"]["services"] == ["sidecar"] and list(topology["mqtt"]) == ["mosquitto"]
