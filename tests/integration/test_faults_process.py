"""Process faults and Redis failover against real processes: evidence recorded, effect seen, heal seen.

This module disturbs nodes (kills, pauses, failovers), so it runs on a topology of its own rather than
the shared session one.  After each test the topology is healthy again (the test heals and waits)."""

from __future__ import annotations

import time

import pytest
import redis

from faults import probes
from faults.base import FaultContext, FaultNotApplicable
from faults.catalog import build_fault, validate_spec
from faults.redis_cluster_view import ClusterView, client_messages_key
from harness.local.host_topology import LocalTopology
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration

CLIENT = "test_sub_client_0_0"


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory):
    """Redis Cluster (3+3) + Tansu on its S3 server, owned by this module."""
    topology = LocalTopology(TopologyConfig(), tmp_path_factory.mktemp("faults-process"))
    topology.start()
    try:
        yield topology
    finally:
        topology.stop()


@pytest.fixture
def ctx(topo: LocalTopology):
    rows: list[tuple[str, dict]] = []
    context = FaultContext(topo, seed=7, record=lambda kind, **columns: rows.append((kind, columns)),
                           effect_timeout_s=10.0, ready_timeout_s=30.0)
    context.rows = rows  # type: ignore[attr-defined]
    yield context
    # Leave the topology as we found it, whatever the test did.
    for node in topo.nodes():
        if node.is_alive() and probes.is_stopped(node.pid):
            node.resume()
        elif not node.is_alive():
            node.start()
    topo.redis.wait_ready(30)


def _fault(kind: str, target: str | None = None, **params):
    return build_fault(validate_spec({"id": f"{kind}-1", "kind": kind, "target": target, "params": params}))


def test_kill_master_of_client_slot_promotes_its_replica(topo: LocalTopology, ctx: FaultContext):
    expected = topo.redis.master_for_key(client_messages_key(CLIENT))
    fault = _fault("process_kill", f"redis-master-of:{CLIENT}")
    began = time.monotonic()
    evidence = fault.apply(ctx)
    took = time.monotonic() - began
    assert fault.node is expected
    assert evidence.bit, evidence.to_dict()
    checks = {check.what: check for check in evidence.checks}
    assert set(checks) == {"pid gone", "port refuses", "replica promoted"}
    assert not expected.is_alive() and probes.port_state(expected.host, expected.port) == "refuses"
    # The effect, seen independently of the fault's own checks: another node now serves the slot.
    new_master = ClusterView.read(topo, exclude=(expected.name,)).master_of_key(client_messages_key(CLIENT))
    assert new_master.address != f"{expected.host}:{expected.port}"
    assert ("node_event", {"node": expected.name, "fault_id": "process_kill-1", "detail": {
        "action": "kill", "by": "nemesis", "pid": evidence.checks[0].observed["pid"]}}) in ctx.rows
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert expected.is_alive()
    topo.redis.wait_ready(30)
    assert not expected.is_master()  # it came back as a replica of the promoted node
    print(f"kill+promotion evidence in {took:.2f} s")


def test_graceful_stop_of_a_master_also_ends_in_a_promotion(topo: LocalTopology, ctx: FaultContext):
    fault = _fault("process_stop", "redis-random-master", timeout_s=5)
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    assert [check.what for check in evidence.checks] == ["pid gone", "port refuses", "replica promoted"]
    assert fault.heal(ctx).bit
    topo.redis.wait_ready(30)
    assert not fault.node.is_master()


def test_pause_replica_shows_state_T_then_runs_again(topo: LocalTopology, ctx: FaultContext):
    fault = _fault("process_pause", "redis-random-replica")
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    node = fault.node
    assert node.paused  # the handle knows it is paused
    assert probes.proc_state(node.pid) == "T"
    with pytest.raises(redis.TimeoutError):  # the effect: it does not answer
        node.client(timeout=0.3).ping()
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert node.client(timeout=1).ping()


def test_random_replica_choice_is_seeded(topo: LocalTopology, ctx: FaultContext):
    from faults.selectors import resolve_node

    picks = {resolve_node(topo, "redis-random-replica", ctx.rng_for("same-id")).name for _ in range(5)}
    assert len(picks) == 1


def test_stop_kafka_gracefully_then_start(topo: LocalTopology, ctx: FaultContext):
    fault = _fault("process_stop", "kafka", timeout_s=5)
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    assert [check.what for check in evidence.checks] == ["pid gone", "port refuses"]
    assert probes.port_state(topo.kafka.host, topo.kafka.port) == "refuses"
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert probes.port_state(topo.kafka.host, topo.kafka.port) == "accepts"


