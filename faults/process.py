"""Process faults: kill -9, graceful stop, pause/resume, restart — of any node the topology has.

Evidence that the fault bit: after a kill or stop the PID is really gone and the port refuses; after a
pause the process is in state 'T'; after a restart it runs under a new PID and accepts connections.  When
the victim was a Redis master with replicas, kill and stop also wait for a replica to be promoted (the
cluster's own CLUSTER NODES, read from the surviving nodes) — that is what the fault is for.
Heal brings the node back (start / resume) and checks it is alive and accepting again.
``at_commit`` (kill, pause of ``kafka``): the kill / pause comes while a consumer's OffsetCommit is held in
flight on the broker -> Kafka link, with that as evidence (faults/commit_hold.py).
"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace
from typing import Any

import redis

from faults import commit_hold, probes
from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    KindInfo,
    Param,
    register,
)
from faults.redis_cluster_view import ClusterView, wait_until
from faults.selectors import SET_SELECTORS, parse_selector, resolve_node, resolve_nodes


def _redis_role(ctx: FaultContext, node: Any) -> tuple[str | None, list[str]]:
    """('master'|'replica'|None, ids of its replicas) per the cluster's view; None when not Redis."""
    if node not in (getattr(ctx.topology, "redis_nodes", []) or []):
        return None, []
    try:
        view = ClusterView.read(ctx.topology)
    except FaultNotApplicable:
        return None, []
    entry = view.entry_for(node)
    if entry is None:
        return None, []
    if entry.is_master and entry.slots:
        return "master", [replica.node_id for replica in view.replicas_of(entry.node_id)]
    return "replica", []


def _promotion_check(ctx: FaultContext, node: Any, old_master_id: str, replica_ids: list[str]) -> Check:
    """Wait until one of the dead master's replicas is a master serving slots, in the survivors' view."""

    def promoted() -> tuple[bool, dict]:
        try:
            view = ClusterView.read(ctx.topology, exclude=(node.name,))
        except FaultNotApplicable as error:
            return False, {"error": str(error)}
        winners = [replica_id for replica_id in replica_ids
                   if (entry := view.by_id(replica_id)) is not None and entry.is_master and entry.slots]
        old = view.by_id(old_master_id)
        return bool(winners), {
            "promoted": [view.by_id(winner).address for winner in winners],
            "old_master_flags": sorted(old.flags) if old else None,
            "view_from": view.source,
        }

    ok, observed, waited = wait_until(promoted, ctx.effect_timeout_s)
    return Check("replica promoted", {**observed, "waited_s": waited,
                                      "timeout_s": ctx.effect_timeout_s}, ok)


