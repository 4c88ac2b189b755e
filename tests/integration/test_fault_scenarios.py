"""Fault scenarios end to end on the real topology: plan → run with the nemesis and the executor's client
faults → heal_all → drain → one Spark check of all runs.  The correct reference broker must pass under each
scenario's declared allowances, or — where a fault cannot bite — must not pass, with the reason.
Three shipped smoke scenarios (≈ 20 s of workload each), checked together in one Spark job."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from contracts.exit_codes import EXIT_PASS
from contracts.history_schema import Kind, Phase
from contracts.scenario import find_scenario, load_scenario
from harness.history import read_history, read_manifest
from harness.run import run_scenario

pytestmark = pytest.mark.integration

SCENARIOS = ("subscriber-flapping", "redis-master-kill", "partition-broker-redis")
SEED = 3
# The scenario each test reads: the fixture runs only those of the selected tests.
NEEDS = {"test_subscriber_flapping_cuts_real_sockets_and_passes": "subscriber-flapping",
         "test_redis_master_kill_bites_heals_and_passes": "redis-master-kill",
         "test_partition_broker_redis_never_passes_while_it_cannot_bite": "partition-broker-redis"}


@pytest.fixture(scope="module")
def fault_runs(request: pytest.FixtureRequest):
    """Each scenario a selected test reads, run once (no per-run check), then every history checked in one
    Spark session."""
    selected = {NEEDS.get(item.originalname) for item in request.session.items if item.module is request.module}
    names = [name for name in SCENARIOS if name in selected]
    out = Path(tempfile.mkdtemp(prefix="ordeal-fault-runs-", dir="/tmp"))
    try:
        results = {name: run_scenario(find_scenario(name), SEED, out, check=False) for name in names}
        from spark_checkers.api import check_runs

        reports = check_runs([results[name].run_dir for name in names])
        yield {name: (results[name], report) for name, report in zip(names, reports, strict=True)}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def rows_of(run_dir: Path) -> list[dict]:
    assert read_manifest(run_dir / "history")["complete"] is True
    return read_history(run_dir / "history").to_pylist()


def detail(row: dict) -> dict:
    return json.loads(row["detail"] or "{}")


def verdicts(report: dict) -> dict[str, dict]:
    return {item["id"]: item for item in report["invariants"]}


def assert_every_fault_played(run_dir: Path, rows: list[dict]) -> dict[str, list[dict]]:
    """Every planned fault started, has apply and heal evidence, and healed before the final phase."""
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["faults"], "the scenario planned no fault for this seed"
    by_fault: dict[str, list[dict]] = {}
    for row in rows:
        if row["fault_id"] and row["kind"].startswith("fault_"):
            by_fault.setdefault(row["fault_id"], []).append(row)
    assert sorted(by_fault) == sorted(f["fault_id"] for f in plan["faults"])
    heal_all = next(r for r in rows if r["kind"] == Kind.PHASE and detail(r)["phase"] == Phase.HEAL_ALL)
    for fault_id, fault_rows in by_fault.items():
        kinds = [r["kind"] for r in fault_rows]
        assert Kind.FAULT_START in kinds and Kind.FAULT_HEAL in kinds, (fault_id, kinds)
        stages = [detail(r)["stage"] for r in fault_rows if r["kind"] == Kind.FAULT_EVIDENCE]
        assert stages == ["apply", "heal"], (fault_id, fault_rows)
        heal = next(r for r in fault_rows if r["kind"] == Kind.FAULT_HEAL)
        assert detail(heal)["early"] is False and heal["seq"] < heal_all["seq"], "healed within the workload"
    return by_fault


def test_subscriber_flapping_cuts_real_sockets_and_passes(fault_runs):
    result, report = fault_runs["subscriber-flapping"]
    rows = rows_of(result.run_dir)
    by_fault = assert_every_fault_played(result.run_dir, rows)
    for fault_id, fault_rows in by_fault.items():
        assert all(r["bit"] for r in fault_rows if r["kind"] == Kind.FAULT_EVIDENCE), fault_rows
        assert not [r for r in fault_rows if r["kind"] == Kind.FAULT_ERROR]
        apply = next(r for r in fault_rows if r["kind"] == Kind.FAULT_EVIDENCE)
        observed = detail(apply)["checks"][0]["observed"]
        assert observed["fd_closed"] and observed["tcp_established"] is False
        disconnects = [r for r in rows if r["kind"] == Kind.DISCONNECT and r["fault_id"] == fault_id]
        reconnects = [r for r in rows if r["kind"] == Kind.CONNECT and r["fault_id"] == fault_id]
        assert len(disconnects) == 1 and len(reconnects) == 1
        assert disconnects[0]["abrupt"] is (observed["mode"] == "abrupt")
        assert reconnects[0]["session_present"] is True, "clean_start false: the session must survive"
    assert report["exit_code"] == EXIT_PASS, json.dumps(report["invariants"], indent=1)[:4000]
    allowed = set(load_scenario(find_scenario("subscriber-flapping")).checks.allowed)
    assert {i for i, v in verdicts(report).items() if v.get("allowed")} <= allowed


@pytest.mark.nightly  # for its time; CI kills a Redis master mid-stream (test_broker_faults.py) and in the smoke self-test
def test_redis_master_kill_bites_heals_and_passes(fault_runs):
    result, report = fault_runs["redis-master-kill"]
    rows = rows_of(result.run_dir)
    by_fault = assert_every_fault_played(result.run_dir, rows)
    for fault_rows in by_fault.values():
        evidence = [r for r in fault_rows if r["kind"] == Kind.FAULT_EVIDENCE]
        assert all(r["bit"] for r in evidence), evidence
        checks = {c["what"] for c in detail(evidence[0])["checks"]}
        assert any("promot" in what or "master" in what for what in checks), checks  # a replica took over
        killed = evidence[0]["node"]
        assert any(r["kind"] == Kind.NODE_EVENT and r["node"] == killed and detail(r).get("action") == "kill"
                   for r in rows)
    assert report["exit_code"] == EXIT_PASS, json.dumps(report["invariants"], indent=1)[:4000]
    counts = result.summary["counts"]
    assert counts["acked"] > 0 and counts["delivered_unique"] >= counts["acked"]


def test_partition_broker_redis_never_passes_while_it_cannot_bite(fault_runs):
    """The broker's outgoing connections leave from 127.0.0.1 (docs/faults.md "Source addresses matter"):
    the partition cannot see them.  The run must say so — never pass because of a fault that did not bite.
    Once the broker binds its own address the fault bites and the run must pass."""
    result, report = fault_runs["partition-broker-redis"]
    rows = rows_of(result.run_dir)
    errors = [r for r in rows if r["kind"] == Kind.FAULT_ERROR]
    evidence = [r for r in rows if r["kind"] == Kind.FAULT_EVIDENCE]
    fault_bit = verdicts(report)["meta.fault_bit"]
    if errors:  # refused (no private namespace, no root): unknown with the reason
        assert fault_bit["verdict"] == "unknown" and fault_bit["reason"]
        return
    assert_every_fault_played(result.run_dir, rows)
    if all(r["bit"] for r in evidence):
        assert report["exit_code"] == EXIT_PASS, json.dumps(report["invariants"], indent=1)[:4000]
        return
    assert report["exit_code"] == 2  # a fault that did not bite leaves the run unknown, never pass or fail
    assert fault_bit["verdict"] == "unknown" and fault_bit["reason"], fault_bit
    apply = next(r for r in evidence if detail(r)["stage"] == "apply")
    traffic = next(c for c in detail(apply)["checks"] if c["what"].startswith("traffic between"))
    assert traffic["ok"] is False and traffic["observed"]["misrouted"], traffic
    others = {i: v["verdict"] for i, v in verdicts(report).items() if i != "meta.fault_bit"}
    assert set(others.values()) == {"pass"}, others  # the broker itself kept every promise


def test_heal_all_heals_a_fault_still_active_at_the_workload_end(tmp_path):
    """The final phase: a client fault whose end lies after the workload is healed early by heal_all,
    which the executor still plays on its loop (run_alongside), before the drain; the run is complete."""
    import dataclasses

    from properties.generate import make_plan
    from properties.plan import FaultSlot

    path = find_scenario("subscriber-flapping")
    plan = make_plan(load_scenario(path), SEED)
    duration = 5.0
    slot = FaultSlot("f01-client_flap", "client_flap", "test_sub_client_0_0", 1.5, duration + 30.0,
                     {"mode": "abrupt", "reconnect": True, "clean_start": False, "node": "other"})
    short = dataclasses.replace(plan, duration_s=duration, faults=(slot,),
                                publishes=tuple(p for p in plan.publishes if p.offset_s < duration))
    result = run_scenario(path, SEED, tmp_path, check=False, plan=short)
    rows = rows_of(result.run_dir)
    phases = {detail(r)["phase"]: r for r in rows if r["kind"] == Kind.PHASE}
    heal = next(r for r in rows if r["kind"] == Kind.FAULT_HEAL)
    assert detail(heal)["early"] is True
    assert phases[Phase.HEAL_ALL]["seq"] > heal["seq"] > phases[Phase.WORKLOAD_END]["seq"]
    evidence = [r for r in rows if r["kind"] == Kind.FAULT_EVIDENCE]
    assert [detail(r)["stage"] for r in evidence] == ["apply", "heal"] and all(r["bit"] for r in evidence)
    reconnect = next(r for r in rows if r["kind"] == Kind.CONNECT and r["fault_id"] == slot.fault_id)
    assert reconnect["seq"] < phases[Phase.DRAIN_START]["seq"] and reconnect["session_present"] is True
    assert detail(phases[Phase.HEAL_ALL])["outcomes"] == {slot.fault_id: "healed"}
    assert result.summary["drain"]["reason"] == "quiet"
