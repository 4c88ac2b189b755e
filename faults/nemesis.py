"""The nemesis runner: plays a fault schedule against the topology, in its own threads.

Each scheduled fault gets a worker thread that sleeps until its start offset, applies the fault, sleeps
until its end offset, and heals it; every step is written to the history:

    fault_start     just before apply  (detail: target selector, params, planned and actual offsets;
                    waited_for: the earlier faults still in force at the planned start, see below)
    fault_evidence  after apply and after heal (bit, detail.stage = "apply" | "heal", detail.checks)
    fault_heal      just before heal
    fault_error     the fault could not be applied or healed (detail.stage, detail.reason) — the run is
                    then unknown; nothing is ever silently skipped

One lane: a fault whose planned slot begins at or after another's planned end starts only once that
other fault is done (healed or failed), so a late heal never overlaps the next fault on the same node; the
delay shows as offset_s > planned_start_s and ``waited_for`` in its fault_start row.

A fault *bit* when every fault_evidence row for it has bit = true.  Nothing here raises into the caller:
every error becomes a fault_error row.  ``heal_all()`` is the final phase: heal whatever is still active
(early), remove every network rule, resume paused nodes, start dead ones, and wait until all are ready.

Client faults are played by the executor; give the nemesis a ``client_player(spec, stage) -> Evidence``
(stage "apply" at start, "heal" at end) to have them scheduled here, or leave them out of the schedule.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from faults import probes
from faults.base import Evidence, Fault, FaultContext, FaultNotApplicable, FaultSpec, FaultSpecError
from faults.catalog import build_fault, is_client_fault, validate_spec
from faults.failure_paths import release_client_pauses
from faults.network import heal_all_network
from faults.selectors import all_nodes

ClientPlayer = Callable[[FaultSpec, str], Evidence]


@dataclass(frozen=True)
class ScheduledFault:
    spec: FaultSpec
    start_s: float  # offset from the nemesis' time zero (the workload start)
    end_s: float

    def __post_init__(self) -> None:
        if not (0 <= self.start_s <= self.end_s):
            raise FaultSpecError(f"fault {self.spec.id!r}: offsets must satisfy 0 <= start ({self.start_s}) "
                                 f"<= end ({self.end_s})")


def _field(slot: Any, *names: str) -> Any:
    for name in names:
        if isinstance(slot, Mapping) and name in slot:
            return slot[name]
        if not isinstance(slot, Mapping) and hasattr(slot, name):
            return getattr(slot, name)
    raise FaultSpecError(f"fault slot {slot!r}: missing field {' / '.join(names)}")


def schedule_from_slots(slots: Iterable[Any]) -> list[ScheduledFault]:
    """Plan fault slots (objects or dicts: id, kind, target, params, start/end offsets in seconds) ->
    a validated schedule.  Raises FaultSpecError naming the slot on bad input."""
    schedule = []
    for slot in slots:
        spec = validate_spec({
            "id": _field(slot, "id", "fault_id"),
            "kind": _field(slot, "kind"),
            "target": _field(slot, "target") if _has(slot, "target") else None,
            "params": dict(_field(slot, "params")) if _has(slot, "params") else {},
        })
        schedule.append(ScheduledFault(spec, float(_field(slot, "start_s", "start_offset_s", "start")),
                                       float(_field(slot, "end_s", "end_offset_s", "end"))))
    ids = [item.spec.id for item in schedule]
    duplicates = sorted({fault_id for fault_id in ids if ids.count(fault_id) > 1})
    if duplicates:
        raise FaultSpecError(f"fault ids must be unique; repeated: {', '.join(duplicates)}")
    return schedule


def _has(slot: Any, name: str) -> bool:
    value = slot.get(name) if isinstance(slot, Mapping) else getattr(slot, name, None)
    return value is not None


class Nemesis:
    def __init__(self, schedule: list[ScheduledFault], ctx: FaultContext,
                 client_player: ClientPlayer | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.schedule = list(schedule)
        self.ctx = ctx
        self.client_player = client_player
        self.clock = clock
        self._cancel = threading.Event()  # set by heal_all: stop waiting, heal now
        self._record_lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._t0: float | None = None
        # set when a fault's worker is done (healed, failed or cancelled): the one-lane rule below waits on it
        self._done: dict[str, threading.Event] = {item.spec.id: threading.Event() for item in self.schedule}
        self.outcomes: dict[str, str] = {}  # fault id -> "healed" | "error" | "cancelled" | "applied"

    # --- recording --------------------------------------------------------------------------------

    def _record(self, kind: str, **columns: Any) -> None:
        if self.ctx.record is None:
            return
        try:
            with self._record_lock:  # one writer call at a time, whatever the writer's own locking
                self.ctx.record(kind, **columns)
        except Exception:  # noqa: BLE001 - never raise into the run; say it loudly instead
            print(f"nemesis: recording a {kind} row failed:\n{traceback.format_exc()}", file=sys.stderr)

    def _offset(self) -> float:
        return round(self.clock() - (self._t0 or self.clock()), 3)

    def _error(self, item: ScheduledFault, stage: str, error: BaseException) -> None:
        self.outcomes[item.spec.id] = "error"
        reason = str(error) if isinstance(error, FaultNotApplicable | FaultSpecError) else (
            f"{type(error).__name__}: {error}")
        self._record("fault_error", fault_id=item.spec.id, fault_kind=item.spec.kind,
                     detail={"stage": stage, "reason": reason, "error_type": type(error).__name__,
                             "offset_s": self._offset(), "target": item.spec.target})

    def _evidence(self, item: ScheduledFault, stage: str, fault: Any, evidence: Evidence) -> None:
        node = getattr(getattr(fault, "node", None), "name", None)
        self._record("fault_evidence", fault_id=item.spec.id, fault_kind=item.spec.kind, node=node,
                     bit=evidence.bit, detail={"stage": stage, "offset_s": self._offset(), **evidence.to_dict()})

    # --- the schedule -----------------------------------------------------------------------------

    def start(self, t0: float | None = None) -> None:
        """Start playing the schedule; offsets count from ``t0`` (the clock's value at workload start)."""
        self._t0 = self.clock() if t0 is None else t0
        for item in sorted(self.schedule, key=lambda scheduled: (scheduled.start_s, scheduled.spec.id)):
            worker = threading.Thread(target=self._play, args=(item,), name=f"nemesis-{item.spec.id}",
                                      daemon=True)
            self._workers.append(worker)
            worker.start()

    def _wait_until(self, offset_s: float) -> bool:
        """Sleep until the offset; False when heal_all cancelled the wait."""
        remaining = self._t0 + offset_s - self.clock()
        return not self._cancel.wait(remaining) if remaining > 0 else not self._cancel.is_set()

    def _play(self, item: ScheduledFault) -> None:
        try:
            self._play_unguarded(item)
        except BaseException as error:  # noqa: BLE001 - the last line of defence: becomes a row
            self._error(item, "internal", error)
        finally:
            self._done[item.spec.id].set()

    def _predecessors(self, item: ScheduledFault) -> list[ScheduledFault]:
        """The faults planned to end by ``item``'s start: a plan whose slots do not overlap means one fault
        at a time, so ``item`` must not begin while one of them is still in force (slots that overlap by
        plan still play together)."""
        return [other for other in self.schedule if other is not item and other.end_s <= item.start_s]

    def _wait_for_predecessors(self, item: ScheduledFault) -> tuple[list[str], str | None]:
        """Wait until every predecessor is done -> (ids waited for, id still running when heal_all came)."""
        waited = []
        for other in self._predecessors(item):
            done = self._done[other.spec.id]
            if done.is_set():
                continue
            waited.append(other.spec.id)
            # Why poll: heal_all must be able to cut the wait short even if the predecessor is stuck.
            while not done.wait(0.05):
                if self._cancel.is_set():
                    return waited, other.spec.id
        return waited, None

    def _play_unguarded(self, item: ScheduledFault) -> None:
        spec = item.spec
        if not self._wait_until(item.start_s):
            self._error(item, "start", FaultNotApplicable(
                f"heal_all came at {self._offset()} s, before the fault's start offset {item.start_s} s"))
            self.outcomes[spec.id] = "cancelled"
            return
        # Why wait: redis-write-stall seed 101's f01 healed 6.6 s late (its apply overran), so f02 paused the
        # same master inside f01's stall and f01's heal ended both; f02's probe then saw writes answer.
        waited, running = self._wait_for_predecessors(item)
        if running is not None:
            self._error(item, "start", FaultNotApplicable(
                f"heal_all came at {self._offset()} s while the fault waited for {running} (planned to end "
                f"by this fault's start offset {item.start_s} s) to heal"))
            self.outcomes[spec.id] = "cancelled"
            return
        client = is_client_fault(spec.kind)
        fault: Fault | None = None
        if client and self.client_player is None:
            self._error(item, "apply", FaultNotApplicable(
                f"client fault {spec.kind!r} needs the executor's client player; none was given"))
            return
        if not client:
            fault = build_fault(spec)
        self._record("fault_start", fault_id=spec.id, fault_kind=spec.kind,
                     detail={"target": spec.target, "params": dict(spec.params), "planned_start_s": item.start_s,
                             "planned_end_s": item.end_s, "offset_s": self._offset(),
                             **({"waited_for": waited} if waited else {})})
        try:
            evidence = self.client_player(spec, "apply") if client else fault.apply(self.ctx)
        except Exception as error:  # noqa: BLE001 - becomes a fault_error row
            self._error(item, "apply", error)
            self._heal_after_failed_apply(item, fault)
            return
        self.outcomes[spec.id] = "applied"
        self._evidence(item, "apply", fault, evidence)
        self._wait_until(item.end_s)  # cancelled early by heal_all: heal now
        self._record("fault_heal", fault_id=spec.id, fault_kind=spec.kind,
                     node=getattr(getattr(fault, "node", None), "name", None),
                     detail={"planned_end_s": item.end_s, "offset_s": self._offset(),
                             "early": self._cancel.is_set()})
        try:
            evidence = self.client_player(spec, "heal") if client else fault.heal(self.ctx)
        except Exception as error:  # noqa: BLE001 - becomes a fault_error row
            self._error(item, "heal", error)
            return
        self._evidence(item, "heal", fault, evidence)
        self.outcomes[spec.id] = "healed"

    def _heal_after_failed_apply(self, item: ScheduledFault, fault: Fault | None) -> None:
        """A half-applied fault (e.g. rules installed, evidence failed) must not outlive its slot."""
        if fault is None:
            return
        try:
            fault.heal(self.ctx)
        except Exception:  # noqa: BLE001, S110 - the apply error is already recorded; heal_all sweeps
            pass

    # --- the final phase --------------------------------------------------------------------------

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for every worker; True when all finished."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for worker in self._workers:
            worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(worker.is_alive() for worker in self._workers)

    def cancel(self) -> None:
        """Stop every waiting fault worker now (a broken or interrupted run); heals nothing."""
        self._cancel.set()

    def heal_all(self, join_timeout_s: float | None = None) -> dict[str, Any]:
        """Heal everything, bring every node back, wait until ready.  Never raises; returns a summary."""
        summary: dict[str, Any] = {"network_removed": [], "resumed": [], "started": [], "errors": []}
        self._cancel.set()
        timeout = join_timeout_s if join_timeout_s is not None else (
            2 * self.ctx.effect_timeout_s + self.ctx.ready_timeout_s + 10)
        if not self.join(timeout):
            stuck = [worker.name for worker in self._workers if worker.is_alive()]
            summary["errors"].append(f"fault workers still running after {timeout} s: {', '.join(stuck)}")
        try:
            summary["network_removed"] = heal_all_network()
        except Exception as error:  # noqa: BLE001 - reported in the summary and the history
            summary["errors"].append(f"network heal: {error}")
        summary["unpaused"] = release_client_pauses(self.ctx.topology)
        nodes = all_nodes(self.ctx.topology)
        for node in nodes:
            try:
                if node.is_alive() and (getattr(node, "paused", False) or probes.is_stopped(node.pid)):
                    node.resume()
                    self.ctx.note_node_event(node.name, "resume", reason="heal_all")
                    summary["resumed"].append(node.name)
                elif not node.is_alive():
                    node.start()
                    self.ctx.note_node_event(node.name, "start", reason="heal_all", pid=node.pid)
                    summary["started"].append(node.name)
            except Exception as error:  # noqa: BLE001 - reported
                summary["errors"].append(f"{node.name}: {type(error).__name__}: {error}")
        for node in nodes:
            try:
                node.wait_ready(self.ctx.ready_timeout_s)
            except Exception as error:  # noqa: BLE001 - reported
                summary["errors"].append(f"{node.name} not ready: {type(error).__name__}: {error}")
        # The topology's own readiness (e.g. Redis Cluster formed again), when it offers one.
        wait_topology = getattr(self.ctx.topology, "wait_ready", None) or getattr(
            getattr(self.ctx.topology, "redis", None), "wait_ready", None)
        if callable(wait_topology):
            try:
                wait_topology(self.ctx.ready_timeout_s)
            except Exception as error:  # noqa: BLE001 - reported
                summary["errors"].append(f"topology not ready: {type(error).__name__}: {error}")
        for error in summary["errors"]:
            self._record("fault_error", detail={"stage": "heal_all", "reason": error, "offset_s": self._offset()})
        summary["outcomes"] = dict(self.outcomes)
        return summary