class _NodeFault:
    """Shared state: the resolved node and its PID before the fault.  A selector naming a set of nodes
    (broker-minority, broker-majority) gives one such fault per node, applied and healed together
    (``NodeSetFault``)."""

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.node: Any = None
        self.pid_before: int | None = None
        self.commit_watch: commit_hold.CommitLogWatch | None = None  # at_commit: the broker logs from the apply on
        self.commit_checks: list[Check] = []

    def _commit_outcome(self) -> list[Check]:
        """at_commit: the heal's observation of the broker's commit lines since the apply (none otherwise)."""
        if self.commit_watch is None:
            return []
        return [self.commit_watch.check(commit_hold.held_groups(self.commit_checks))]

    def _resolve(self, ctx: FaultContext) -> Any:
        if self.node is None:
            self.node = resolve_node(ctx.topology, self.spec.target, ctx.rng_for(self.spec.id),
                                     ctx.broker_key_prefix)
        if not self.node.is_alive():
            raise FaultNotApplicable(f"fault {self.spec.id}: target {self.node.name} is not running")
        self.pid_before = self.node.pid
        return self.node

    def _refuse_log_loss(self, ctx: FaultContext) -> None:
        """Taking down the Kafka stand-in's only copy of its log (moto's memory, Tansu's memory engine) loses
        every acknowledged record: the verdict would blame the broker under test, so the fault is refused.
        contracts/scenario.py refuses such scenarios on load; this catches plans that bypass it."""
        config = getattr(ctx.topology, "config", None)
        why = config.destructive_kill_loses_log(self.node.role) if hasattr(config, "destructive_kill_loses_log") else ""
        if why:
            raise FaultNotApplicable(f"fault {self.spec.id} ({self.spec.kind} of {self.node.name}): {why}")

    def _down_checks(self, ctx: FaultContext) -> list[Check]:
        # Why poll: the process we started may be a wrapper (unshare -> sh -> the broker in its own PID
        # namespace); SIGKILL ends the wrapper at once, the kernel then tears the broker down (its listening
        # socket a few ms later).  Measured on RabbitMQ: "accepts" on the first probe right after the kill.
        refused, observed, waited = wait_until(
            lambda: ((state := probes.port_state(self.node.host, self.node.port)) == "refuses", {"port": state}),
            ctx.effect_timeout_s, interval_s=0.02)
        return [
            Check("pid gone", {"node": self.node.name, "pid": self.pid_before,
                               "state": probes.proc_state(self.pid_before)}, probes.pid_gone(self.pid_before)),
            Check("port refuses", {"address": f"{self.node.host}:{self.node.port}", **observed, "waited_s": waited},
                  refused),
        ]

    def _up_checks(self) -> list[Check]:
        state = probes.port_state(self.node.host, self.node.port)
        return [
            Check("node alive", {"node": self.node.name, "pid": self.node.pid,
                                 "state": probes.proc_state(self.node.pid)}, bool(self.node.is_alive())),
            Check("port accepts", {"address": f"{self.node.host}:{self.node.port}", "port": state},
                  state == "accepts"),
        ]

    def _bring_back(self, ctx: FaultContext) -> Evidence:
        if not self.node.is_alive():
            self.node.start()
            ctx.note_node_event(self.node.name, "start", fault_id=self.spec.id, pid=self.node.pid)
        self.node.wait_ready(ctx.ready_timeout_s)
        return Evidence.of(*self._up_checks())


class _StopFault(_NodeFault):
    """Kill (SIGKILL) or graceful stop; heal starts the node again."""

    graceful = False

    def apply(self, ctx: FaultContext) -> Evidence:
        node = self._resolve(ctx)
        self._refuse_log_loss(ctx)
        role, replica_ids = _redis_role(ctx, node)
        old_id = None
        if role == "master":
            view = ClusterView.read(ctx.topology)
            old_id = view.entry_for(node).node_id
        stage_check = None
        if self.graceful:
            node.stop(timeout=float(self.spec.params.get("timeout_s", 10.0)))
            ctx.note_node_event(node.name, "stop", fault_id=self.spec.id, pid=self.pid_before)
        elif self.spec.params.get("at_stage", "now") != "now":
            stage_check = self._kill_at_stage(ctx, node, self.spec.params["at_stage"])
        elif self.spec.params.get("at_commit"):  # faults/commit_hold.py: Tansu killed with a commit held in flight
            def kill() -> list[Check]:
                node.kill()
                ctx.note_node_event(node.name, "kill", fault_id=self.spec.id, pid=self.pid_before, at_commit=True)
                return self._down_checks(ctx)

            self.commit_watch = commit_hold.CommitLogWatch(ctx.topology)
            self.commit_checks = commit_hold.at_commit(self.spec, ctx, node, kill)
            return Evidence.of(*self.commit_checks)
        else:
            node.kill()
            ctx.note_node_event(node.name, "kill", fault_id=self.spec.id, pid=self.pid_before)
        checks = self._down_checks(ctx) + ([stage_check] if stage_check else [])
        if role == "master" and replica_ids and self.spec.params.get("wait_promotion", True):
            checks.append(_promotion_check(ctx, node, old_id, replica_ids))
        return Evidence.of(*checks)

    def heal(self, ctx: FaultContext) -> Evidence:
        return self._bring_back(ctx).plus(*self._commit_outcome())

    def _kill_at_stage(self, ctx: FaultContext, node: Any, stage: str) -> Check:
        """A kill timed by the broker's own stage: SIGUSR1 arms the reference broker's crash point (it SIGKILLs
        itself right after its next persisted-topic commit, reference_broker/server.py crash_point); a node
        that does not reach it within stage_timeout_s (it holds no persisted partition, say) is SIGKILLed
        from here.  Evidence: whether the node died at its stage (the kill bit either way)."""
        if node.role != "broker":
            raise FaultNotApplicable(f"fault {self.spec.id}: at_stage = {stage!r} needs a reference-broker node, "
                                     f"not {node.name} ({node.role})")
        timeout = float(self.spec.params.get("stage_timeout_s", 5.0))
        expect_exit = getattr(node, "expect_exit", None)
        if callable(expect_exit):  # it kills itself on purpose: no unplanned exit (harness/death_watch.py)
            expect_exit()
        os.kill(self.pid_before, signal.SIGUSR1)
        died, _, waited = wait_until(lambda: (not node.is_alive(), {}), timeout, interval_s=0.01)
        node.kill()  # reaps a node that died at its stage; kills one that did not get there
        # reached: the node's own log says so (this start's part of it: the log is appended per start)
        log_text = node.log_path.read_text(errors="replace") if node.log_path.is_file() else ""
        reached = died and f"crash point {stage} reached" in log_text.rsplit("=== ordeal: start", 1)[-1]
        ctx.note_node_event(node.name, "kill", fault_id=self.spec.id, pid=self.pid_before, at_stage=stage,
                            reached=reached)
        return Check("killed at its stage", {"node": node.name, "stage": stage, "reached": reached,
                                             "waited_s": waited, "timeout_s": timeout}, True)


