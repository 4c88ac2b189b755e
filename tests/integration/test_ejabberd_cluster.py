"""The shipped three-node ejabberd cluster (Debian's ejabberd 23.01 with its mod_mqtt) as a clustered black-box
target: the formation joins it, clients connect to every node and take their sessions over to other nodes
(the smoke run is also checked, and passes), and a kill of one random node bites with evidence, heals, and the
cluster re-forms.  Read back from each run's history.  A missing ejabberd fails under CI=true
(tests/support/capabilities.py)."""

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

EJABBERD_EBIN = "/usr/lib/x86_64-linux-gnu/ejabberd-23.01"
NODES = {"ejabberd1", "ejabberd2", "ejabberd3"}


@pytest.fixture(scope="module")
def out():
    if not Path(EJABBERD_EBIN).is_dir() or not Path("/usr/bin/erl").exists():
        missing_capability("ejabberd 23.01 not installed: run scripts/bootstrap.sh (as root it installs Debian's "
                           "ejabberd with apt-get)")
    with searchable_tmp("ordeal-ejabberd-cluster-") as base:
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
@pytest.mark.timeout(900)  # three Erlang VMs boot (seconds), the joins, the run, then the check on Spark
def test_the_cluster_forms_clients_use_every_node_and_take_sessions_over_across_nodes(out):
    from ordeal.pipeline import run as run_and_check

    result = run_and_check(find_scenario("ejabberd-cluster-smoke"), 1, out / "smoke", print_table=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    events = _events(rows)
    assert {node for node, action, _ in events if action == "ready"} == NODES
    steps = [detail for _node, action, detail in events if action == "formation_step"]
    assert len(steps) == 2 and all(step["exit"] == 0 and "join_cluster" in step["argv"] for step in steps), steps
    formed = [detail for _node, action, detail in events if action == "formed"]
    assert formed and formed[0]["why"] == "start", events
    probes = {detail["level"]: detail["ok"] for _node, action, detail in events if action == "protocol_probe"}
    assert probes == {4: True, 5: True}, "mod_mqtt speaks MQTT 3.1.1 and 5"
    connects = [r for r in rows if r["kind"] == Kind.CONNECT]
    assert {r["node"] for r in connects} == NODES, "clients on every node"
    takeovers: dict[str, list[tuple[str, bool]]] = {}
    for row in connects:
        takeovers.setdefault(row["client"], []).append((row["node"], row["session_present"]))
    moved = {client: seen for client, seen in takeovers.items()
             if any(b[0] != a[0] and b[1] for a, b in zip(seen, seen[1:], strict=False))}
    assert moved, f"a session taken over on another node (session present there): {takeovers}"
    assert result.exit_code == EXIT_PASS, _failing(result.run_dir)
    topology = json.loads((result.run_dir / "topology.json").read_text())
    assert set(topology["cluster"]["brokers"]) == NODES and len(set(topology["mqtt"].values())) == 3


@pytest.mark.nightly  # CI has RabbitMQ's node kill; this one runs in the nightly tier
@pytest.mark.timeout(900)
def test_a_one_node_kill_bites_with_evidence_heals_and_the_cluster_re_forms(out):
    from harness.run import SilentReporter, run_scenario

    result = run_scenario(find_scenario("ejabberd-cluster-kill"), 1, out / "kill", reporter=SilentReporter(),
                          check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    faults = _fault_rows(rows)
    assert not [f for f in faults if f["kind"] == Kind.FAULT_ERROR], faults
    evidence = [f for f in faults if f["kind"] == Kind.FAULT_EVIDENCE]
    apply, heal = evidence[0], evidence[-1]
    assert apply["bit"] and apply["node"] in NODES, apply
    assert {c["what"] for c in apply["detail"]["checks"]} >= {"pid gone", "port refuses"}, apply
    assert heal["bit"] and heal["detail"]["stage"] == "heal" and heal["node"] == apply["node"], heal
    events = _events(rows)
    victim = apply["node"]
    assert (victim, "kill") in [(n, a) for n, a, _ in events]
    back = [detail for _n, action, detail in events if action == "formed" and detail["why"] == f"{victim} back"]
    assert back, f"the cluster re-formed after {victim} came back: {events}"
    assert not [e for e in events if e[1] == "exited"], "a planned kill is no unplanned exit"
