"""`ordeal run` end to end on real brokers: Mosquitto (external, black box) and the reference broker
(local topology, white box).  Checks the history's own consistency, not the broker's verdicts (that is
spark_checkers' job): one outcome per publish, every delivery traceable to a publish, summary = history,
a complete manifest, and no process left behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from contracts.exit_codes import EXIT_PASS
from contracts.history_schema import Kind, Phase
from contracts.scenario import find_scenario
from harness.history import read_history, read_manifest
from harness.run import run_scenario

pytestmark = pytest.mark.integration

OUTCOMES = {Kind.PUBLISH_ACK, Kind.PUBLISH_FAIL, Kind.PUBLISH_INDETERMINATE}


@pytest.fixture
def out_dir():
    """A run output directory every user can traverse (Mosquitto drops root and must reach its data)."""
    path = Path(tempfile.mkdtemp(prefix="ordeal-run-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def acks_not_sent(rows) -> int:
    """Acks paho had queued but not written when their connection ended (disconnect detail acks_not_sent)."""
    return sum(len(json.loads(r["detail"]).get("acks_not_sent", [])) for r in rows
               if r["kind"] == Kind.DISCONNECT and r["detail"])


def assert_history_consistent(run_dir: Path) -> list[dict]:
    manifest = read_manifest(run_dir / "history")
    assert manifest["complete"] is True, manifest
    rows = read_history(run_dir / "history").to_pylist()
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    phases = [json.loads(r["detail"])["phase"] for r in rows if r["kind"] == Kind.PHASE]
    assert phases == [Phase.RUN_START, Phase.WORKLOAD_START, Phase.WORKLOAD_END, Phase.HEAL_ALL,
                      Phase.DRAIN_START, Phase.DRAIN_END, Phase.SNAPSHOT_DONE, Phase.RUN_END]

    invokes = {(r["publisher"], r["pub_seq"]): r for r in rows if r["kind"] == Kind.PUBLISH_INVOKE}
    plan = json.loads((run_dir / "plan.json").read_text())
    assert len(invokes) == len(plan["publishes"])
    outcomes = Counter((r["publisher"], r["pub_seq"]) for r in rows if r["kind"] in OUTCOMES)
    assert set(outcomes) == set(invokes) and set(outcomes.values()) == {1}, "exactly one outcome per publish"

    deliveries = [r for r in rows if r["kind"] == Kind.DELIVERY]
    assert deliveries
    for delivery in deliveries:
        key = (delivery["publisher"], delivery["pub_seq"])
        assert key in invokes, f"delivery {key} matches no publish"
        assert delivery["body_hash"] == invokes[key]["body_hash"]
        assert delivery["topic"] == invokes[key]["topic"]
        assert delivery["packet_id"] and 1 <= delivery["packet_id"] <= 65535
    acks_sent = Counter((r["client"], r["packet_id"]) for r in rows if r["kind"] == Kind.DELIVERY_ACK_SENT)
    # every QoS > 0 delivery is acknowledged, except those that arrived on a connection the harness was
    # already closing (a DISCONNECT queued before them), which say so, and those whose ack was still in paho's
    # queue when the connection ended (named by the disconnect row)
    closing = [d for d in deliveries if d["detail"] and "not_acked" in json.loads(d["detail"])]
    assert sum(acks_sent.values()) == sum(1 for d in deliveries if d["qos"] > 0) - len(closing) - acks_not_sent(rows)

    summary = json.loads((run_dir / "summary.json").read_text())
    kinds = Counter(r["kind"] for r in rows)
    counts = summary["counts"]
    assert counts["published"] == kinds[Kind.PUBLISH_INVOKE] == len(invokes)
    assert counts["acked"] == kinds[Kind.PUBLISH_ACK]
    assert counts["failed"] == kinds[Kind.PUBLISH_FAIL]
    assert counts["indeterminate"] == kinds[Kind.PUBLISH_INDETERMINATE]
    assert counts["delivered"] == len(deliveries)
    assert counts["rows"] == len(rows) == manifest["rows"]
    assert summary["drain"]["reason"] == "quiet"
    drain_end = [json.loads(r["detail"]) for r in rows if r["kind"] == Kind.PHASE
                 and json.loads(r["detail"])["phase"] == "drain_end"]
    assert drain_end and drain_end[0]["outstanding"] == summary["drain"]["outstanding"]

    # A correct broker without faults: every acknowledged publish reached its subscriber.
    delivered = {(d["publisher"], d["pub_seq"]) for d in deliveries}
    acked = {(r["publisher"], r["pub_seq"]) for r in rows if r["kind"] == Kind.PUBLISH_ACK}
    assert acked and not acked - delivered, f"acked but never delivered: {sorted(acked - delivered)[:5]}"
    # ... so nothing was left outstanding and the short quiet rule ended the drain (harness/drain.py).
    assert summary["drain"]["ended_by"] == "quiet" and summary["drain"]["outstanding"] == 0, summary["drain"]
    return rows


def node_pids(rows: list[dict]) -> set[int]:
    pids = set()
    for r in rows:
        if r["kind"] == Kind.NODE_EVENT:
            pid = json.loads(r["detail"]).get("pid")
            if pid:
                pids.add(pid)
    return pids


def test_mosquitto_smoke_gives_a_complete_black_box_history(out_dir: Path):
    result = run_scenario(find_scenario("mosquitto-smoke"), 1, out_dir, check=False)
    assert result.exit_code == EXIT_PASS, result.summary
    rows = assert_history_consistent(result.run_dir)
    assert not any(r["kind"] == Kind.SESSION_SNAPSHOT for r in rows), "a black box has no white-box rows"
    connects = [r for r in rows if r["kind"] == Kind.CONNECT and r["client"].startswith("test_sub")]
    assert any(r["session_present"] for r in connects), "persistent sessions are resumed"
    disconnects = [r for r in rows if r["kind"] == Kind.DISCONNECT]
    assert any(r["abrupt"] for r in disconnects) and any(not r["abrupt"] for r in disconnects)
    assert (result.run_dir / "mosquitto.conf").read_text().startswith("listener ")
    pids = node_pids(rows)
    assert pids and not any(pid_alive(p) for p in pids)


def test_both_mqtt_versions_are_exercised(out_dir: Path):
    result = run_scenario(find_scenario("mosquitto-smoke"), 3, out_dir, check=False)
    rows = assert_history_consistent(result.run_dir)
    assert {r["protocol"] for r in rows if r["kind"] == Kind.DELIVERY} == {4, 5}
    assert {r["protocol"] for r in rows if r["kind"] == Kind.PUBLISH_INVOKE} == {4, 5}


def test_reference_broker_smoke_with_white_box_snapshots(out_dir: Path):
    result = run_scenario(find_scenario("p2p-smoke"), 1, out_dir, check=False)
    assert result.exit_code == EXIT_PASS, result.summary
    rows = assert_history_consistent(result.run_dir)
    every_snapshot = [r for r in rows if r["kind"] == Kind.SESSION_SNAPSHOT]
    probes = [r for r in every_snapshot if "before_reconnect" in (r["detail"] or "")]
    snapshots = [r for r in every_snapshot if r not in probes]
    # The queue-size probe before each resume (here: the drain's reconnect of every subscriber).
    assert {r["client"] for r in probes} == {f"test_sub_client_{i}_0" for i in range(3)}
    assert all(r["last_packet_id"] is None and r["zset_size"] >= 0 for r in probes)
    assert sorted(r["client"] for r in snapshots) == [f"test_sub_client_{i}_0" for i in range(3)]
    for snap in snapshots:  # everything was delivered and acknowledged: nothing stays in Redis
        assert snap["zset_size"] == 0 and snap["orphan_payloads"] == 0 and snap["dangling_refs"] == 0
        assert snap["last_packet_id"] > 0
    topology = json.loads((result.run_dir / "topology.json").read_text())
    pids = {n["pid"] for n in topology["nodes"] if n.get("pid")}
    assert pids and not any(pid_alive(p) for p in pids)


def test_reference_broker_wraparound_preset(out_dir: Path):
    result = run_scenario(find_scenario("p2p-wraparound"), 1, out_dir, check=False)
    rows = assert_history_consistent(result.run_dir)
    ids = [r["packet_id"] for r in rows if r["kind"] == Kind.DELIVERY]
    assert max(ids) > 65500 and min(ids) < 100, "deliveries cross the 65535 -> 1 wrap"


def test_a_stored_plan_with_a_fault_slot_is_played_by_the_nemesis(out_dir: Path):
    """The run hands the plan's fault slots to faults/ (the nemesis) and heals them before the drain.
    The reference broker is killed for 1.5 s; a correct broker still delivers every acknowledged publish."""
    import dataclasses

    from contracts.scenario import load_scenario
    from properties.generate import make_plan
    from properties.plan import FaultSlot

    path = find_scenario("p2p-smoke")
    plan = make_plan(load_scenario(path), 11)
    plan = dataclasses.replace(plan, faults=(FaultSlot("kill-broker", "process_kill", "broker:1", 2.0, 3.5),))
    result = run_scenario(path, 11, out_dir, check=False, plan=plan)
    assert json.loads((result.run_dir / "plan.json").read_text())["faults"][0]["fault_id"] == "kill-broker"
    rows = assert_history_consistent(result.run_dir)
    fault_kinds = [r["kind"] for r in rows if r["fault_id"] == "kill-broker"]
    assert Kind.FAULT_START in fault_kinds and Kind.FAULT_HEAL in fault_kinds, fault_kinds
    assert Kind.FAULT_ERROR not in fault_kinds
    evidence = [r for r in rows if r["kind"] == Kind.FAULT_EVIDENCE and r["fault_id"] == "kill-broker"]
    assert evidence and all(r["bit"] for r in evidence)
    lost = [r for r in rows if r["kind"] == Kind.DISCONNECT and r["initiator"] == "server"]
    assert lost, "clients saw the broker die"


MIXED = """
[scenario]
name = "mosquitto-mixed"
duration_s = 4
drain_quiet_s = 1.5
drain_timeout_s = 20