class KillFault(_StopFault):
    graceful = False


class StopFault(_StopFault):
    graceful = True


class PauseFault(_NodeFault):
    """SIGSTOP; heal sends SIGCONT."""

    def apply(self, ctx: FaultContext) -> Evidence:
        node = self._resolve(ctx)
        if self.spec.params.get("at_commit"):  # faults/commit_hold.py: Tansu paused with a commit held in flight
            self.commit_watch = commit_hold.CommitLogWatch(ctx.topology)
            self.commit_checks = commit_hold.at_commit(self.spec, ctx, node,
                                                       lambda: list(self._pause(ctx, node).checks))
            return Evidence.of(*self.commit_checks)
        return self._pause(ctx, node)

    def _pause(self, ctx: FaultContext, node: Any) -> Evidence:
        # The process serving the port may be a descendant (an external target runs behind unshare + sh):
        # it must be stopped too, not only the process we started.
        listener = probes.listener_pid(self.pid_before, node.host, node.port)
        node.pause()
        ctx.note_node_event(node.name, "pause", fault_id=self.spec.id, pid=self.pid_before,
                            **({"at_commit": True} if self.spec.params.get("at_commit") else {}))
        pids = [self.pid_before] + ([listener] if listener not in (None, self.pid_before) else [])
        # SIGSTOP is delivered asynchronously: a running process shows 'R' for a moment.
        stopped, observed, waited = wait_until(
            lambda: (all(probes.is_stopped(pid) for pid in pids),
                     {"state": probes.proc_state(self.pid_before),
                      **({"listener": {"pid": pids[1], "state": probes.proc_state(pids[1])}} if len(pids) > 1 else {})}),
            timeout_s=2.0, interval_s=0.01)
        return Evidence.of(Check("process stopped (state T)",
                                 {"node": node.name, "pid": self.pid_before, **observed, "waited_s": waited},
                                 stopped))

    def heal(self, ctx: FaultContext) -> Evidence:
        self.node.resume()
        ctx.note_node_event(self.node.name, "resume", fault_id=self.spec.id, pid=self.pid_before)
        state = probes.proc_state(self.pid_before)
        checks = [Check("process running again", {"node": self.node.name, "pid": self.pid_before,
                                                  "state": state},
                        state is not None and not probes.is_stopped(self.pid_before))]
        if self.node in (getattr(ctx.topology, "redis_nodes", []) or []):
            checks.append(_answers_ping(self.node, ctx.effect_timeout_s))
        return Evidence.of(*checks, *self._commit_outcome())


def _answers_ping(node: Any, timeout_s: float) -> Check:
    from faults.redis_cluster_view import query

    def pong() -> tuple[bool, dict]:
        try:
            return bool(query(node.host, node.port, "PING")), {"reply": "PONG"}
        except (redis.RedisError, OSError) as error:
            return False, {"error": str(error)}

    ok, observed, waited = wait_until(pong, timeout_s)
    return Check("redis answers PING", {**observed, "waited_s": waited}, ok)


