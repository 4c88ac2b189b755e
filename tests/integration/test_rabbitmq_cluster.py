"""The shipped three-node RabbitMQ cluster (Debian's rabbitmq-server 3.10 with its MQTT plugin) as a clustered
black-box target: it forms, clients connect to every node and take their sessions over to other nodes, a
one-node kill bites with evidence and the cluster re-forms after the heal, and a partition of one node from
the other two bites and heals.  Read back from each run's history; the smoke run is also checked (it passes:
docs/findings.md).  A missing rabbitmq-server fails under CI=true (tests/support/capabilities.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.capabilities import missing_capability
from support.dirs import searchable_tmp

from contracts.exit_codes import EXIT_PASS
from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from harness.history import read_history

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
NODES = {"rabbit1", "rabbit2", "rabbit3"}


@pytest.fixture(scope="module")
def out():
    if not Path(RABBITMQ_SERVER).exists():
        missing_capability("rabbitmq-server not installed: run scripts/bootstrap.sh (as root it installs Debian's "
                           "rabbitmq-server with apt-get)")
    with searchable_tmp("ordeal-rabbit-cluster-") as base:
        yield base


def _events(rows: list[dict]) -> list[tuple[str, str, dict]]:
    return [(r["node"], (detail := json.loads(r["detail"] or "{}")).get("action"), detail)
            for r in rows if r["kind"] == Kind.NODE_EVENT]


def _failing(run_dir: Path) -> list:
    """What a failed check found: each failing or unknown invariant with its count, reason and first witnesses."""
    report = json.loads((run_dir / "report.json").read_text())
    return [(i["id"], i["verdict"], i["count"], i.get("reason"), [w.get("text") for w in i.get("witnesses", [])[:3]])
            for i in report["invariants"] if i["verdict"] in ("fail", "unknown")]


def _fault_rows(rows: list[dict]) -> list[dict]:
    return [{**r, "detail": json.loads(r["detail"] or "{}")} for r in rows
            if r["kind"] in (Kind.FAULT_START, Kind.FAULT_EVIDENCE, Kind.FAULT_HEAL, Kind.FAULT_ERROR)]


@pytest.mark.spark
@pytest.mark.timeout(1200)  # three Erlang VMs boot (tens of seconds), the run, then the check on Spark
def test_the_cluster_forms_clients_use_every_node_and_take_sessions_over_across_nodes(out):
    from ordeal.pipeline import run as run_and_check

    result = run_and_check(find_scenario("rabbitmq-cluster-smoke"), 1, out / "smoke", print_table=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    events = _events(rows)
    assert {node for node, action, _ in events if action == "ready"} == NODES
    formed = [detail for _node, action, detail in events if action == "formed"]
    assert formed and formed[0]["why"] == "start", events
    connects = [r for r in rows if r["kind"] == Kind.CONNECT]
    assert {r["node"] for r in connects} == NODES, "clients on every node"
    takeovers = {}
    for row in connects:
        takeovers.setdefault(row["client"], []).append(row["node"])
    moved = {client: nodes for client, nodes in takeovers.items() if len(set(nodes)) > 1}
    assert moved, f"a session taken over on another node: {takeovers}"
    assert result.exit_code == EXIT_PASS, _failing(result.run_dir)
    topology = json.loads((result.run_dir / "topology.json").read_text())
    assert set(topology["cluster"]["brokers"]) == NODES and len(set(topology["mqtt"].values())) == 3


@pytest.mark.timeout(1200)
def test_a_one_node_kill_bites_with_evidence_heals_and_the_cluster_re_forms(out):
    from harness.run import SilentReporter, run_scenario

    result = run_scenario(find_scenario("rabbitmq-cluster-kill"), 1, out / "kill", reporter=SilentReporter(),
                          check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    faults = _fault_rows(rows)
    assert not [f for f in faults if f["kind"] == Kind.FAULT_ERROR], faults
    evidence = [f for f in faults if f["kind"] == Kind.FAULT_EVIDENCE]
    apply, heal = evidence[0], evidence[-1]
    assert apply["bit"] and apply["node"] in NODES, apply
    assert {c["what"] for c in apply["detail"]["checks"]} >= {"pid gone", "port refuses"}
    assert heal["bit"] and heal["detail"]["stage"] == "heal", heal
    events = _events(rows)
    victim = apply["node"]
    assert (victim, "kill") in [(n, a) for n, a, _ in events]
    back = [detail for _n, action, detail in events if action == "formed" and detail["why"] == f"{victim} back"]
    assert back, f"the cluster re-formed after {victim} came back: {events}"
    assert not [e for e in events if e[1] == "exited"], "a planned kill is no unplanned exit"


@pytest.mark.nightly  # the longest of the three (a 60 s workload): kept out of .ci/run for its time
@pytest.mark.timeout(1200)
def test_a_partition_of_one_node_from_the_other_two_bites_and_heals(out):
    """RabbitMQ 3.10 has been seen to leave the paused node's rabbit application booting for good after the heal
    ("Global hang workaround: global state ... seems broken": docs/findings.md); then the heal's fault_error fails
    this test. That is a finding about the broker, not a flake of the test."""
    from harness.run import SilentReporter, run_scenario

    result = run_scenario(find_scenario("rabbitmq-cluster-partition"), 1, out / "partition",
                          reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    faults = _fault_rows(rows)
    assert not [f for f in faults if f["kind"] == Kind.FAULT_ERROR], faults
    apply, heal = [f for f in faults if f["kind"] == Kind.FAULT_EVIDENCE][:2]
    sides = next(c for c in apply["detail"]["checks"] if c["what"] == "drop rules installed")["observed"]["sides"]
    assert len(sides["a"]) == 1 and len(sides["b"]) == 2 and set(sides["a"]) | set(sides["b"]) == NODES, sides
    assert apply["bit"], apply
    dropped = next(c for c in heal["detail"]["checks"] if c["what"] == "packets dropped")
    assert heal["bit"] and dropped["observed"]["packets"] > 0, heal
    drain = next(json.loads(r["detail"]) for r in rows if r["kind"] == Kind.PHASE
                 and json.loads(r["detail"] or "{}").get("phase") == "drain_end")
    assert drain["reason"] == "quiet", drain
