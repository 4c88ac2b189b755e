"""Network faults refuse, with the reason, wherever they could touch a network that is not the run's own;
the nemesis turns the refusal into a fault_error row (the run becomes unknown), never a silent skip."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from faults import network
from faults.base import FaultContext, FaultNotApplicable
from faults.catalog import build_fault, validate_spec
from faults.nemesis import Nemesis, schedule_from_slots


def _partition():
    return build_fault(validate_spec({"id": "p1", "kind": "net_partition",
                                      "params": {"a": "broker", "b": "redis"}}))


def _node(name: str, host: str, port: int):
    return SimpleNamespace(name=name, host=host, port=port)


# Plain data with the attributes a topology has; no process behind it (these faults must refuse first).
SHARED_ADDRESS_TOPOLOGY = SimpleNamespace(
    redis_nodes=[_node("redis-1", "127.0.0.1", 24001)], kafka=None, storage=None,
    brokers=[_node("broker-1", "127.0.0.1", 24002)])


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    with pytest.raises(FaultNotApplicable, match="need root.*uid 1000"):
        _partition().apply(FaultContext(SHARED_ADDRESS_TOPOLOGY))


def test_refuses_outside_the_runs_namespace(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.delenv(network.NETNS_MARKER, raising=False)
    with pytest.raises(FaultNotApplicable, match="private network namespace.*not started isolated"):
        _partition().apply(FaultContext(SHARED_ADDRESS_TOPOLOGY))


def test_refuses_a_namespace_with_real_interfaces(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.setenv(network.NETNS_MARKER, "private")
    monkeypatch.setattr(network, "interfaces", lambda: ["eth0", "lo"])
    with pytest.raises(FaultNotApplicable, match="interfaces eth0 besides lo"):
        _partition().apply(FaultContext(SHARED_ADDRESS_TOPOLOGY))


def test_refuses_groups_sharing_an_address(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.setenv(network.NETNS_MARKER, "private")
    monkeypatch.setattr(network, "interfaces", lambda: ["lo"])
    with pytest.raises(FaultNotApplicable, match="share address.*127.0.0.1"):
        _partition().apply(FaultContext(SHARED_ADDRESS_TOPOLOGY))


def test_nemesis_turns_a_refusal_into_a_fault_error_row(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    rows = []
    schedule = schedule_from_slots([{"fault_id": "p1", "kind": "net_partition", "target": "",
                                     "start_s": 0.0, "end_s": 0.1, "params": {"a": "broker", "b": "redis"}}])
    nemesis = Nemesis(schedule, FaultContext(SimpleNamespace(redis_nodes=[], brokers=[]),
                                             record=lambda kind, **columns: rows.append((kind, columns))))
    nemesis.start()
    assert nemesis.join(5)
    kinds = [kind for kind, _ in rows]
    assert kinds == ["fault_start", "fault_error"]
    error = rows[1][1]
    assert error["fault_id"] == "p1" and error["fault_kind"] == "net_partition"
    assert error["detail"]["stage"] == "apply" and "need root" in error["detail"]["reason"]
    assert nemesis.outcomes == {"p1": "error"}


def test_heal_all_before_a_start_offset_records_the_cancelled_fault():
    rows = []
    schedule = schedule_from_slots([{"fault_id": "late", "kind": "process_kill", "target": "kafka",
                                     "start_s": 30.0, "end_s": 31.0}])
    nemesis = Nemesis(schedule, FaultContext(SimpleNamespace(redis_nodes=[], brokers=[]),
                                             record=lambda kind, **columns: rows.append((kind, columns))))
    began = time.monotonic()
    nemesis.start()
    summary = nemesis.heal_all(join_timeout_s=5)
    assert time.monotonic() - began < 2  # the 30 s wait was cut short
    assert [kind for kind, _ in rows] == ["fault_error"]
    assert rows[0][1]["detail"]["stage"] == "start" and "before the fault's start offset" in \
        rows[0][1]["detail"]["reason"]
    assert summary["outcomes"] == {"late": "cancelled"} and summary["errors"] == []


def test_client_fault_without_a_player_is_an_error_not_a_skip():
    rows = []
    schedule = schedule_from_slots([{"fault_id": "c1", "kind": "client_flap", "target": "sub-1",
                                     "start_s": 0, "end_s": 0}])
    nemesis = Nemesis(schedule, FaultContext(SimpleNamespace(redis_nodes=[], brokers=[]),
                                             record=lambda kind, **columns: rows.append((kind, columns))))
    nemesis.start()
    assert nemesis.join(5)
    assert [kind for kind, _ in rows] == ["fault_error"]
    assert "client player" in rows[0][1]["detail"]["reason"]


def test_schedule_validation_names_the_problem():
    from faults.base import FaultSpecError

    with pytest.raises(FaultSpecError, match="start .*<= end"):
        schedule_from_slots([{"fault_id": "x", "kind": "process_kill", "target": "kafka",
                              "start_s": 5, "end_s": 1}])
    with pytest.raises(FaultSpecError, match="repeated: x"):
        schedule_from_slots([{"fault_id": "x", "kind": "process_kill", "target": "kafka", "start_s": 0,
                              "end_s": 1}] * 2)
    with pytest.raises(FaultSpecError, match="missing field start_s"):
        schedule_from_slots([{"fault_id": "x", "kind": "process_kill", "target": "kafka"}])


def _storage_topology(kafka_storage: str, killed: list[str]):
    from harness.topology_config import TopologyConfig

    storage = SimpleNamespace(name="s3", role="storage", host="127.0.0.1", port=24003, pid=4242,
                              is_alive=lambda: True, kill=lambda: killed.append("kill"),
                              stop=lambda timeout=None: killed.append("stop"), restart=lambda: killed.append("restart"))
    return SimpleNamespace(config=TopologyConfig(kafka_storage=kafka_storage), redis_nodes=[], kafka=None,
                           storage=storage, brokers=[])


@pytest.mark.parametrize("kind", ["process_kill", "process_stop", "process_restart"])
def test_a_kill_of_the_in_memory_storage_is_refused_before_it_happens(kind):
    """A plan that bypasses scenario validation (an edited plan.json) still cannot kill moto's log."""
    killed: list[str] = []
    fault = build_fault(validate_spec({"id": "f1", "kind": kind, "target": "storage"}))
    with pytest.raises(FaultNotApplicable, match=r"f1 .*of s3\): kafka_storage = 's3' .*loses the whole log"):
        fault.apply(FaultContext(_storage_topology("s3", killed)))
    assert killed == []