[target]
kind = "external"
name = "mosquitto"
start = ["mosquitto", "-c", "{run_dir}/mosquitto.conf"]
config_file = "mosquitto.conf"
data_owner = "mosquitto"
config_text = '''
listener {port} {host}
allow_anonymous true
persistence true
persistence_location {data_dir}/
max_queued_messages 100000
log_dest stdout
'''

[workload]
pattern = "fan-in"
publishers = 3
subscribers = 2
rate_per_publisher = 10
qos_mix = { qos0 = 1, qos1 = 1, qos2 = 1 }
subscription_qos = 2
protocol_mix = { mqtt311 = 1, mqtt5 = 1 }
expiry_mix = { none = 1, "60" = 1 }

[subscribers]
disconnects_per_minute = 20
offline_s = [0.3, 0.8]
"""


def test_fan_in_with_every_qos_and_expiry(out_dir: Path, tmp_path: Path):
    scenario = tmp_path / "mosquitto-mixed.toml"
    scenario.write_text(MIXED)
    result = run_scenario(scenario, 4, out_dir, check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    assert read_manifest(result.run_dir / "history")["complete"] is True
    invokes = {(r["publisher"], r["pub_seq"]): r for r in rows if r["kind"] == Kind.PUBLISH_INVOKE}
    outcomes = Counter((r["publisher"], r["pub_seq"]) for r in rows if r["kind"] in OUTCOMES)
    assert set(outcomes) == set(invokes) and set(outcomes.values()) == {1}
    assert {r["qos"] for r in invokes.values()} == {0, 1, 2}
    deliveries = [r for r in rows if r["kind"] == Kind.DELIVERY]
    assert {d["qos"] for d in deliveries} == {0, 1, 2}
    for d in deliveries:
        sent = invokes[(d["publisher"], d["pub_seq"])]
        assert d["body_hash"] == sent["body_hash"] and d["qos"] == sent["qos"]
        if d["protocol"] == 5 and sent["expiry_s"] is not None:
            assert d["remaining_expiry_s"] is not None and d["remaining_expiry_s"] <= sent["expiry_s"]
    # fan-in: each subscriber gets every publisher's stream
    for client in ("test_sub_client_0_0", "test_sub_client_1_0"):
        assert {d["publisher"] for d in deliveries if d["client"] == client} == {
            f"test_pub_client_{j}_0" for j in range(3)}
    acks = [r for r in rows if r["kind"] == Kind.DELIVERY_ACK_SENT]
    closing = [d for d in deliveries if d["detail"] and "not_acked" in json.loads(d["detail"])]
    assert len(acks) == sum(1 for d in deliveries if d["qos"] > 0) - len(closing) - acks_not_sent(rows)
    acked_qos12 = {k for k, r in invokes.items() if r["qos"] > 0} & {
        (r["publisher"], r["pub_seq"]) for r in rows if r["kind"] == Kind.PUBLISH_ACK}
    for client in ("test_sub_client_0_0", "test_sub_client_1_0"):
        got = {(d["publisher"], d["pub_seq"]) for d in deliveries if d["client"] == client}
        assert not acked_qos12 - got, f"{client} misses acknowledged QoS>0 messages"


def test_an_unreachable_broker_gives_connect_fail_rows_and_a_clear_error(tmp_path: Path):
    """Non-blocking connects: a refused port surfaces as connect_fail rows (and retries), never a hang."""
    from contracts.scenario import load_scenario
    from harness.executor import Executor, ExecutorError, ExecutorSettings
    from harness.external_target import free_port
    from harness.history import HistoryRecorder
    from properties.generate import make_plan

    plan = make_plan(load_scenario(find_scenario("p2p-smoke")), 1)
    recorder = HistoryRecorder(tmp_path / "history", run_id="unreachable")
    port = free_port("127.0.0.1")  # nothing listens there
    executor = Executor(plan, [("127.0.0.1", port, "nobody")], recorder,
                        settings=ExecutorSettings(ready_timeout_s=1.5, reconnect_backoff_s=0.2))
    try:
        with pytest.raises(ExecutorError, match=f"no client could connect to \\['127.0.0.1:{port}'\\]"):
            executor.connect_all()
    finally:
        executor.close()
        recorder.close()
    rows = read_history(tmp_path / "history").to_pylist()
    fails = [r for r in rows if r["kind"] == Kind.CONNECT_FAIL]
    assert len(fails) >= len(plan.clients) * 2, "every client retried"
    assert not any(r["kind"] == Kind.CONNECT for r in rows)


def test_a_target_that_cannot_start_ends_the_run_unknown_with_the_reason(out_dir: Path, tmp_path: Path):
    scenario = tmp_path / "missing.toml"
    scenario.write_text("[scenario]\nname='missing'\nduration_s=1\n[target]\nkind='external'\n"
                        "start=['no-such-broker-binary', '-c', '{run_dir}/x.conf']\n")
    result = run_scenario(scenario, 1, out_dir, check=False)
    assert result.exit_code == 2
    assert "'no-such-broker-binary' is not installed" in result.summary["error"]
    assert read_manifest(result.run_dir / "history")["complete"] is False
    assert (result.run_dir / "logs" / "harness-error.log").read_text().startswith("Traceback")


def test_subscribers_move_between_two_reference_broker_nodes(out_dir: Path, tmp_path: Path):
    text = find_scenario("p2p-smoke").read_text()
    scenario = tmp_path / "p2p-two-nodes.toml"
    scenario.write_text(text.replace('name = "p2p-smoke"', 'name = "p2p-two-nodes"')
                        .replace("broker_nodes = 1", "broker_nodes = 2"))
    result = run_scenario(scenario, 2, out_dir, check=False)
    rows = assert_history_consistent(result.run_dir)
    nodes = {r["node"] for r in rows if r["kind"] == Kind.CONNECT and r["client"].startswith("test_sub")}
    assert nodes == {"broker-1", "broker-2"}
    resumed = [r for r in rows if r["kind"] == Kind.CONNECT and r["client"].startswith("test_sub")
               and r["session_present"]]
    assert resumed, "sessions resume on whichever node the subscriber reconnects to"


def test_replay_command_hook_and_a_check_recorded_later(out_dir: Path):
    """run_scenario(replay_command=...) shows the caller's command; a --no-check run is checked afterwards
    with check_runs_later (one Spark session for many runs) and its summary.json gets the verdict."""
    from ordeal.pipeline import check_runs_later, record_check

    result = run_scenario(find_scenario("mosquitto-smoke"), 4, out_dir, check=False,
                          replay_command="ordeal replay {run_dir}")
    assert result.summary["replay"] == f"ordeal replay {result.run_dir}"
    rows = read_history(result.run_dir / "history").to_pylist()
    run_start = next(json.loads(r["detail"]) for r in rows if r["kind"] == Kind.PHASE
                     and json.loads(r["detail"])["phase"] == "run_start")
    assert run_start["replay"] == result.summary["replay"]
    assert result.summary["checked"] is False and result.summary["run_exit_code"] == EXIT_PASS

    [code] = check_runs_later([result.run_dir])
    summary = json.loads((result.run_dir / "summary.json").read_text())
    report = json.loads((result.run_dir / "report.json").read_text())
    assert summary["checked"] is True and summary["check"] == {"exit_code": report["exit_code"]}
    assert code == summary["exit_code"] == report["exit_code"], report.get("verdict")

    broken = record_check(result.run_dir, None, failure="the checker failed: RuntimeError: boom")
    assert broken["exit_code"] == 2 and broken["checked"] is False and "boom" in broken["check"]
    again = record_check(result.run_dir, EXIT_PASS)
    assert again["exit_code"] == EXIT_PASS and again["run_exit_code"] == EXIT_PASS
