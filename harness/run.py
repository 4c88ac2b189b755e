"""One run: scenario + seed → plan → target → execute → drain → snapshot → history → summary, as a chain of
phases (``run_scenario``: prepare, start the target, connect, play, heal, drain, read storage, tear down,
summarise).

The run stage stops here, once the history and summary.json are written: checking and reporting are the
next stages, joined to this one by ordeal/pipeline.py (no import of spark_checkers from here).

The run directory (docs/architecture.md): scenario.toml, scenario.json, plan.json, topology.json,
history/, logs/, data/, summary.json.  Everything the run started is stopped in ``finally`` blocks; a
SIGTERM or Ctrl-C ends the run early with an incomplete history (manifest ``complete: false``).  A SIGKILL
leaves the last flushed part files and an incomplete manifest; the nodes die with the harness (they are
started with PR_SET_PDEATHSIG by harness/node.py).
"""

from __future__ import annotations

import datetime
import json
import shlex
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.exit_codes import EXIT_PASS, EXIT_UNKNOWN
from contracts.history_schema import Kind, Phase
from contracts.scenario import Scenario, load_scenario, with_provider
from contracts.topology import ServiceTopology, Target
from contracts.versions import SUMMARY_VERSION, write_json
from faults.base import FaultContext
from faults.nemesis import Nemesis, schedule_from_slots
from faults.network import heal_all_network
from harness.death_watch import DeathWatch
from harness.drain import PIPELINE_EMPTY, pipeline_wait_decision
from harness.executor import Executor, ExecutorSettings
from harness.history import HistoryRecorder, read_history, read_manifest
from harness.providers import make_target
from harness.reference_target import TopologyLender
from harness.resources import ResourceSampler, topology_pids
from harness.tls import client_tls
from properties.generate import make_plan, plan_notes
from properties.plan import Plan


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM / SIGINT arrived during the run."""


class Reporter(Protocol):
    """What a run tells its user while it works (the CLI draws a rich progress bar from it)."""

    def phase(self, name: str, total_s: float | None = None) -> None: ...
    def tick(self, elapsed_s: float, counters: dict[str, int], faults_active: int) -> None: ...
    def message(self, text: str) -> None: ...


class SilentReporter:
    def phase(self, name: str, total_s: float | None = None) -> None:
        pass

    def tick(self, elapsed_s: float, counters: dict[str, int], faults_active: int) -> None:
        pass

    def message(self, text: str) -> None:
        pass


@dataclass
class RunResult:
    run_dir: Path
    exit_code: int
    summary: dict[str, Any] = field(default_factory=dict)


RUN_DIR_PLACEHOLDER = "{run_dir}"


def default_replay_command(scenario_path: Path | str, seed: int, out: Path | str) -> str:
    return shlex.join(["ordeal", "run", str(scenario_path), "--seed", str(seed), "--out", str(out)])


def resolve_replay_command(template: str | None, scenario_path: Path, seed: int, out: Path, run_dir: Path) -> str:
    """The command that reproduces this run: the caller's (``{run_dir}`` replaced by the shell-quoted run
    directory, e.g. ``ordeal replay {run_dir}`` for a run of a stored plan), else ``ordeal run ... --seed``."""
    if template is None:
        return default_replay_command(scenario_path, seed, out)
    if not template.strip():
        raise ValueError("replay_command must be a command line (or None for `ordeal run ... --seed`), got ''")
    return template.replace(RUN_DIR_PLACEHOLDER, shlex.quote(str(run_dir)))


def new_run_dir(out: Path, scenario: Scenario, seed: int) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    run_dir = out / f"{scenario.name}-{seed}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    return run_dir


def write_inputs(run_dir: Path, scenario_path: Path, scenario: Scenario, plan: Plan) -> None:
    shutil.copyfile(scenario_path, run_dir / "scenario.toml")
    (run_dir / "scenario.json").write_text(json.dumps(scenario.to_dict(), indent=2, sort_keys=True) + "\n")
    (run_dir / "plan.json").write_text(plan.to_json())


@dataclass(frozen=True)
class RunInputs:
    """What the prepare phase settled before anything starts: the scenario, its plan, where the run lives
    and how to reproduce it."""

    scenario_path: Path
    scenario: Scenario
    plan: Plan
    out: Path
    run_dir: Path
    replay: str

    @property
    def seed(self) -> int:
        return self.plan.seed


@dataclass
class LiveRun:
    """A run in progress: what its phases have started (the teardown stops all of it) and what they measured
    (``timings``) and found (``outcome``: drain, error, notes, kafka_reads, topology_reuse)."""

    inputs: RunInputs
    recorder: HistoryRecorder
    reporter: Reporter
    stop: threading.Event
    began: float
    outcome: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    target: Target | None = None
    executor: Executor | None = None
    nemesis: Nemesis | None = None
    watch: DeathWatch | None = None
    sampler: ResourceSampler | None = None
    healed_all: bool = False


def run_scenario(scenario_path: str | Path, seed: int, out: str | Path = "runs", *,
                 reporter: Reporter | None = None, check: bool = False,
                 stop: threading.Event | None = None, plan: Plan | None = None,
                 replay_command: str | None = None, provider: str | None = None,
                 keeper: TopologyLender | None = None) -> RunResult:
    """Run one scenario with one seed.  Invalid scenarios raise ScenarioError before anything starts; a run
    that breaks later (a node that will not start, no client can connect, ...) returns exit code 2 with
    the error in summary.json and the traceback in logs/harness-error.log.
    ``plan``: play this stored plan instead of planning again (replay / shrink); it must belong to the
    scenario.
    ``replay_command``: the command that really reproduces this run, shown in summary.json and the history's
    run_start row (``{run_dir}`` is replaced by the run directory); default ``ordeal run SCENARIO --seed N``.
    Never checks (ordeal/pipeline.py does): ``check`` only says whether a check follows, for summary.json
    ("skipped (--no-check)" when it does not; ordeal.pipeline.record_check writes the verdict).
    ``keeper``: a harness.local.keeper.TopologyKeeper lending a kept local topology, reset and verified
    between runs (ordeal explore); summary.json then says under "topology_reuse" whether it was kept or
    fresh, and timings_s.topology_reset_s what the reset after this run took.

    The phases, in order: prepare (inputs written), start the target, connect the clients, play the
    workload (faults alongside), heal every fault, drain, read the target's storage; then, whatever
    happened, tear down (stop everything, collect the nodes' logs, close the history) and summarise."""
    reporter = reporter or SilentReporter()
    inputs = prepare(scenario_path, seed, out, plan=plan, provider=provider, replay_command=replay_command)
    reporter.message(f"seed {inputs.seed}  run dir {inputs.run_dir}\nreplay: {inputs.replay}")
    outcome_notes = plan_notes(inputs.scenario, inputs.plan)
    for note in outcome_notes:
        reporter.message(f"note: {note}")

    stop = stop or threading.Event()
    recorder = HistoryRecorder(inputs.run_dir / "history", run_id=inputs.run_dir.name,
                               meta={"scenario": inputs.scenario.name, "seed": inputs.seed})
    live = LiveRun(inputs, recorder, reporter, stop, began=time.monotonic(),
                   outcome={"drain": None, "error": None, "notes": list(outcome_notes)})
    previous_handlers = _install_signal_handlers(stop)
    close_reason = ""
    try:
        recorder.phase(Phase.RUN_START, scenario=inputs.scenario.name, seed=inputs.seed, replay=inputs.replay,
                       plan=inputs.plan.summary())
        start_target(live, keeper)
        connect_clients(live)
        play_workload(live)
        heal_faults(live)
        drain(live)
        read_storage(live)
    except KeyboardInterrupt:
        close_reason = "the run was interrupted (SIGINT/SIGTERM) before it finished"
        live.outcome["error"] = close_reason
    except Exception as error:
        close_reason = f"the run broke: {type(error).__name__}: {error}"
        live.outcome["error"] = close_reason
        recorder_safe_note(recorder, close_reason)
        _write_traceback(inputs.run_dir)
        reporter.message(f"{close_reason}\n(traceback in {inputs.run_dir / 'logs' / 'harness-error.log'})")
    finally:
        complete = tear_down(live, close_reason)
        _restore_signal_handlers(previous_handlers)
    return summarise(live, complete, check)


def prepare(scenario_path: str | Path, seed: int, out: str | Path, *, plan: Plan | None, provider: str | None,
            replay_command: str | None) -> RunInputs:
    """Load and validate the scenario (a bad file starts nothing), plan it (or take the stored plan), make
    the run directory and write scenario.toml, scenario.json and plan.json into it."""
    scenario_path = Path(scenario_path)
    scenario = load_scenario(scenario_path)  # validation first: a bad file starts nothing
    if provider is not None:  # --provider: the same scenario (and plan) on another topology provider
        scenario = with_provider(scenario, provider)
    if plan is None:
        plan = make_plan(scenario, seed)
    elif plan.scenario != scenario.name:
        raise ValueError(f"the plan is for scenario {plan.scenario!r}, not {scenario.name!r}")
    out = Path(out)
    run_dir = new_run_dir(out, scenario, plan.seed)
    write_inputs(run_dir, scenario_path, scenario, plan)
    replay = resolve_replay_command(replay_command, scenario_path, plan.seed, out, run_dir)
    return RunInputs(scenario_path, scenario, plan, out, run_dir, replay)


def start_target(live: LiveRun, keeper: TopologyLender | None) -> None:
    """Start the target (the provider switch chooses it), write topology.json, preset what the plan asks."""
    inputs = live.inputs
    live.target = target = make_target(inputs.scenario, inputs.run_dir, live.recorder, keeper=keeper)
    live.reporter.phase("starting the target")
    target.prepare()
    if hasattr(target, "prepare_clocks"):  # clock faults (faults/clock.py): their nodes start under libfaketime
        live.outcome["notes"] += target.prepare_clocks(inputs.plan)
    if hasattr(target, "prepare_disks"):  # disk_full faults (faults/disk.py): size-limited data dirs from node start
        live.outcome["notes"] += target.prepare_disks(inputs.plan)
    if hasattr(target, "prepare_power"):  # power_loss faults (faults/power.py): lazyfs data dirs from node start
        live.outcome["notes"] += target.prepare_power(inputs.plan)
    if hasattr(target, "prepare_links"):  # link faults on broker -> Kafka / Redis (faults/latency.py): proxied nodes
        live.outcome["notes"] += target.prepare_links(inputs.plan)
    target.start()
    if target.topology is not None:  # from here on, a node that exits or stops answering is a finding
        topology = target.topology
        live.watch = DeathWatch(topology.nodes, live.recorder, probe=getattr(target, "answers", None),
                                probed=lambda: list(getattr(topology, "brokers", ()))).start()
    if hasattr(target, "route_links"):  # link faults (faults/latency.py): the link through the harness' toxiproxy
        live.outcome["notes"] += target.route_links(inputs.plan)
    live.timings["target_start_s"] = round(time.monotonic() - live.began, 3)
    (inputs.run_dir / "topology.json").write_text(json.dumps(target.describe(), indent=2, default=str) + "\n")
    live.outcome["notes"] += target.apply_presets(inputs.plan)


def connect_clients(live: LiveRun) -> None:
    """Build the executor and the nemesis, then connect every client (workload_start)."""
    target, plan, scenario = live.target, live.inputs.plan, live.inputs.scenario
    probe = target.queue_size_probe()
    before_disconnect = None
    if scenario.workload.preset_each_offline and probe is not None:
        last = scenario.workload.preset_last_packet_id
        before_disconnect = lambda client: probe.preset_if_empty(client, last)  # noqa: E731
    live.executor = executor = Executor(
        plan, target.endpoints(), live.recorder, stop=live.stop,
        settings=ExecutorSettings(client_bind_address=target.client_bind_address()),
        before_reconnect=probe, before_disconnect=before_disconnect, credentials=scenario.target.credentials,
        tls=client_tls(live.inputs.run_dir, scenario.target.tls))
    if hasattr(target, "client_node"):  # an external target's broker-holding:CLIENT falls back on this
        target.client_node = executor.client_node
    # Before any client connects: a bad schedule starts nothing.  Client faults are played by the executor.
    live.nemesis = make_nemesis(plan, target, live.recorder, client_player=executor.client_fault_player())
    live.reporter.phase("connecting clients")
    ready = executor.connect_all()
    live.recorder.phase(Phase.WORKLOAD_START, **ready)


def play_workload(live: LiveRun) -> None:
    """Play the plan in real time, the nemesis' faults alongside; then let the last acknowledgements settle."""
    executor, nemesis = live.executor, live.nemesis
    live.reporter.phase("workload", total_s=live.inputs.plan.duration_s)
    mark = time.monotonic()
    every_s = live.inputs.scenario.scenario.resource_sample_s
    if every_s > 0:  # resources.jsonl (harness/resources.py): the harness's RSS, fds, history size
        live.sampler = ResourceSampler(live.inputs.run_dir, every_s, began=live.began,
                                       node_pids=topology_pids(live.target.topology)).start()
    try:
        executor.play(on_start=nemesis.start if nemesis else None,
                      on_tick=lambda elapsed: live.reporter.tick(elapsed, executor.counters.as_dict(),
                                                                 _faults_active(nemesis)))
    finally:
        if live.sampler is not None:
            live.sampler.stop()
    _raise_if_stopped(live.stop)
    settle = executor.settle()
    live.timings["workload_s"] = round(time.monotonic() - mark, 3)
    live.recorder.phase(Phase.WORKLOAD_END, max_lag_s=round(executor.max_lag_s, 6), **settle)


def heal_faults(live: LiveRun) -> None:
    """Heal every fault and bring every node back (heal_all), the clients' sockets served meanwhile."""
    if live.nemesis is not None:
        live.reporter.phase("healing every fault")
        mark = time.monotonic()
        if live.watch is not None:
            live.watch.hold()  # heal_all restarts nodes and waits until each answers: no probe meanwhile
        try:
            healed = live.executor.run_alongside(live.nemesis.heal_all)  # the loop keeps serving client-fault heals
        finally:
            if live.watch is not None:
                live.watch.release()
        live.healed_all = True
        live.timings["heal_all_s"] = round(time.monotonic() - mark, 3)
        live.recorder.phase(Phase.HEAL_ALL, faults=len(live.inputs.plan.faults), **healed)
    else:
        live.recorder.phase(Phase.HEAL_ALL, faults=0)


def drain(live: LiveRun) -> None:
    """Wait for the deliveries still owed (and, on a white box, for a Kafka backlog that still moves), then
    close the clients."""
    scenario, target, executor = live.inputs.scenario, live.target, live.executor
    live.reporter.phase("draining", total_s=scenario.scenario.drain_timeout_s)
    mark = time.monotonic()
    live.recorder.phase(Phase.DRAIN_START, quiet_s=scenario.scenario.drain_quiet_s,
                        timeout_s=scenario.scenario.drain_timeout_s)
    live.outcome["drain"] = executor.drain(scenario.scenario.drain_quiet_s, scenario.scenario.drain_timeout_s)
    _raise_if_stopped(live.stop)
    if live.outcome["drain"].get("ended_by") == "outstanding_quiet" and target.white_box:
        live.reporter.phase("waiting for the Kafka backlog")
        live.outcome["drain"], live.outcome["kafka_reads"] = executor.run_alongside(lambda: _wait_for_pipeline(
            target.topology, live.inputs.run_dir, executor, live.outcome["drain"], scenario.scenario.drain_quiet_s,
            deadline=mark + scenario.scenario.drain_timeout_s, stop=live.stop))
        _raise_if_stopped(live.stop)
    live.timings["drain_s"] = round(time.monotonic() - mark, 3)
    live.recorder.phase(Phase.DRAIN_END, **live.outcome["drain"])
    executor.close()
    live.executor = None


def read_storage(live: LiveRun) -> None:
    """A white box's storage after the drain: each session's snapshot, and what Kafka still holds of the
    deliveries still owed."""
    target, outcome = live.target, live.outcome
    live.reporter.phase("snapshot")
    mark = time.monotonic()
    snapshots = target.snapshot(live.inputs.plan) if target.white_box else 0
    live.timings["snapshot_s"] = round(time.monotonic() - mark, 3)
    live.recorder.phase(Phase.SNAPSHOT_DONE, sessions=snapshots, white_box=target.white_box)
    if (outcome["drain"] or {}).get("outstanding") and not outcome.get("kafka_reads") and target.white_box:
        # Deliveries still owed: say whether Kafka still holds them (pipeline too slow for the drain)
        # or never had them (lost by the Kafka stand-in, or acknowledged without a produce).  After a
        # pipeline wait its last read says it already (a read of a long log is slow).
        live.reporter.phase("reading the Kafka backlog")
        mark = time.monotonic()
        outcome["kafka_reads"] = _read_kafka_backlog(target.topology, _broker_topics(live.inputs.run_dir))
        live.timings["kafka_backlog_s"] = round(time.monotonic() - mark, 3)


def tear_down(live: LiveRun, close_reason: str) -> bool:
    """Whatever happened: no fault outlives the run, the clients and the target stop, the nodes' logs go
    into the history, and the history is closed (complete unless ``close_reason``).  Returns complete."""
    if live.nemesis is not None and not live.healed_all:
        _abandon_nemesis(live.nemesis)  # a broken or interrupted run: no fault may outlive it
    if live.executor is not None:
        _quietly(live.executor.close)
    if live.watch is not None:
        live.watch.stop()  # before the target stops its nodes
    target = live.target
    if target is not None:
        live.reporter.phase("stopping the target")
        mark = time.monotonic()
        log_nodes = _node_logs(target)
        _quietly(target.stop)
        live.timings["target_stop_s"] = round(time.monotonic() - mark, 3)
        if target.reset_s is not None:  # a kept topology: its reset, on its own line
            live.timings["topology_reset_s"] = target.reset_s
            live.timings["target_stop_s"] = round(max(0.0, live.timings["target_stop_s"] - target.reset_s), 3)
        if target.reuse is not None:
            live.outcome["topology_reuse"] = target.reuse
        # After the stop: a container's log is saved then, and every node has written its last line.
        _collect_logs(live.inputs.run_dir, live.recorder, log_nodes, live.outcome)
    if not close_reason:
        live.recorder.phase(Phase.RUN_END, elapsed_s=round(time.monotonic() - live.began, 3))
    return live.recorder.close(reason=close_reason)


def summarise(live: LiveRun, complete: bool, check: bool) -> RunResult:
    """summary.json (counts from the history itself) and the run's exit code."""
    inputs, outcome, timings = live.inputs, live.outcome, live.timings
    timings["total_s"] = round(time.monotonic() - live.began, 3)
    summary = build_summary(inputs.run_dir, inputs.scenario, inputs.plan, inputs.replay, timings, outcome, complete)
    if outcome.get("topology_reuse") is not None:
        summary["topology_reuse"] = outcome["topology_reuse"]
    if outcome.get("kafka_reads"):
        summary["kafka_backlog"] = _summarise_kafka_backlog(inputs.run_dir, outcome["kafka_reads"])
    # A fault that could not be applied makes the run unknown even unchecked (docs/faults.md).
    exit_code = EXIT_UNKNOWN if (not complete or outcome["error"] or summary["counts"]["fault_errors"]) else EXIT_PASS
    summary["checked"] = False
    summary["exit_code"] = summary["run_exit_code"] = exit_code
    if not check:
        summary["check"] = "skipped (--no-check)"
    else:
        summary["check"] = "pending: checked next" if complete else "not run: the history is incomplete"
    write_summary(inputs.run_dir, summary)  # before the check: a checker crash must not lose the summary
    if not (check and complete):  # else the pipeline says it once the check is recorded
        live.reporter.message(f"seed {inputs.seed}  exit {exit_code}  run dir {inputs.run_dir}\nreplay: {inputs.replay}")
    return RunResult(run_dir=inputs.run_dir, exit_code=exit_code, summary=summary)


def _wait_for_pipeline(topology: ServiceTopology, run_dir: Path, executor: Executor, drain: dict[str, Any], quiet_s: float, *,
                       deadline: float, stop: threading.Event) -> tuple[dict[str, Any], dict[str, Any]]:
    """The drain gave up on owed deliveries after its outstanding quiet.  If Kafka still holds owed records
    that the broker's consumer groups have not committed, the pipeline is behind (on a loaded machine after
    a Redis failover or a Kafka restart it takes tens of seconds to catch up), not finished: keep the sockets served
    (run_alongside) while that backlog shrinks, up to the drain timeout.  Ends when nothing owed is left in
    Kafka (then one more quiet_s for the last hop), when a read shows no progress (the pipeline stalled:
    the checkers then report what is missing), or at the deadline (reason "timeout": unknown, since late
    is not lost).  Returns the drain_end details with a "pipeline_wait" record, and the last Kafka read
    while deliveries were still owed ({} if none: nothing left to explain)."""
    from harness.kafka import owed_in_backlog

    began = time.monotonic()
    reads: list[dict[str, Any]] = []
    last_read: dict[str, Any] = {}
    topics = _broker_topics(run_dir)
    ended_by, previous = "deadline", None
    while time.monotonic() < deadline and not stop.is_set():
        owed = {(publisher, seq) for _client, publisher, seq in _snapshot(executor.outstanding.owed)}
        last_read = _read_kafka_backlog(topology, topics)
        waiting = owed_in_backlog(last_read, owed)
        reads.append({"at_s": round(time.monotonic() - began, 3), "owed": len(owed), "in_kafka": waiting})
        decision = pipeline_wait_decision(owed=len(owed), in_kafka=waiting, previous=previous)
        if decision == PIPELINE_EMPTY:
            time.sleep(min(quiet_s, max(0.0, deadline - time.monotonic())))  # the last hop: Redis -> client
        if decision is not None:
            ended_by = decision
            break
        previous = (len(owed), waiting)
        time.sleep(min(quiet_s, max(0.0, deadline - time.monotonic())))
    result = dict(drain)
    result["outstanding"] = executor.outstanding.count
    result["elapsed_s"] = round(drain.get("elapsed_s", 0) + time.monotonic() - began, 3)
    result["pipeline_wait"] = {"ended_by": ended_by, "waited_s": round(time.monotonic() - began, 3),
                               "reads": reads}
    if ended_by == "deadline" and reads and result["outstanding"]:
        # Kafka still held owed records at the last read and they were moving: late or lost is undecided
        result["reason"] = result["ended_by"] = "timeout"
    return result, (last_read if result["outstanding"] else {})


def _snapshot(items: set) -> set:
    """A copy of a set the executor's loop thread is changing right now."""
    while True:
        try:
            return set(items)
        except RuntimeError:  # changed size during iteration: try again
            continue


def _broker_topics(run_dir: Path) -> list[str]:
    """The reference broker's incoming and persisted topics, from the run's node config (its "broker" table;
    the broker's defaults where the scenario set none)."""
    from reference_broker.config import BrokerConfig

    try:
        broker = json.loads((run_dir / "broker-config.json").read_text()).get("broker", {})
    except (OSError, ValueError, AttributeError):
        broker = {}
    defaults = BrokerConfig()
    return [broker.get("incoming_topic", defaults.incoming_topic), broker.get("persisted_topic", defaults.persisted_topic)]


def _read_kafka_backlog(topology: ServiceTopology, topics: list[str]) -> dict[str, Any]:
    """The broker's topics read to their end, with the broker's committed offsets (harness/kafka.py);
    {"error": ...} when Kafka cannot be read (a diagnostic must never break the run)."""
    from harness.kafka import topics_backlog

    if topology.kafka is None:
        return {}
    try:
        return topics_backlog(topology.kafka_bootstrap(), {topic: f"ordeal-broker-{topic}" for topic in topics})
    except Exception as error:  # noqa: BLE001 - reported, never fatal
        return {topic: {"error": f"{type(error).__name__}: {error}"} for topic in topics}


def _summarise_kafka_backlog(run_dir: Path, reads: dict[str, Any]) -> dict[str, Any]:
    from harness.kafka import backlog_summary

    rows = read_history(run_dir / "history").select(["kind", "publisher", "pub_seq"]).to_pylist()
    acked = {(r["publisher"], r["pub_seq"]) for r in rows if r["kind"] == Kind.PUBLISH_ACK}
    readable = {topic: read for topic, read in reads.items() if "error" not in read}
    summary: dict[str, Any] = backlog_summary(readable, acked)
    summary.update({topic: read for topic, read in reads.items() if "error" in read})
    return summary


def _node_logs(target: Target) -> list[tuple[str, str, Path]]:
    from harness.node_logs import node_logs

    try:
        return node_logs(target)
    except Exception:  # noqa: BLE001 - no node list: the log table says no node, the checker answers unknown
        return []


def _collect_logs(run_dir: Path, recorder: HistoryRecorder, nodes: list[tuple[str, str, Path]],
                  outcome: dict[str, Any]) -> None:
    """history/logs.parquet (harness/node_logs.py); a failure is noted in the summary, never fatal to the run:
    without the table the checker answers unknown for the log invariants."""
    from harness.node_logs import collect_logs

    try:
        collect_logs(run_dir / "history", run_dir, nodes, recorder.started_wall_us)
    except Exception as error:  # noqa: BLE001 - reported, never fatal
        outcome["notes"].append(f"the nodes' logs could not be collected into the history: "
                                f"{type(error).__name__}: {error}")


def make_nemesis(plan: Plan, target: Target, recorder: HistoryRecorder,
                 client_player: Callable[..., Any] | None = None) -> Nemesis | None:
    """The faults/ nemesis for the plan's fault slots, or None when the plan has none.  ``client_player``:
    the executor's hook that plays client faults (Executor.client_fault_player()); without it a client
    fault becomes a fault_error row (the run unknown)."""
    if not plan.faults:
        return None
    topology = target.topology
    if topology is None:
        raise RuntimeError("fault slots need a started target (its topology: the nodes faults act on)")
    context = FaultContext(topology=topology, seed=plan.seed, record=recorder.record,
                           broker_key_prefix=str(target.key_prefix))
    if target.heal_ready_timeout_s is not None:
        context.ready_timeout_s = max(context.ready_timeout_s, target.heal_ready_timeout_s)
    return Nemesis(schedule_from_slots(plan.faults), context, client_player=client_player)


def _abandon_nemesis(nemesis: Nemesis) -> None:
    """Stop every waiting fault worker and remove every network rule, without restarting nodes (the target
    is about to stop; heal_all would also restart and wait for nodes)."""
    nemesis.cancel()
    _quietly(heal_all_network)


def _faults_active(nemesis: Nemesis | None) -> int:
    if nemesis is None:
        return 0
    return sum(1 for outcome in list(nemesis.outcomes.values()) if outcome == "applied")


def _write_traceback(run_dir: Path) -> None:
    import traceback

    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs" / "harness-error.log").write_text(traceback.format_exc())


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    write_json(run_dir / "summary.json", summary)


def recorder_safe_note(recorder: HistoryRecorder, text: str) -> None:
    try:
        recorder.record(Kind.PHASE, detail={"phase": "error", "error": text})
    except Exception:  # noqa: BLE001 - the history may itself be what failed
        pass


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - teardown goes on; the error is already recorded or irrelevant
        pass


def _raise_if_stopped(stop: threading.Event) -> None:
    if stop.is_set():
        raise RunInterrupted()


def _install_signal_handlers(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    signalled = []

    def handler(signum: int, frame: Any) -> None:
        # A second signal (a process-group kill reaches this process twice, say) runs this handler again in the
        # main thread, possibly inside the first one's stop.set(), which holds the Event's lock: setting it again
        # would wait on that lock for ever (the run hung, children and mounts alive).  So only the first sets it.
        if signalled:
            return
        signalled.append(signum)
        stop.set()  # the executor's loop notices within 0.1 s and the run unwinds through finally

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def build_summary(run_dir: Path, scenario: Scenario, plan: Plan, replay: str, timings: dict[str, float],
                  outcome: dict[str, Any], complete: bool) -> dict[str, Any]:
    """Counts come from the history itself, so the summary can never disagree with it."""
    table = read_history(run_dir / "history")
    kinds = Counter(table.column("kind").to_pylist())
    deliveries = [r for r in table.select(["kind", "client", "publisher", "pub_seq"]).to_pylist()
                  if r["kind"] == Kind.DELIVERY]
    unique = {(r["client"], r["publisher"], r["pub_seq"]) for r in deliveries if r["publisher"] is not None}
    return {
        "schema_version": SUMMARY_VERSION,
        "scenario": scenario.name,
        "seed": plan.seed,
        "run_dir": str(run_dir),
        "replay": replay,
        "history_complete": complete,
        "manifest": {k: read_manifest(run_dir / "history")[k] for k in ("complete", "incomplete_reason", "rows")},
        "plan": plan.summary(),
        "counts": {
            "published": kinds[Kind.PUBLISH_INVOKE],
            "acked": kinds[Kind.PUBLISH_ACK],
            "failed": kinds[Kind.PUBLISH_FAIL],
            "indeterminate": kinds[Kind.PUBLISH_INDETERMINATE],
            "delivered": kinds[Kind.DELIVERY],
            "delivered_unique": len(unique),
            "delivery_acks_sent": kinds[Kind.DELIVERY_ACK_SENT],
            "connects": kinds[Kind.CONNECT],
            "connect_failures": kinds[Kind.CONNECT_FAIL],
            "disconnects": kinds[Kind.DISCONNECT],
            "session_snapshots": kinds[Kind.SESSION_SNAPSHOT],
            "faults_started": kinds[Kind.FAULT_START],
            "fault_errors": kinds[Kind.FAULT_ERROR],
            "rows": table.num_rows,
        },
        "drain": outcome["drain"],
        "error": outcome["error"],
        "notes": outcome["notes"],
        "timings_s": timings,
    }
