"""A target that dies outside every planned fault is noticed and judged: Debian's Mosquitto, started by a
wrapper that SIGKILLs it a few seconds into the workload (no fault in the plan), gives a ``node_event``
"exited" row with the node, the exit status and its last log lines, the report fails
``health.unplanned_exit`` with that witness in words, and the drain's outcome names the node.  The near-miss
twin, the same broker killed by a planned ``process_kill``, records no "exited" row.  A process inside the
target, declared as a node of its own, is what a fault reaches."""

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


def _scenario(base: Path, start: str, extra: str = "") -> Path:
    text = find_scenario("mosquitto-smoke").read_text()
    start_line = 'start = ["mosquitto", "-c", "{run_dir}/mosquitto.conf"]'
    assert start_line in text
    text = text.replace(start_line, start).replace("duration_s = 6", "duration_s = 10").replace(
        "drain_timeout_s = 30", "drain_timeout_s = 8").replace('name = "mosquitto-smoke"', 'name = "death"')
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
    result = run_scenario(_scenario(out, 'start = ["mosquitto", "-c", "{run_dir}/mosquitto.conf"]', faults), 1,
                          out / "runs", reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    actions = [action for _node, action, _detail in node_events(rows)]
    assert "kill" in actions and "exited" not in actions, actions


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
