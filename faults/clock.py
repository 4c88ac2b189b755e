"""Clock faults: a node's wall clock offset, jumped, strobed or drifting, through libfaketime (faults/libfaketime.py).

A node the plan's clock faults may hit starts with libfaketime preloaded and reads its offset from
``<run_dir>/clock/<node>`` on every clock call (ReferenceTarget.prepare_clocks); these faults rewrite that
file while the node runs.  Every change of a node's offset is a ``node_event`` row (action "clock",
``offset_s``): that is the node's clock timeline in the history (docs/clock-model.md reads it).

    clock_offset   the offset becomes ``offset_s``; heal sets it back
    clock_jump     the clock jumps by ``delta_s`` (forward or back); heal jumps back, unless ``instant``: then
                   the jump stays (an NTP step nobody undoes) and heal only re-checks it
    clock_strobe   the offset alternates between ``offset_a_s`` and ``offset_b_s`` every ``period_s`` for the
                   fault's slot; heal sets it back
    clock_drift    the clock runs fast or slow by ``rate_ppm`` (the file rewritten every ``update_s`` by a
                   nemesis thread); heal sets it back

"Back" is the offset the node had when the fault was applied (0 unless an instant jump came before).

Evidence: the offset file holds the planned offset, and the clock the node's runtime sees: a Redis node's
``TIME``; for a reference-broker node (no endpoint tells its time) a short-lived probe process started with the
node's own LD_PRELOAD environment prints ``time.time()``.  Either against the harness's own clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    FaultSpecError,
    KindInfo,
    Param,
    register,
)
from faults.libfaketime import (
    LIBFAKETIME,
    MAX_OFFSET_S,
    ClockFile,
    SeenOffset,
    libfaketime_problem,
    offset_file_of,
    probe_offset,
    redis_time_offset,
)
from faults.selectors import kafka_role_of, parse_selector, resolve_nodes

CLOCK_KINDS = ("clock_offset", "clock_jump", "clock_strobe", "clock_drift")
CLOCK_ACTION = "clock"  # node_event detail.action of every offset change
# How far the clock a node shows may be from its offset file (beyond the reading's own uncertainty): the
# file is read on every call, so only scheduling noise of the reading separates them.
SEEN_TOLERANCE_S = 0.1
DRIFT_ROW_EVERY_S = 1.0  # a drifting clock's timeline row cadence (the offset is linear in between)
UNREACHED_ROLES = {
    "kafka": "Tansu is a static-pie Rust binary: no dynamic loader, so libfaketime's LD_PRELOAD never reaches it",
    "storage": "the S3 stand-in serves Tansu only, whose clock cannot be moved (a static binary); its clock is "
               "not wired, and skewing one side of their signed requests judges nothing of the broker under test",
}
BROKER_SELECTORS = ("broker", "broker-random", "broker-minority", "broker-majority", "broker-holding")
REDIS_SELECTORS = ("redis-master-of", "redis-replica-of", "redis-random-master", "redis-random-replica")


def _nonzero(value: float) -> str | None:
    return "0 moves no clock; give a non-zero value" if value == 0 else None


_OFFSET_RANGE = {"min": -MAX_OFFSET_S, "max": MAX_OFFSET_S}


# --- the schedules (pure) -------------------------------------------------------------------------------------

def planned_offset(kind: str, params: Mapping[str, Any], base_s: float, elapsed_s: float) -> float:
    """The offset the node's file holds ``elapsed_s`` after apply, for a node whose offset was ``base_s``."""
    if kind == "clock_offset":
        return float(params["offset_s"])
    if kind == "clock_jump":
        return base_s + float(params["delta_s"])
    if kind == "clock_strobe":
        phase = int(max(elapsed_s, 0.0) // float(params["period_s"])) % 2
        return base_s + float(params["offset_b_s"] if phase else params["offset_a_s"])
    if kind == "clock_drift":
        return base_s + float(params["rate_ppm"]) * 1e-6 * max(elapsed_s, 0.0)
    raise ValueError(f"not a clock fault kind: {kind!r}")


def healed_offset(kind: str, params: Mapping[str, Any], base_s: float) -> float:
    """The offset after heal: back to the base, except an instant jump, which stays."""
    if kind == "clock_jump" and params.get("instant"):
        return base_s + float(params["delta_s"])
    return base_s


def change_times(kind: str, params: Mapping[str, Any], duration_s: float) -> list[float]:
    """When (seconds after apply) the nemesis rewrites the file within a slot of ``duration_s``: apply at 0,
    then every strobe flip / drift update."""
    if kind == "clock_strobe":
        step = float(params["period_s"])
    elif kind == "clock_drift":
        step = float(params["update_s"])
    else:
        return [0.0]
    count = int(duration_s // step)
    return [round(i * step, 9) for i in range(count + 1) if i * step < duration_s or i == 0]


def file_contents(kind: str, params: Mapping[str, Any], base_s: float, duration_s: float) -> list[str]:
    """Every content the offset file takes for one slot, heal included (pure; what the unit tests pin)."""
    from faults.libfaketime import format_offset

    written = [format_offset(planned_offset(kind, params, base_s, t)) for t in change_times(kind, params, duration_s)]
    changes = [text for i, text in enumerate(written) if i == 0 or text != written[i - 1]]
    return changes + [format_offset(healed_offset(kind, params, base_s))]


# --- load-time checks ------------------------------------------------------------------------------------------

def target_roles(target: str | None) -> set[str]:
    """The roles a clock fault's selector may hit on the reference topology (which nodes start preloaded)."""
    if not target:
        return set()
    selector = parse_selector(target)
    if selector.how in BROKER_SELECTORS:
        return {"broker"}
    if selector.how in REDIS_SELECTORS:
        return {"redis"}
    if selector.how == "node":
        name = selector.arg or ""
        return {"broker"} if name.startswith("broker-") else {"redis"} if name.startswith("redis-") else set()
    return set()


def check_spec(kind: str, target: str | None, params: Mapping[str, Any]) -> None:
    """What the schema cannot say, refused at load: a role libfaketime cannot reach, a strobe between equal
    offsets.  Raises FaultSpecError (the caller adds the fault id)."""
    if kind not in CLOCK_KINDS:
        return
    role = kafka_role_of(target) if target else None
    if role in UNREACHED_ROLES:
        raise FaultSpecError(f"fault kind {kind!r}: target {target!r} is the {role} node: {UNREACHED_ROLES[role]}; "
                             "clock faults reach broker nodes (broker:N, broker-random, broker-minority, "
                             "broker-majority, broker-holding:CLIENT) and Redis nodes (redis-*, node:redis-...)")
    if kind == "clock_strobe" and params.get("offset_a_s") == params.get("offset_b_s"):
        raise FaultSpecError(f"fault kind {kind!r}: offset_a_s = offset_b_s = {params.get('offset_a_s')!r}: a "
                             "strobe alternates between two different offsets")


def planned_clock_roles(faults: Iterable[Any]) -> set[str]:
    """The roles a plan's clock faults (FaultSlot objects or dicts) may hit: those nodes start preloaded."""
    roles: set[str] = set()
    for fault in faults:
        kind = fault.get("kind") if isinstance(fault, Mapping) else fault.kind
        target = fault.get("target") if isinstance(fault, Mapping) else fault.target
        if kind in CLOCK_KINDS:
            roles |= target_roles(target) or {"broker"}
    return roles


# --- the live fault --------------------------------------------------------------------------------------------

class _NodeClock:
    """One node's clock under a fault: its file, the offset before the fault, the schedule's thread."""

    def __init__(self, node: Any) -> None:
        path = offset_file_of(node)
        if path is None:
            raise FaultNotApplicable(f"node {node.name} was not started under libfaketime (no preload in its "
                                     "environment): ReferenceTarget.prepare_clocks starts a plan's clock-fault "
                                     "targets under it")
        self.node, self.file = node, ClockFile(path)
        self.base_s = self.file.read()
        self.applied_at = 0.0
        self.last_s = self.base_s
        self.changes = 0

    def preloaded(self) -> Check:
        """libfaketime is mapped into the node's process (the runtime loaded it, not only its environment)."""
        pid = getattr(self.node, "pid", None)
        try:
            with open(f"/proc/{pid}/maps") as maps:
                loaded = any(LIBFAKETIME.name in line for line in maps)
        except (OSError, TypeError):
            loaded = False
        return Check("libfaketime loaded in the node's process", {"node": self.node.name, "pid": pid,
                                                                  "library": LIBFAKETIME.name}, loaded)

    def seen(self) -> SeenOffset:
        """The clock the node's runtime sees: Redis TIME, else a probe process under the same environment."""
        if getattr(self.node, "role", "") == "redis":
            return redis_time_offset(self.node.host, self.node.port)
        return probe_offset(self.file.path)


class ClockFault:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.clocks: list[_NodeClock] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def node(self) -> Any:
        """What the nemesis names in its rows: the node, or every node of a set ("broker-1+broker-3")."""
        return SimpleNamespace(name="+".join(clock.node.name for clock in self.clocks) or None)

    # the file and the timeline row, together: every change of offset is in the history
    def _set(self, ctx: FaultContext, clock: _NodeClock, offset_s: float, reason: str, **detail: Any) -> None:
        clock.file.write(offset_s)
        clock.last_s = offset_s
        ctx.note_node_event(clock.node.name, CLOCK_ACTION, fault_id=self.spec.id, offset_s=round(offset_s, 6),
                            kind=self.spec.kind, reason=reason, **detail)

    def apply(self, ctx: FaultContext) -> Evidence:
        problem = libfaketime_problem()
        if problem:
            raise FaultNotApplicable(f"fault {self.spec.id}: {problem}")
        nodes = resolve_nodes(ctx.topology, self.spec.target, ctx.rng_for(self.spec.id), ctx.broker_key_prefix)
        self.clocks = [_NodeClock(node) for node in nodes]
        params, kind = self.spec.params, self.spec.kind
        for clock in self.clocks:
            clock.applied_at = time.monotonic()
            extra = {"rate_ppm": params["rate_ppm"]} if kind == "clock_drift" else {}
            self._set(ctx, clock, planned_offset(kind, params, clock.base_s, 0.0), "apply", base_s=clock.base_s,
                      **extra)
        if kind in ("clock_strobe", "clock_drift"):
            self._thread = threading.Thread(target=self._play, args=(ctx,), name=f"clock-{self.spec.id}", daemon=True)
            self._thread.start()
        return Evidence.of(*(check for clock in self.clocks
                             for check in [clock.preloaded(), *self._checks(clock, "apply")]))

    def _play(self, ctx: FaultContext) -> None:
        """The schedule's thread: strobe flips, drift updates (their rows: every flip; drift once a second)."""
        kind, params = self.spec.kind, self.spec.params
        step = float(params["period_s"] if kind == "clock_strobe" else params["update_s"])
        ticks = 0
        last_row = time.monotonic()
        while not self._stop.wait(step - ((time.monotonic() - self.clocks[0].applied_at) % step)):
            ticks += 1
            now = time.monotonic()
            row = kind == "clock_strobe" or now - last_row >= DRIFT_ROW_EVERY_S
            for clock in self.clocks:
                # a strobe's phase by its tick count (a wake-up a hair early must not read the old phase)
                elapsed = ticks * step if kind == "clock_strobe" else now - clock.applied_at
                offset = planned_offset(kind, params, clock.base_s, elapsed)
                clock.changes += 1
                if row:
                    self._set(ctx, clock, offset, "strobe" if kind == "clock_strobe" else "drift")
                else:
                    clock.file.write(offset)
                    clock.last_s = offset
            if row:
                last_row = now

    def _checks(self, clock: _NodeClock, stage: str) -> list[Check]:
        before = clock.file.read()
        seen = clock.seen()
        after = clock.file.read()
        expected = clock.last_s
        low, high = min(before, after), max(before, after)
        slack = SEEN_TOLERANCE_S + seen.error_s
        return [
            Check("offset file holds the offset", {"node": clock.node.name, "file": str(clock.file.path),
                                                  "offset_s": round(before, 6), "expected_s": round(expected, 6),
                                                  "stage": stage},
                  self._file_as_planned(clock, before, stage)),
            Check("the node's clock is offset", {"node": clock.node.name, **seen.to_dict(),
                                                 "file_offset_s": [round(low, 6), round(high, 6)],
                                                 "tolerance_s": round(slack, 4)},
                  low - slack <= seen.offset_s <= high + slack),
        ]

    def _file_as_planned(self, clock: _NodeClock, value: float, stage: str) -> bool:
        """Whether the file holds what the schedule holds now; a strobe / drift thread may have moved on since
        ``last_s`` was noted, so for those: one of the strobe's two offsets, or the drift's line within an update."""
        kind, params = self.spec.kind, self.spec.params
        if stage == "heal" or self._thread is None:
            return abs(value - clock.last_s) < 1e-6
        if kind == "clock_strobe":
            return any(abs(value - (clock.base_s + float(params[key]))) < 1e-6 for key in ("offset_a_s", "offset_b_s"))
        planned = planned_offset(kind, params, clock.base_s, time.monotonic() - clock.applied_at)
        return abs(value - planned) <= abs(float(params["rate_ppm"])) * 1e-6 * (float(params["update_s"]) + 0.5) + 1e-6

    def heal(self, ctx: FaultContext) -> Evidence:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        checks: list[Check] = []
        kind, params = self.spec.kind, self.spec.params
        for clock in self.clocks:
            reached = clock.last_s
            target = healed_offset(kind, params, clock.base_s)
            if kind == "clock_jump" and params.get("instant"):
                # the jump stays: nothing is written, the timeline row at apply still holds
                pass
            else:
                self._set(ctx, clock, target, "heal", reached_s=round(reached, 6))
            if kind == "clock_strobe":
                checks.append(Check("the offset alternated", {"node": clock.node.name, "flips": clock.changes}, clock.changes >= 1))
            if kind == "clock_drift":
                checks.append(Check("the clock drifted", {"node": clock.node.name, "from_s": clock.base_s,
                                                          "reached_s": round(reached, 6), "updates": clock.changes},
                                    reached != clock.base_s))
            checks.extend(self._checks(clock, "heal"))
        return Evidence.of(*checks)


register(KindInfo(
    name="clock_offset", category="process", target="node", factory=ClockFault,
    description="set the target node's wall-clock offset to offset_s (libfaketime); heal sets it back",
    params=(Param("offset_s", float, 30.0, "the node's clock offset in seconds (+ ahead, - behind)",
                  check=_nonzero, **_OFFSET_RANGE),),
))
register(KindInfo(
    name="clock_jump", category="process", target="node", factory=ClockFault,
    description="jump the target node's wall clock by delta_s (forward or back); heal jumps back unless instant",
    params=(Param("delta_s", float, 30.0, "the jump in seconds (+ forward, - back)", check=_nonzero,
                  **_OFFSET_RANGE),
            Param("instant", bool, False, "true: the jump stays after the slot (heal only re-checks it)")),
))
register(KindInfo(
    name="clock_strobe", category="process", target="node", factory=ClockFault,
    description="alternate the target node's clock offset between offset_a_s and offset_b_s every period_s for "
                "the slot; heal sets it back",
    params=(Param("offset_a_s", float, 0.0, "the first offset (seconds)", **_OFFSET_RANGE),
            Param("offset_b_s", float, 30.0, "the second offset (seconds)", **_OFFSET_RANGE),
            Param("period_s", float, 1.0, "time between flips", min=0.2, max=3600.0)),
))
register(KindInfo(
    name="clock_drift", category="process", target="node", factory=ClockFault,
    description="make the target node's clock run fast (+) or slow (-) by rate_ppm; heal sets it back",
    params=(Param("rate_ppm", float, 100000.0, "drift in parts per million (1e6 = one second per second; "
                  "100000 = 0.1 s/s)", min=-1e6, max=1e6, check=_nonzero),
            Param("update_s", float, 0.1, "how often the offset file is rewritten", min=0.01, max=5.0)),
))