def test_restart_kafka_runs_a_new_process(topo: LocalTopology, ctx: FaultContext):
    old_pid = topo.kafka.pid
    fault = _fault("process_restart", "kafka")
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    assert topo.kafka.pid != old_pid and probes.pid_gone(old_pid)
    assert fault.heal(ctx).bit


def test_pause_storage_then_resume(topo: LocalTopology, ctx: FaultContext):
    fault = _fault("process_pause", "storage")
    assert fault.apply(ctx).bit
    assert probes.is_stopped(topo.storage.pid)
    assert fault.heal(ctx).bit
    assert not probes.is_stopped(topo.storage.pid)


def test_forced_failover_swaps_roles(topo: LocalTopology, ctx: FaultContext):
    master = topo.redis.master_for_key(client_messages_key(CLIENT))
    fault = _fault("redis_failover", f"redis-master-of:{CLIENT}")
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    assert fault.old_master is master
    assert fault.replica.is_master() and not master.is_master()  # the effect, asked of the nodes directly
    assert topo.redis.master_for_key(client_messages_key(CLIENT)) is fault.replica
    assert fault.heal(ctx).bit
    print(f"CLUSTER FAILOVER -> roles swapped in {evidence.checks[0].observed['waited_s']:.2f} s")


def test_fault_on_a_dead_node_is_not_applicable(topo: LocalTopology, ctx: FaultContext):
    node = topo.redis_nodes[0]
    node.kill()
    fault = _fault("process_pause", f"node:{node.name}")
    with pytest.raises(FaultNotApplicable, match="not running"):
        fault.apply(ctx)
    with pytest.raises(FaultNotApplicable, match="no node named 'nope'"):
        _fault("process_kill", "node:nope").apply(ctx)


def test_nemesis_plays_a_schedule_into_the_history_and_heals_all(topo: LocalTopology, tmp_path):
    import json

    from faults.nemesis import Nemesis, schedule_from_slots
    from harness.history import HistoryRecorder, read_history
    from properties.plan import FaultSlot

    recorder = HistoryRecorder(tmp_path / "history", run_id="nemesis-test")
    ctx = FaultContext(topo, seed=11, record=recorder.record, effect_timeout_s=10.0)
    schedule = schedule_from_slots([
        FaultSlot("pause-replica", "process_pause", "redis-random-replica", 0.1, 0.6),
        FaultSlot("kill-kafka", "process_kill", "kafka", 0.2, 0.8),
        FaultSlot("pause-storage", "process_pause", "storage", 0.3, 0.5),
        FaultSlot("too-late", "process_kill", "kafka", 60.0, 61.0),
    ])
    nemesis = Nemesis(schedule, ctx)
    nemesis.start()
    time.sleep(1.5)
    # Something outside the nemesis killed a node: the final phase must bring it back too.
    stray = next(node for node in topo.redis_nodes if not node.is_master())
    stray.kill()
    began = time.monotonic()
    summary = nemesis.heal_all()
    heal_all_s = time.monotonic() - began
    recorder.close()
    assert summary["started"] == [stray.name] and summary["errors"] == [], summary
    assert summary["outcomes"] == {"pause-replica": "healed", "kill-kafka": "healed",
                                   "pause-storage": "healed", "too-late": "cancelled"}
    assert stray.is_alive() and topo.redis.health().ok
    rows = read_history(tmp_path / "history").to_pylist()
    for fault_id in ("pause-replica", "kill-kafka", "pause-storage"):
        own = [row for row in rows if row["fault_id"] == fault_id and row["kind"].startswith("fault_")]
        stages = [(row["kind"], json.loads(row["detail"]).get("stage")) for row in own]
        assert stages == [("fault_start", None), ("fault_evidence", "apply"), ("fault_heal", None),
                          ("fault_evidence", "heal")], (fault_id, stages)
        assert all(row["bit"] for row in own if row["kind"] == "fault_evidence"), own
        assert own[1]["node"] is not None
    (late,) = [row for row in rows if row["fault_id"] == "too-late"]
    assert late["kind"] == "fault_error" and json.loads(late["detail"])["stage"] == "start"
    actions = [(row["node"], json.loads(row["detail"])["action"]) for row in rows if row["kind"] == "node_event"]
    assert ("kafka", "kill") in actions and ("kafka", "start") in actions and (stray.name, "start") in actions
    print(f"heal_all (restart one Redis replica, cluster ready): {heal_all_s:.2f} s")
