"""health.unresponsive from the history alone (spark_checkers/timeline.py): a broker node's run of failed health
probes (harness/death_watch.py "unresponsive" / "responsive" node events) is a violation when it lasts longer
than its grace outside every planned fault; each rule below has its planted anomaly and near-miss twins (a
cover that must excuse it: too strict otherwise; one that must not: too loose otherwise).  And the watch
itself, on a fake node and clock: it records a stretch once it reaches the grace, its end, and nothing for a
node down on purpose.  On a real broker: tests/integration/test_target_death.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from contracts.history_schema import Kind, Phase
from contracts.invariants import RECOVERY_AFTER_FAULT_S
from harness.death_watch import DeathWatch, ProbeAnswer
from spark_checkers.guarantees import Guarantees
from spark_checkers.rules.catalog import explain
from spark_checkers.timeline import build_timeline

S = 1_000_000
GRACE_S = 10.0
PROBE = "MQTT CONNECT 127.0.0.2:1883"


class Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, t_s: float, kind: str, detail: dict | None = None, **columns) -> Rows:
        self.rows.append({"seq": len(self.rows) + 1, "t_mono_us": int(t_s * S), "kind": kind,
                          "detail": json.dumps(detail) if detail is not None else None, **columns})
        return self

    def stretch(self, node: str, since_s: float, reported_s: float, answered_s: float | None) -> Rows:
        self.add(reported_s, Kind.NODE_EVENT, {"action": "unresponsive", "since_us": int(since_s * S),
                                               "grace_s": GRACE_S, "probe": PROBE, "error": "no answer within 2 s",
                                               "log_tail": ["1700000000: mosquitto version 2.0 running", ""]},
                 node=node)
        if answered_s is not None:
            self.add(answered_s, Kind.NODE_EVENT, {"action": "responsive", "since_us": int(since_s * S),
                                                   "probe": PROBE}, node=node)
        return self

    def fault(self, fault_id: str, kind: str, node: str | None, start_s: float, heal_s: float,
              healed_s: float) -> Rows:
        self.add(start_s, Kind.FAULT_START, {"target": f"node:{node}"}, fault_id=fault_id, fault_kind=kind)
        self.add(start_s + 0.01, Kind.FAULT_EVIDENCE, {"stage": "apply"}, fault_id=fault_id, fault_kind=kind,
                 node=node, bit=True)
        self.add(heal_s, Kind.FAULT_HEAL, {}, fault_id=fault_id, fault_kind=kind, node=node)
        self.add(healed_s, Kind.FAULT_EVIDENCE, {"stage": "heal"}, fault_id=fault_id, fault_kind=kind, node=node,
                 bit=True)
        return self

    def timeline(self, end_s: float = 40.0, guarantees: Guarantees | None = None):
        self.add(0.0, Kind.PHASE, {"phase": Phase.RUN_START})
        self.add(end_s, Kind.PHASE, {"phase": Phase.RUN_END})
        rows = sorted(self.rows, key=lambda r: (r["t_mono_us"], r["seq"]))
        for seq, row in enumerate(rows, start=1):
            row["seq"] = seq
        return build_timeline("t", rows, guarantees or Guarantees())


def _found(timeline) -> list[dict]:
    return timeline.violations.get("health.unresponsive", [])


def test_a_node_that_stops_answering_with_no_fault_planned_is_a_violation_named_in_words():
    timeline = Rows().stretch("mosquitto", 3.0, 13.5, 17.0).timeline()
    (witness,) = _found(timeline)
    assert witness["node"] == "mosquitto" and witness["t"] == witness["t_from"] == 3 * S and witness["t_to"] == 17 * S
    words = explain("health.unresponsive", witness, timeline)
    assert words.startswith("node mosquitto stopped answering at 3.000 s, until 17.000 s"), words
    assert PROBE in words and "no answer within 2 s" in words and "mosquitto version 2.0 running" in words


def test_a_node_that_never_answers_again_is_named_by_a_timed_out_drain():
    rows = Rows().stretch("mosquitto", 3.0, 13.5, None)
    rows.add(30.0, Kind.PHASE, {"phase": Phase.DRAIN_END, "reason": "timeout", "outstanding": 4, "elapsed_s": 8})
    timeline = rows.timeline()
    (witness,) = _found(timeline)
    assert witness["t_to"] is None
    assert "never answered again" in explain("health.unresponsive", witness, timeline)
    (reason,) = [r for r in timeline.incomplete if "drain timed out" in r]
    assert "node mosquitto had stopped answering its probe (MQTT CONNECT" in reason, reason


def test_near_miss_a_planned_pause_of_the_node_covers_it():
    timeline = Rows().fault("f1", "process_pause", "mosquitto", 2.0, 15.0, 15.1).stretch(
        "mosquitto", 2.5, 12.5, 15.2).timeline()
    assert not _found(timeline)


def test_near_miss_a_restart_covers_the_node_until_its_heal_is_done():
    """A kill healed by a restart: the node boots after the fault_heal row, and the heal waits until it is ready
    (its heal evidence comes later): the boot is covered, however long it takes."""
    timeline = Rows().fault("f1", "process_kill", "mosquitto", 2.0, 4.0, 30.0).stretch(
        "mosquitto", 4.2, 14.5, 30.5).timeline()
    assert not _found(timeline)


def test_near_miss_a_fault_of_what_the_node_depends_on_covers_it():
    timeline = Rows().fault("f1", "process_pause", "redis-7001", 2.0, 20.0, 20.1).stretch(
        "broker-1", 3.0, 13.0, 20.5).timeline()
    assert not _found(timeline)


def test_near_miss_the_final_heal_covers_it():
    rows = Rows().fault("f1", "process_kill", "broker-1", 2.0, 4.0, 5.0)
    rows.add(10.0, Kind.PHASE, {"phase": Phase.WORKLOAD_END}).add(40.0, Kind.PHASE, {"phase": Phase.HEAL_ALL})
    assert not _found(rows.stretch("broker-1", 11.0, 21.0, 39.0).timeline(end_s=60.0))


def test_near_miss_outlasting_the_cover_by_less_than_the_grace_is_covered():
    timeline = Rows().fault("f1", "process_pause", "mosquitto", 2.0, 15.0, 15.1).stretch(
        "mosquitto", 2.5, 12.5, 24.0).timeline()
    assert not _found(timeline)


def test_a_client_fault_covers_nothing():
    timeline = Rows().fault("f1", "client_flap", None, 2.0, 20.0, 20.1).stretch(
        "mosquitto", 3.0, 13.0, 19.0).timeline()
    assert len(_found(timeline)) == 1


def test_outlasting_the_cover_by_more_than_the_recovery_is_a_violation_from_where_the_cover_ends():
    """It stopped answering under the pause: once the pause is over it has RECOVERY_AFTER_FAULT_S to answer again."""
    timeline = Rows().fault("f1", "process_pause", "mosquitto", 2.0, 5.0, 5.1).stretch(
        "mosquitto", 2.5, 12.5, 5.1 + RECOVERY_AFTER_FAULT_S + 1).timeline(end_s=100.0)
    (witness,) = _found(timeline)
    assert witness["t"] == int(5.1 * S) and witness["t_from"] == int(2.5 * S)
    assert "outside every planned fault from 5.100 s" in explain("health.unresponsive", witness, timeline)


def test_near_miss_a_recovery_after_the_fault_within_its_allowance_is_covered():
    """rabbitmq-cluster-partition-1: the minority node (pause_minority) answered 10.5 s after the partition healed."""
    timeline = Rows().fault("f1", "net_partition", "rabbit3", 2.0, 18.0, 18.05).stretch(
        "rabbit3", 12.0, 22.0, 28.55).timeline()
    assert not _found(timeline)


def test_a_fault_that_starts_after_the_node_stopped_answering_for_the_grace_does_not_cover_it():
    timeline = Rows().fault("f1", "process_pause", "mosquitto", 14.0, 20.0, 20.1).stretch(
        "mosquitto", 3.0, 13.0, 25.0).timeline()
    assert len(_found(timeline)) == 1


def test_a_fault_on_a_node_outside_the_target_covers_nothing():
    guarantees = Guarantees(target_kind="external", target_name="mosquitto", target_nodes=("mosquitto",))
    timeline = Rows().fault("f1", "process_pause", "elsewhere", 2.0, 20.0, 20.1).stretch(
        "mosquitto", 3.0, 13.0, 19.0).timeline(guarantees=guarantees)
    assert len(_found(timeline)) == 1


# -- the watch ----------------------------------------------------------------------------------------------

@dataclass
class FakeRecorder:
    t_us: int = 0
    rows: list[tuple[str, dict]] = field(default_factory=list)

    def now(self) -> tuple[int, int]:
        return self.t_us, self.t_us

    def record(self, kind: str, *, node: str, detail: dict) -> None:
        self.rows.append((node, detail))


@dataclass
class FakeNode:
    name: str = "mosquitto"
    log_path: Path = Path("/nonexistent/mosquitto.log")
    down_on_purpose: bool = False
    alive: bool = True

    def is_alive(self) -> bool:
        return self.alive


def _watch(answers: dict[str, str | None]) -> tuple[DeathWatch, FakeRecorder]:
    recorder = FakeRecorder()
    watch = DeathWatch(lambda: [], recorder, probed=lambda: [],
                       probe=lambda node: ProbeAnswer(PROBE, answers.get(node.name)), grace_s=GRACE_S)
    return watch, recorder


def test_the_watch_records_a_stretch_once_it_reaches_the_grace_and_its_end():
    answers: dict[str, str | None] = {"mosquitto": "no answer within 2 s"}
    watch, recorder = _watch(answers)
    node = FakeNode()
    for t_s in (2, 4, 6, 8, 10, 12, 14):
        recorder.t_us = t_s * S
        watch.probe_once(node)
    (unresponsive,) = recorder.rows
    assert unresponsive[0] == "mosquitto" and unresponsive[1]["action"] == "unresponsive"
    assert unresponsive[1]["since_us"] == 2 * S and unresponsive[1]["grace_s"] == GRACE_S
    assert unresponsive[1]["error"] == "no answer within 2 s" and unresponsive[1]["probe"] == PROBE
    answers["mosquitto"] = None
    recorder.t_us = 16 * S
    watch.probe_once(node)
    assert recorder.rows[-1][1] == {"action": "responsive", "since_us": 2 * S, "probe": PROBE, "unresponsive_s": 14.0}


def test_the_watch_forgets_a_short_stretch_and_never_probes_a_node_down_on_purpose():
    answers: dict[str, str | None] = {"mosquitto": "no answer within 2 s"}
    watch, recorder = _watch(answers)
    node = FakeNode()
    for t_s in (2, 4, 6):
        recorder.t_us = t_s * S
        watch.probe_once(node)
    answers["mosquitto"] = None
    recorder.t_us = 8 * S
    watch.probe_once(node)  # answered within the grace: nothing to record
    answers["mosquitto"] = "no answer within 2 s"
    node.down_on_purpose = True  # killed by the plan: the exit watch's, not the probe's
    for t_s in range(10, 40, 2):
        recorder.t_us = t_s * S
        watch.probe_once(node)
    assert recorder.rows == []


def test_a_probe_that_raises_is_a_failed_probe_in_its_words():
    recorder = FakeRecorder()

    def probe(node):
        raise RuntimeError("the broker refused the probe's credentials")

    watch = DeathWatch(lambda: [], recorder, probed=lambda: [], probe=probe, grace_s=0.0)
    watch.probe_once(FakeNode())
    assert recorder.rows[0][1]["error"] == "RuntimeError: the broker refused the probe's credentials"