class RestartFault(_NodeFault):
    """Graceful stop then start, in one step; heal only re-checks the node is up."""

    def apply(self, ctx: FaultContext) -> Evidence:
        node = self._resolve(ctx)
        self._refuse_log_loss(ctx)
        node.restart()
        ctx.note_node_event(node.name, "restart", fault_id=self.spec.id, old_pid=self.pid_before, pid=node.pid)
        node.wait_ready(ctx.ready_timeout_s)
        return Evidence.of(
            Check("new process", {"node": node.name, "old_pid": self.pid_before, "pid": node.pid,
                                  "old_pid_state": probes.proc_state(self.pid_before)},
                  node.pid != self.pid_before and probes.pid_gone(self.pid_before)),
            *self._up_checks(),
        )

    def heal(self, ctx: FaultContext) -> Evidence:
        return self._bring_back(ctx)


class NodeSetFault:
    """A process fault on a set of nodes (a minority, a majority): the single-node fault once per node, in
    name order; the evidence holds every node's checks (the fault bit only if it bit on each)."""

    def __init__(self, spec: FaultSpec, single: type[_NodeFault]) -> None:
        self.spec = spec
        self.single = single
        self.parts: list[_NodeFault] = []

    @property
    def node(self) -> Any:
        """What the nemesis names in its rows: every node of the set ("rabbit1+rabbit3")."""
        names = "+".join(part.node.name for part in self.parts if part.node is not None)
        return SimpleNamespace(name=names or None)

    def apply(self, ctx: FaultContext) -> Evidence:
        nodes = resolve_nodes(ctx.topology, self.spec.target, ctx.rng_for(self.spec.id), ctx.broker_key_prefix)
        checks: list[Check] = []
        for node in nodes:
            part = self.single(self.spec)
            part.node = node
            self.parts.append(part)
            checks.extend(part.apply(ctx).checks)
        return Evidence.of(*checks)

    def heal(self, ctx: FaultContext) -> Evidence:
        return Evidence.of(*(check for part in self.parts for check in part.heal(ctx).checks))


def _factory(single: type[_NodeFault]) -> Any:
    """The fault for a spec: one node, or (a set selector) one per node of the set."""

    def make(spec: FaultSpec) -> Any:
        if spec.target and parse_selector(spec.target).how in SET_SELECTORS:
            return NodeSetFault(spec, single)
        return single(spec)

    return make


_WAIT_PROMOTION = Param("wait_promotion", bool, True,
                        "for a Redis master with replicas: wait for (and require) a replica's promotion")

register(KindInfo(
    name="process_kill", category="process", target="node", factory=_factory(KillFault),
    description="SIGKILL the target node (at once, or for a reference-broker node at_stage = "
                "\"persisted_commit\": right after its next persisted-topic commit, or for kafka at_commit: while "
                "a consumer's offset commit is held in flight); heal starts it again",
    params=(_WAIT_PROMOTION,
            Param("at_stage", str, "now", "when the node dies: now, or (reference broker) right after its next "
                  "persisted-topic commit", choices=("now", "persisted_commit")),
            Param("stage_timeout_s", float, 5.0, "at_stage: SIGKILL from outside if the stage is not reached "
                  "within this time", min=0.1, max=60.0),
            *commit_hold.AT_COMMIT_PARAMS),
))
register(KindInfo(
    name="process_stop", category="process", target="node", factory=_factory(StopFault),
    description="gracefully stop the target node (SIGTERM, then SIGKILL after timeout_s); heal starts it",
    params=(Param("timeout_s", float, 10.0, "grace period before SIGKILL", min=0.1, max=120.0),
            _WAIT_PROMOTION),
))
register(KindInfo(
    name="process_pause", category="process", target="node", factory=_factory(PauseFault),
    description="SIGSTOP the target node (for kafka at_commit: while a consumer's offset commit is held in "
                "flight); heal sends SIGCONT",
    params=commit_hold.AT_COMMIT_PARAMS,
))
register(KindInfo(
    name="process_restart", category="process", target="node", factory=_factory(RestartFault), instant=True,
    description="restart the target node (graceful stop, start) at the fault's start",
    params=(),
))
