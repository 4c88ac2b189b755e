"""The small side of a history, in plain Python: sessions, subscriptions, offline windows, faults, phases
and snapshots (thousands of rows, collected once), plus the invariants decided from them alone."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from contracts.history_schema import Kind, Phase
from contracts.invariants import RECOVERY_AFTER_FAULT_S
from spark_checkers.guarantees import Guarantees

SMALL_KINDS = (
    Kind.CONNECT, Kind.CONNECT_FAIL, Kind.DISCONNECT, Kind.SUBSCRIBE_ACK, Kind.UNSUBSCRIBE_ACK, Kind.NODE_EVENT,
    Kind.FAULT_START, Kind.FAULT_HEAL, Kind.FAULT_EVIDENCE, Kind.FAULT_ERROR, Kind.SESSION_SNAPSHOT, Kind.PHASE,
)
NEVER = (1 << 62)  # "no end" for intervals, as a long Spark can compare
# The clock timeline (docs/clock-model.md): the node_event action of every change of a node's wall-clock offset
# and the fault kinds that make them (faults/clock.py CLOCK_ACTION, CLOCK_KINDS; tests/unit/test_clock_skew.py
# pins them equal).  Not imported from there: the checkers read a history on machines without the harness.
CLOCK_ACTION = "clock"
CLOCK_FAULT_KINDS = ("clock_offset", "clock_jump", "clock_strobe", "clock_drift")
BROKER, REDIS = "broker", "redis"  # the roles whose clocks a clock fault moves


def detail_of(row: dict) -> dict[str, Any]:
    try:
        value = json.loads(row.get("detail") or "{}")
    except json.JSONDecodeError:
        return {"unparsed": row.get("detail")}
    return value if isinstance(value, dict) else {"value": value}


@dataclass(frozen=True)
class Subscription:
    client: str
    topic_filter: str
    granted_qos: int
    t_from: int
    t_to: int | None
    persistent: bool


@dataclass(frozen=True)
class FaultSpan:
    fault_id: str
    kind: str
    node: str | None
    t_start: int
    t_heal: int | None
    bit: bool | None  # True if every evidence row says it bit; None: no evidence row
    error: str | None
    # When its heal was done (its last heal evidence or error row; a restart's heal waits until the node is
    # ready): None when it has none (never healed, or a history without such rows).
    t_healed: int | None = None


class ClockRow(NamedTuple):
    """One change of a node's wall-clock offset (its clock minus the harness's), in force from ``t_mono_us`` to the
    node's next row; ``drifting``: the offset runs linearly from this row's value to the next row's."""

    t_mono_us: int
    offset_us: int
    drifting: bool


@dataclass(frozen=True)
class ClockSegment:
    """One stretch of a node's clock timeline, [t_from, t_to), with the least and the most offset it takes (a
    drifting stretch: its two ends).  The runs table's ``clock_rows`` (job/clock.py reads them in Spark)."""

    node: str
    role: str
    t_from: int
    t_to: int
    lo_us: int
    hi_us: int


@dataclass
class Timeline:
    run_id: str
    subscriptions: list[Subscription] = field(default_factory=list)
    # client -> [(idx, d, c, discarded)]: offline from d to reconnect c (NEVER: no reconnect); discarded: the
    # session ended at c (clean start or expiry), so its backlog is no longer owed.
    offline: dict[str, list[tuple[int, int, int, bool]]] = field(default_factory=dict)
    connect_seqs: dict[str, list[int]] = field(default_factory=dict)
    fresh_seqs: dict[str, list[int]] = field(default_factory=dict)  # connects that start a new session
    # The fresh connects whose new session is persistent: only there the reference broker stores the messages
    # and hands out their packet ids from the session's stored counter (white box, lua/save.lua).
    persistent_fresh_seqs: dict[str, list[int]] = field(default_factory=dict)
    # client -> the connects that legally began a new session after an earlier one (the old one discarded):
    # [{seq, t, why, clean_start, session_present, offline_s, expiry_s}], why = "clean_start" (the client asked),
    # "expired" (MQTT 5 session expiry elapsed while offline; the broker agreed: session present 0) or
    # "after_clean" (the session before was not persistent and ended at its disconnect).  A connect that answers
    # session present 0 to a live persistent session is no legal boundary: durability.session_lost judges it.
    new_sessions: dict[str, list[dict]] = field(default_factory=dict)
    disconnects: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # client -> [(seq, t)]
    connects: dict[str, list[dict]] = field(default_factory=dict)
    faults: list[FaultSpan] = field(default_factory=list)
    node_events: list[dict] = field(default_factory=list)
    # (client, filter, t_from) -> (Subscription Identifier or None, Retain As Published): the options of the
    # SUBSCRIBE whose SUBACK began that subscription (subscribe_ack detail; Subscription.t_from is that row's time).
    sub_options: dict[tuple[str, str, int], tuple[int | None, bool]] = field(default_factory=dict)
    phases: dict[str, dict] = field(default_factory=dict)
    snapshots: list[dict] = field(default_factory=list)
    # node -> its clock timeline, oldest first (clock node_event rows; before a node's first row its offset is 0)
    clock: dict[str, list[ClockRow]] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)  # every node a row names: a node without clock rows is at 0
    incomplete: list[str] = field(default_factory=list)
    violations: dict[str, list[dict]] = field(default_factory=dict)  # invariant -> witnesses (all of them)
    unknown: dict[str, str] = field(default_factory=dict)  # invariant -> reason
    # invariant -> why it has nothing to judge in this run (the Will rules without a Will: spark_checkers/wills.py)
    inapplicable: dict[str, str] = field(default_factory=dict)
    judged: dict[str, dict[str, int]] = field(default_factory=dict)  # invariant family -> what it judged
    t_first: int = 0
    t_last: int = 0

    @property
    def bucket_us(self) -> int:
        span = max(1, self.t_last - self.t_first)
        return max(1_000_000, -(-span // 200) // 1_000_000 * 1_000_000)

    def fault_times(self) -> list[int]:
        times = [f.t_start for f in self.faults] + [e["t_mono_us"] for e in self.node_events]
        return sorted(times)

    def nodes_of(self, role: str) -> set[str]:
        """Every node of ``role`` the history names, with or without clock rows."""
        return {n for n in self.nodes | set(self.clock) if role_of(n) == role}

    def clock_skew_us(self, stampers: Iterable[str], judges: Iterable[str], a: int, b: int) -> tuple[int, int]:
        """(δ⁺, δ⁻) over [a, b]: how early, and how late, a time stamped on one of ``stampers`` may be judged on
        one of ``judges`` (``clock_skew_us``)."""
        return clock_skew_us(self.clock, stampers, judges, a, b)

    def clock_segments(self) -> list[ClockSegment]:
        """The clock timeline as the runs table's ``clock_rows`` (``clock_segments``)."""
        return clock_segments(self.clock, self.nodes)


def role_of(node: str) -> str | None:
    """A node's role for the clock model by its name (broker-N, redis-N); None: a node no clock fault moves."""
    return REDIS if node.startswith("redis-") else BROKER if node.startswith("broker-") else None


def clock_row(row: dict) -> ClockRow | None:
    """The ClockRow of a node_event row with detail.action "clock" (faults/clock.py), else None."""
    detail = detail_of(row)
    if detail.get("action") != CLOCK_ACTION or not isinstance(detail.get("offset_s"), int | float):
        return None
    return ClockRow(row["t_mono_us"], round(float(detail["offset_s"]) * 1e6),
                    detail.get("reason") == "drift" or "rate_ppm" in detail)


def _clock_timeline(timeline: Timeline) -> None:
    """Timeline.clock from the clock node_event rows.  Two rows the history implies are added: the offset a drift
    reached just before its heal (the heal row's ``reached_s``: the drift ran on between its last row and the heal),
    and, for a drift that never healed, where its rate took it by the end of the history."""
    rates: dict[str, float] = {}
    for event in timeline.node_events:
        row, node = clock_row(event), event.get("node")
        if row is None or not node:
            continue
        detail = detail_of(event)
        rows = timeline.clock.setdefault(node, [])
        if isinstance(detail.get("rate_ppm"), int | float):
            rates[node] = float(detail["rate_ppm"])
        if rows and rows[-1].drifting and not row.drifting and isinstance(detail.get("reached_s"), int | float):
            rows.append(ClockRow(row.t_mono_us, round(float(detail["reached_s"]) * 1e6), False))
        rows.append(row)
    for node, rows in timeline.clock.items():
        last = rows[-1]
        if last.drifting and node in rates and timeline.t_last > last.t_mono_us:
            drift = round(rates[node] * 1e-6 * (timeline.t_last - last.t_mono_us))
            rows.append(ClockRow(timeline.t_last, last.offset_us + drift, False))


def offset_range_us(rows: list[ClockRow], a: int, b: int) -> tuple[int, int]:
    """(inf, sup) of one node's offset over [a, b]: the value in force at ``a`` (0 before the node's first row),
    every row in (a, b], and, when the row in force at ``b`` drifts, the next row (the drift reaches it linearly)."""
    before = [r for r in rows if r.t_mono_us <= a]
    inside = [r for r in rows if a < r.t_mono_us <= b]
    values = [before[-1].offset_us if before else 0] + [r.offset_us for r in inside]
    at_b = inside[-1] if inside else before[-1] if before else None
    if at_b is not None and at_b.drifting:
        after = [r for r in rows if r.t_mono_us > b]
        if after:
            values.append(after[0].offset_us)
    return min(values), max(values)


def clock_skew_us(clock: dict[str, list[ClockRow]], stampers: Iterable[str], judges: Iterable[str], a: int,
                  b: int) -> tuple[int, int]:
    """(early_us, late_us) = (δ⁺, δ⁻) of docs/clock-model.md over W = [a, b]: a time one of ``stampers`` stamps
    and one of ``judges`` judges may come due up to δ⁺ early (a judge's clock ahead of the stamp's) and up to δ⁻
    late.  δ⁺ = max(0, max over judges of sup Δ − min over stampers of inf Δ), δ⁻ the other way round.  A node
    without clock rows has Δ = 0 throughout; no nodes on a side: nothing to judge, (0, 0)."""
    stamp = [offset_range_us(clock.get(n, []), a, b) for n in set(stampers)]
    judge = [offset_range_us(clock.get(n, []), a, b) for n in set(judges)]
    if not stamp or not judge:
        return 0, 0
    early = max(hi for _, hi in judge) - min(lo for lo, _ in stamp)
    late = max(hi for _, hi in stamp) - min(lo for lo, _ in judge)
    return max(0, early), max(0, late)


def clock_segments(clock: dict[str, list[ClockRow]], nodes: Iterable[str] = ()) -> list[ClockSegment]:
    """Every node's clock timeline as stretches [t_from, t_to) with their least and most offset, so that a window
    [a, b] sees exactly the values ``offset_range_us`` takes: those of the stretches with t_from <= b and t_to > a.
    Empty for a history without clock rows (then every skew is 0); with some, every other node of a role that
    clocks move (``nodes``) is one stretch at 0 (its clock is the harness's)."""
    if not clock:
        return []
    segments = []
    for node, rows in sorted(clock.items()):
        role = role_of(node) or BROKER  # a clock row of an unknown node: counted with the brokers, the wider reading
        segments.append(ClockSegment(node, role, -NEVER, rows[0].t_mono_us, 0, 0))
        for i, row in enumerate(rows):
            nxt = rows[i + 1] if i + 1 < len(rows) else None
            ends = [row.offset_us] + ([nxt.offset_us] if row.drifting and nxt is not None else [])
            segments.append(ClockSegment(node, role, row.t_mono_us, nxt.t_mono_us if nxt else NEVER, min(ends),
                                         max(ends)))
    for node in sorted(set(nodes) - set(clock)):
        if role_of(node) is not None:
            segments.append(ClockSegment(node, role_of(node), -NEVER, NEVER, 0, 0))
    return segments


def segments_skew_us(segments: list[ClockSegment], role: str, a: int, b: int) -> int:
    """max(0, sup − inf) over [a, b] of every node of ``role`` from its ClockSegments: what job/clock.py computes
    per row in Spark (the unit tests hold it to ``clock_skew_us`` of the same nodes as stampers and judges)."""
    seen = [s for s in segments if s.role == role and s.t_from <= b and s.t_to > a]
    return max(s.hi_us for s in seen) - min(s.lo_us for s in seen) if seen else 0


def clock_changes(timeline: Timeline, nodes: Iterable[str] | None, a: int, b: int) -> str:
    """The clock changes of ``nodes`` (None: every node with a clock row) that bound a window [a, b], in words:
    "broker-1's clock jumped +120.000 s at 3.200 s (to +120.000 s)"; a drift as one change from its first row to
    its last; the offset in force at ``a`` when nothing changes inside.  '' when no node has a clock row."""
    o = timeline.t_first
    parts = []
    for node in sorted(timeline.clock if nodes is None else set(nodes) & set(timeline.clock)):
        rows = timeline.clock[node]
        before = [r for r in rows if r.t_mono_us <= a]
        previous = before[-1].offset_us if before else 0
        inside = [r for r in rows if a < r.t_mono_us <= b]
        if not inside:
            if previous:
                parts.append(f"{node}'s clock was {previous / 1e6:+.3f} s off from before {(a - o) / 1e6:.3f} s")
            continue
        # Each row is a change from the value before it: a jump at the row, or, after a drifting row, the end of a
        # drift (consecutive drift steps are told as one).
        changes: list[list] = []  # [how, t_from, t_to, from_us, to_us]
        prev_row = before[-1] if before else None
        for row in inside:
            drift = prev_row is not None and prev_row.drifting
            if drift and changes and changes[-1][0] == "drift" and changes[-1][2] == prev_row.t_mono_us:
                changes[-1][2], changes[-1][4] = row.t_mono_us, row.offset_us
            elif drift or row.offset_us != previous:
                changes.append(["drift" if drift else "jump", prev_row.t_mono_us if drift else row.t_mono_us,
                                row.t_mono_us, previous, row.offset_us])
            previous, prev_row = row.offset_us, row
        for how, t_from, t_to, was, now in changes:
            if how == "jump":
                parts.append(f"{node}'s clock jumped {(now - was) / 1e6:+.3f} s at {(t_from - o) / 1e6:.3f} s "
                             f"(to {now / 1e6:+.3f} s)")
            else:
                parts.append(f"{node}'s clock drifted from {was / 1e6:+.3f} s to {now / 1e6:+.3f} s between "
                             f"{(t_from - o) / 1e6:.3f} s and {(t_to - o) / 1e6:.3f} s")
    return "; ".join(parts)


def has_mqtt5(timeline: Timeline) -> bool:
    """Whether any client of the run connected with MQTT 5 (an mqtt5_only rule has something to judge)."""
    return any(row.get("protocol") == 5 for rows in timeline.connects.values() for row in rows)


def is_persistent(row: dict) -> bool:
    """MQTT 3.1.1 clean session = 0; MQTT 5 session expiry > 0 or clean start = 0 (TBMQ's rule)."""
    if row.get("clean_start") is False:
        return True
    return row.get("protocol") == 5 and (row.get("session_expiry_s") or 0) > 0


def build_timeline(run_id: str, rows: list[dict], guarantees: Guarantees) -> Timeline:
    rows = sorted(rows, key=lambda r: r["seq"])
    timeline = Timeline(run_id)
    if rows:
        timeline.t_first, timeline.t_last = rows[0]["t_mono_us"], rows[-1]["t_mono_us"]
    by_client: dict[str, list[dict]] = defaultdict(list)
    fault_rows: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        kind = row["kind"]
        if row.get("node"):  # every named node: its clock is the harness's unless a clock row says otherwise
            timeline.nodes.update(n for n in str(row["node"]).split("+") if n)
        if kind in (Kind.CONNECT, Kind.DISCONNECT, Kind.SUBSCRIBE_ACK, Kind.UNSUBSCRIBE_ACK) and row.get("client"):
            by_client[row["client"]].append(row)
        elif kind in (Kind.FAULT_START, Kind.FAULT_HEAL, Kind.FAULT_EVIDENCE, Kind.FAULT_ERROR):
            fault_rows[row.get("fault_id") or f"<no fault_id at seq {row['seq']}>"].append(row)
        elif kind == Kind.NODE_EVENT:
            timeline.node_events.append({**row, "action": detail_of(row).get("action")})
        elif kind == Kind.PHASE:
            detail = detail_of(row)
            timeline.phases.setdefault(str(detail.get("phase")), {**detail, "t_mono_us": row["t_mono_us"],
                                                                  "seq": row["seq"]})
        elif kind == Kind.SESSION_SNAPSHOT:
            timeline.snapshots.append(row)
    for client, client_rows in by_client.items():
        _sessions(timeline, client, client_rows)
        _subscription_options(timeline, client, client_rows)
    for fault_id, frows in fault_rows.items():
        _fault(timeline, fault_id, frows)
    _clock_timeline(timeline)
    for client, client_rows in by_client.items():  # after the faults: a fault in the offline window excuses
        _expired_sessions_present(timeline, client, client_rows, guarantees.tolerance_us)
        _clean_start_sessions_present(timeline, client, client_rows)
    _allow_unpromised_session_losses(timeline, guarantees)
    _unplanned_exits(timeline)
    _unresponsive(timeline, guarantees)
    _phases(timeline)
    _snapshots(timeline, guarantees)
    _wills(timeline, rows, guarantees)
    _retained(timeline, rows, guarantees)
    _shared(timeline)
    return timeline


def _shared(timeline: Timeline) -> None:
    """The shared-subscription rules (spark_checkers/shared.py, on Spark) have nothing to judge without a group."""
    from spark_checkers.shared import NO_SHARED, SHARED_INVARIANTS, shared_groups

    groups = shared_groups(timeline)
    if not groups:
        timeline.inapplicable.update({i: NO_SHARED for i in SHARED_INVARIANTS})
        return
    timeline.judged["shared"] = {"groups": len(groups), "members": sum(len(g.members) for g in groups)}


def _retained(timeline: Timeline, rows: list[dict], guarantees: Guarantees) -> None:
    """The retained-message rule (spark_checkers/retained.py) over the retained publishes, the subscriptions and the
    RETAIN 1 deliveries."""
    from spark_checkers.retained import NO_RETAINED, RETAINED_INVARIANTS, retained_violations

    found, judged = retained_violations(rows, guarantees.slack_us, timeline.t_last)
    if not judged["judged"] and not found:
        timeline.inapplicable.update({i: NO_RETAINED for i in RETAINED_INVARIANTS})
        if judged["undecided"]:
            timeline.inapplicable.update({i: f"{NO_RETAINED} ({judged['undecided']} subscription(s) ended too soon "
                                          "after their SUBACK to tell)" for i in RETAINED_INVARIANTS})
        return
    timeline.judged["retained"] = judged
    for invariant, witnesses in found.items():
        timeline.violations.setdefault(invariant, []).extend(witnesses)


def _wills(timeline: Timeline, rows: list[dict], guarantees: Guarantees) -> None:
    """The Will rules (spark_checkers/wills.py) over the connects, disconnects and the watcher's Will deliveries."""
    from spark_checkers.wills import NO_WILLS, WILL_INVARIANTS, will_violations

    found, judged = will_violations(rows, guarantees.tolerance_us, guarantees.slack_us, timeline.t_last)
    if not judged["connections"]:
        timeline.inapplicable.update({i: NO_WILLS for i in WILL_INVARIANTS})
        return
    timeline.judged["will"] = judged
    for invariant, witnesses in found.items():
        timeline.violations.setdefault(invariant, []).extend(witnesses)


def _allow_unpromised_session_losses(timeline: Timeline, g: Guarantees) -> None:
    """A session lost across a fault the target's declared persistence does not cover (a kill of a broker that
    promises only a graceful stop) was never promised: durability.session_lost_allowed, not a violation."""
    faults = [f for f in timeline.faults if f.kind in g.unpromised_faults
              and g.of_target(f.node)]
    lost = timeline.violations.get("durability.session_lost", [])
    if not faults or not lost:
        return
    allowed = [w for w in lost if any(w["t_disconnect"] - g.slack_us <= f.t_start <= w["t"] for f in faults)]
    for w in allowed:
        fault = next(f for f in faults if w["t_disconnect"] - g.slack_us <= f.t_start <= w["t"])
        w["fault"] = {"fault_id": fault.fault_id, "kind": fault.kind, "node": fault.node, "t_start": fault.t_start}
    timeline.violations["durability.session_lost"] = [w for w in lost if w not in allowed]
    if not timeline.violations["durability.session_lost"]:
        del timeline.violations["durability.session_lost"]
    if allowed:
        timeline.violations.setdefault("durability.session_lost_allowed", []).extend(allowed)


def _sessions(timeline: Timeline, client: str, rows: list[dict]) -> None:
    """Walk one client's lifecycle: sessions, subscriptions and offline windows; spot lost sessions."""
    open_subs: dict[str, tuple[int, int]] = {}  # filter -> (t_from, granted)
    persistent = False
    session_expiry: int | None = None
    last_disconnect: dict | None = None
    online = False
    had_session = False  # an accepted connect before: a session that a new one may discard
    offline: list[tuple[int, int, int, bool]] = []
    timeline.connect_seqs[client] = []
    timeline.fresh_seqs[client] = []
    timeline.persistent_fresh_seqs[client] = []
    timeline.new_sessions[client] = []
    timeline.disconnects[client] = []
    timeline.connects[client] = []
    last_node: str | None = None  # the node of the last accepted connect: where the session was
    # The persistent session the broker last reported lost (session present 0 where it had to be there), until
    # the client discards it (clean start), it would have expired, or a later session of the client is seen to
    # hold a subscription of its own.  While it is pending, a connect that gets session present 1 is that
    # session coming back (durability.session_returned), not a new one: no subscription was granted since the
    # loss, so the session the broker presents can only be the lost one with its subscriptions.
    lost: dict[str, Any] | None = None

    def close_all(t_end: int) -> None:
        for topic_filter, (t_from, granted) in open_subs.items():
            timeline.subscriptions.append(Subscription(client, topic_filter, granted, t_from, t_end, persistent))
        open_subs.clear()

    for row in rows:
        kind, t = row["kind"], row["t_mono_us"]
        if kind == Kind.CONNECT:
            timeline.connect_seqs[client].append(row["seq"])
            timeline.connects[client].append(row)
            if row.get("reason_code") not in (None, 0) and row.get("reason_code", 0) >= 0x80:
                continue  # refused: no session change
            was_persistent, previous_expiry = persistent, session_expiry
            # MQTT 5: the session ended session_expiry_s after the disconnect (0 / absent: TBMQ keeps it).
            expired = (last_disconnect is not None and previous_expiry is not None and previous_expiry > 0
                       and t - last_disconnect["t_mono_us"] > previous_expiry * 1_000_000)
            # The old session ended legally: MQTT 5 session expiry elapsed while offline, or the client itself
            # asked for a clean start (3.1.1 clean session = 1 / MQTT 5 clean start = 1).  Its queue died with it,
            # so that window's backlog is no longer owed (a delivery of it anyway is still fine).
            discarded = expired or row.get("clean_start") is True
            if last_disconnect is not None:
                offline.append((len(offline), last_disconnect["t_mono_us"], t, discarded))
            if expired:
                close_all(last_disconnect["t_mono_us"])
            if row.get("clean_start") is True or (lost is not None and _expired_since(lost, t)):
                lost = None  # discarded by the client, or over by its expiry: nothing of it can come back
            if (row.get("clean_start") is False and was_persistent and not expired and last_disconnect is not None
                    and row.get("session_present") is False):
                witness = {"client": client, "t": t, "seq": row["seq"], "node": row.get("node"),
                           "node_before": last_node, "t_disconnect": last_disconnect["t_mono_us"],
                           "session_expiry_s": previous_expiry, "window_c": t}
                timeline.violations.setdefault("durability.session_lost", []).append(witness)
                if lost is None:
                    lost = {"witnesses": [witness], "subs": dict(open_subs), "window": len(offline) - 1,
                            "t_disconnect": last_disconnect["t_mono_us"], "expiry_s": previous_expiry,
                            "node": last_node}
                else:  # lost again before it came back: the same session, still away
                    lost["witnesses"].append(witness)
            elif lost is not None and row.get("session_present") is True:
                _session_returned(timeline, client, row, lost, offline, open_subs)
                lost = None
            # A legal new session after an earlier one (durability.discarded_session_delivery): the client asked for
            # a clean start, or the old session ended by itself (expired, or not persistent) and the broker agrees.
            why = (None if not had_session else "clean_start" if row.get("clean_start") is True
                   else None if row.get("session_present") is True
                   else "expired" if expired else "after_clean" if not was_persistent else None)
            if why is not None:
                timeline.new_sessions[client].append({
                    "seq": row["seq"], "t": t, "why": why, "clean_start": row.get("clean_start"),
                    "session_present": row.get("session_present"), "expiry_s": previous_expiry,
                    "offline_s": (t - last_disconnect["t_mono_us"]) / 1e6 if last_disconnect is not None else None})
            if row.get("session_present") is not True:
                timeline.fresh_seqs[client].append(row["seq"])
                if is_persistent(row):
                    timeline.persistent_fresh_seqs[client].append(row["seq"])
                close_all(t)  # a new session: whatever was subscribed before is gone
            persistent, had_session, last_node = is_persistent(row), True, row.get("node")
            session_expiry = row.get("session_expiry_s") if row.get("protocol") == 5 else None
            online, last_disconnect = True, None
        elif kind == Kind.DISCONNECT:
            timeline.disconnects[client].append((row["seq"], t))
            if online:
                last_disconnect, online = row, False
                if not persistent:
                    close_all(t)
        elif kind == Kind.SUBSCRIBE_ACK and row.get("topic"):
            # Refused: a reason code >= 0x80 (a history may also carry it in qos, as the schema once said).
            refused = (row.get("reason_code") or 0) >= 0x80 or (row.get("qos") or 0) >= 0x80
            granted = 0 if refused or row.get("qos") is None else row["qos"]
            if row["topic"] in open_subs:  # a re-subscribe replaces the old grant from now on
                old_from, old_granted = open_subs.pop(row["topic"])
                timeline.subscriptions.append(Subscription(client, row["topic"], old_granted, old_from, t, persistent))
            if not refused:
                open_subs[row["topic"]] = (t, granted)
                lost = None  # a later session holds a subscription of its own: a session present is that one
        elif kind == Kind.UNSUBSCRIBE_ACK and row.get("topic") in open_subs:
            t_from, granted = open_subs.pop(row["topic"])
            timeline.subscriptions.append(Subscription(client, row["topic"], granted, t_from, t, persistent))
    if last_disconnect is not None:
        offline.append((len(offline), last_disconnect["t_mono_us"], NEVER, False))
    for topic_filter, (t_from, granted) in open_subs.items():
        timeline.subscriptions.append(Subscription(client, topic_filter, granted, t_from, None, persistent))
    timeline.offline[client] = offline


def _expired_since(lost: dict[str, Any], t: int) -> bool:
    """Whether the lost session's own expiry interval (MQTT 5) had elapsed by ``t`` since its disconnect."""
    expiry = lost.get("expiry_s")
    return expiry is not None and expiry > 0 and t - lost["t_disconnect"] > expiry * 1_000_000


def _session_returned(timeline: Timeline, client: str, row: dict, lost: dict[str, Any],
                      offline: list[tuple[int, int, int, bool]], open_subs: dict[str, tuple[int, int]]) -> None:
    """A session the broker reported lost is presented again at ``row``: durability.session_returned, and the
    session's accounting runs as if it had never been away from the broker (it was not: the broker kept it).

    Its subscriptions are held without a break from before the loss, so what was acknowledged for them while
    the broker said the session was gone is owed to it; and its offline windows from its last disconnect to
    this reconnect become one, so those messages are judged at this reconnect (delivered, lost, trimmed by the
    declared limit or allowed by the declared persistence), never dropped from the counts."""
    t = row["t_mono_us"]
    first = lost["witnesses"][0]
    reinstated = []
    for topic_filter, (t_from, granted) in lost["subs"].items():
        closed = Subscription(client, topic_filter, granted, t_from, first["t"], True)
        if closed in timeline.subscriptions and topic_filter not in open_subs:
            timeline.subscriptions.remove(closed)
            open_subs[topic_filter] = (t_from, granted)
            reinstated.append(topic_filter)
    start = lost["window"]
    if 0 <= start < len(offline):
        merged = (start, offline[start][1], t, False)
        del offline[start:]
        offline.append(merged)
    for witness in lost["witnesses"]:
        witness["returned_at"] = t
        witness["window_c"] = t
    timeline.violations.setdefault("durability.session_returned", []).append({
        "client": client, "t": t, "seq": row["seq"], "node": row.get("node"), "t_lost": first["t"],
        "node_lost": first.get("node"), "node_before": lost.get("node"), "t_disconnect": lost["t_disconnect"],
        "reported_lost": len(lost["witnesses"]), "subscriptions": reinstated, "window_c": t})


def _subscription_options(timeline: Timeline, client: str, rows: list[dict]) -> None:
    """Timeline.sub_options of ``client``'s subscribe_ack rows (a version 1 history has none: no id, no RAP)."""
    for row in rows:
        if row["kind"] == Kind.SUBSCRIBE_ACK and row.get("topic"):
            detail = detail_of(row)
            sub_id = detail.get("sub_id")
            timeline.sub_options[(client, row["topic"], row["t_mono_us"])] = (
                sub_id if isinstance(sub_id, int) and not isinstance(sub_id, bool) else None, detail.get("rap") is True)


# MQTT 5 Session Expiry Interval 0xFFFFFFFF: the session never expires (§3.1.2.11.2).
SESSION_NEVER_EXPIRES = 0xFFFFFFFF


def _expired_sessions_present(timeline: Timeline, client: str, rows: list[dict], tolerance_us: int) -> None:
    """durability.expired_session_present: an accepted MQTT 5 reconnect answered session present 1 more than the
    clock tolerance after the previous connection's disconnect + the Session Expiry Interval its CONNECT sent.  The
    Server must discard the state when the interval has passed ([MQTT-4.1.0-2]), and then has none to present
    ([MQTT-3.2.2-3]).  Not judged: an interval of 0 or none (the reference broker and TBMQ keep a persistent session
    then), 0xFFFFFFFF (never expires), an offline window with a fault or node event in it (the broker may have
    noticed the disconnect only at the keep-alive timeout, or its session clock stood still while it was down).
    A clock fault and its clock rows are no such excuse: the broker's wall clock moved, not its view of the
    connection, and the clock timeline bounds how late the expiry may come (docs/clock-model.md, "Session
    expiry"): the limit is S + δ⁻ + the tolerance, δ⁻ stamped by the disconnect's node, judged by any broker."""
    spans = [(f.t_start, f.t_heal if f.t_heal is not None else NEVER) for f in timeline.faults
             if f.kind not in CLOCK_FAULT_KINDS]
    spans += [(e["t_mono_us"], e["t_mono_us"]) for e in timeline.node_events if e.get("action") != CLOCK_ACTION]
    brokers = timeline.nodes_of(BROKER)
    expiry: int | None = None  # the interval the last accepted connect of this connection sent (MQTT 5)
    online, gone = False, None  # gone: the disconnect that ended the last connection
    for row in rows:
        t = row["t_mono_us"]
        if row["kind"] == Kind.CONNECT:
            if (row.get("reason_code") or 0) >= 0x80:
                continue
            if gone is not None and expiry and 0 < expiry < SESSION_NEVER_EXPIRES and row.get("session_present") is True:
                offline_us = t - gone["t_mono_us"]
                faulted = any(s <= t and e >= gone["t_mono_us"] for s, e in spans)
                # Stamped by the node that saw the disconnect (unknown: any broker), judged by any broker.
                stamper = {gone["node"]} if gone.get("node") else brokers
                _, late_us = timeline.clock_skew_us(stamper, brokers | stamper, gone["t_mono_us"], t)
                if offline_us > expiry * 1_000_000 + late_us + tolerance_us and not faulted:
                    timeline.violations.setdefault("durability.expired_session_present", []).append({
                        "client": client, "t": t, "seq": row["seq"], "node": row.get("node"),
                        "t_disconnect": gone["t_mono_us"], "session_expiry_s": expiry, "offline_us": offline_us,
                        "tol_us": tolerance_us, "clean_start": row.get("clean_start"),
                        # only under a clock that moved: a history without clock rows reads as it always did
                        **({"skew_late_us": late_us, "node_disconnect": gone.get("node")} if late_us else {})})
            expiry = row.get("session_expiry_s") if row.get("protocol") == 5 else None
            online, gone = True, None
        elif row["kind"] == Kind.DISCONNECT and online:
            online, gone = False, row


def _clean_start_sessions_present(timeline: Timeline, client: str, rows: list[dict]) -> None:
    """durability.clean_start_session_present: a connection accepted with clean start 1 (3.1.1: CleanSession = 1)
    answered session present 1.  The server must then discard any session and start a new one, and say so with
    session present 0 ([MQTT-3.2.2-2]; 3.1.1 [MQTT-3.2.2-1])."""
    for row in rows:
        if (row["kind"] == Kind.CONNECT and (row.get("reason_code") or 0) < 0x80 and row.get("clean_start") is True
                and row.get("session_present") is True):
            timeline.violations.setdefault("durability.clean_start_session_present", []).append({
                "client": client, "t": row["t_mono_us"], "seq": row["seq"], "node": row.get("node"),
                "protocol": row.get("protocol")})


def _fault(timeline: Timeline, fault_id: str, rows: list[dict]) -> None:
    start = next((r for r in rows if r["kind"] == Kind.FAULT_START), None)
    heal = next((r for r in rows if r["kind"] == Kind.FAULT_HEAL), None)
    evidence = [r for r in rows if r["kind"] == Kind.FAULT_EVIDENCE]
    errors = [r for r in rows if r["kind"] == Kind.FAULT_ERROR]
    first = start or rows[0]
    # A fault bit when *every* evidence row says so (docs/faults.md): a kill whose apply evidence failed
    # ("port refuses": still accepting) is not proven by its heal evidence ("node alive").
    bit = all(r.get("bit") is True for r in evidence) if evidence else None
    # The start row may name its target only as a selector ("node:rabbitmq"); evidence rows name the node
    # they inspected, which is what attribution compares with.
    node = (first.get("node") or next((r.get("node") for r in rows if r.get("node")), None)
            or detail_of(first).get("node") or detail_of(first).get("target"))
    healed = [r["t_mono_us"] for r in evidence + errors if detail_of(r).get("stage") == "heal"]
    span = FaultSpan(fault_id, first.get("fault_kind") or "?", node, first["t_mono_us"],
                     heal["t_mono_us"] if heal else None, bit,
                     "; ".join(json.dumps(detail_of(r)) for r in errors) or None, max(healed, default=None))
    timeline.faults.append(span)
    # Why unknown, not fail: a fault that was not applied or did not bite means the run did not test what it
    # claimed; that says nothing against the broker, and it is no pass either.
    if span.error:
        stages = {detail_of(r).get("stage") for r in errors}
        what = ("could not be applied" if stages & {"apply", "start", None}
                else "did not heal (the target never came back after it)" if stages & {"heal", "heal_all"}
                else "failed at " + "/".join(sorted(str(x) for x in stages)))
        reason = f"fault {fault_id} ({span.kind} {span.node}) {what}: " + "; ".join(
            str(detail_of(r).get("reason") or json.dumps(detail_of(r))) for r in errors)
    elif bit is not True:
        reason = (f"fault {fault_id} ({span.kind} {span.node}) "
                  + ("was applied but its evidence says it did not take effect" if bit is False
                     else "has no fault_evidence row proving it took effect"))
        timeline.violations.setdefault("meta.fault_bit", []).append({
            "fault_id": fault_id, "fault_kind": span.kind, "node": span.node or "no named node", "t": span.t_start,
            "evidence": "evidence says it did not bite" if bit is False else "no evidence row"})
    else:
        return
    previous = timeline.unknown.get("meta.fault_bit")
    timeline.unknown["meta.fault_bit"] = f"{previous}; {reason}" if previous else reason


def _unplanned_exits(timeline: Timeline) -> None:
    """health.unplanned_exit: a node the run watched exited while no stop or kill of it was asked for
    (harness/death_watch.py records it as a node_event "exited")."""
    for event in timeline.node_events:
        if event.get("action") != "exited":
            continue
        detail = detail_of(event)
        timeline.violations.setdefault("health.unplanned_exit", []).append({
            "node": event.get("node"), "t": event["t_mono_us"], "exit_status": detail.get("exit_status"),
            "log_tail": list(detail.get("log_tail") or [])[-8:]})


def unplanned_exit_note(timeline: Timeline) -> str:
    """' while node X was down: it exited at +Ts (status S) outside every planned fault', or ''."""
    exits = timeline.violations.get("health.unplanned_exit", [])
    if not exits:
        return ""
    first = exits[0]
    return (f"; node {first['node']} had exited at {(first['t'] - timeline.t_first) / 1e6:.3f} s (exit status "
            f"{first['exit_status']}) outside every planned fault and was not brought back")


def _unresponsive(timeline: Timeline, guarantees: Guarantees) -> None:
    """health.unresponsive: a broker node failed the run's health probe (harness/death_watch.py records a
    node_event "unresponsive" once a run of failed probes reaches its grace, "responsive" when the node answers
    again) for longer than that grace while no planned fault covered it.  Covered: from a fault's start to the
    end of its heal (a restart's heal waits until the node is ready), for every fault of the target but a
    client fault — a pause of the node, a partition, a kill or restart, and a fault of what the node depends
    on (a Redis master paused stalls the reference broker's CONNECT, a peer down stalls a cluster node) — and
    the final heal (workload_end to heal_all).  A stretch that outlasts the faults covering it by more than
    the grace is unplanned from where the cover ends; one that began under a fault is the node's recovery from
    it for RECOVERY_AFTER_FAULT_S after the cover ends (contracts/invariants.py)."""
    stretches: list[tuple[dict, dict | None]] = []
    open_: dict[str, dict] = {}
    for event in timeline.node_events:
        if event.get("action") == "unresponsive":
            open_.setdefault(event.get("node"), event)
        elif event.get("action") == "responsive" and event.get("node") in open_:
            stretches.append((open_.pop(event.get("node")), event))
    stretches += [(start, None) for start in open_.values()]
    if not stretches:
        return
    covers = _planned_covers(timeline, guarantees)
    for start, end in sorted(stretches, key=lambda pair: pair[0]["seq"]):
        detail = detail_of(start)
        grace_us = int(float(detail.get("grace_s") or 0) * 1_000_000)
        since = int(detail.get("since_us") if detail.get("since_us") is not None else start["t_mono_us"])
        # Never answered again: it failed every probe at least until its "unresponsive" row, and nothing after
        # that says it answered (the probe went on until the run's teardown).
        until = end["t_mono_us"] if end is not None else max(start["t_mono_us"], timeline.t_last)
        if any(lo <= since <= hi for lo, hi in covers):
            # It stopped answering under a planned fault: what follows the cover is its recovery.
            grace_us = max(grace_us, RECOVERY_AFTER_FAULT_S * 1_000_000)
        uncovered = _uncovered_from(since, until, covers, grace_us)
        if uncovered is None:
            continue
        timeline.violations.setdefault("health.unresponsive", []).append({
            "node": start.get("node"), "t": uncovered, "t_from": since, "t_to": None if end is None else until,
            "probe": detail.get("probe"), "error": detail.get("error"), "grace_s": detail.get("grace_s"),
            "log_tail": list(detail.get("log_tail") or [])[-8:]})


def _planned_covers(timeline: Timeline, guarantees: Guarantees) -> list[tuple[int, int]]:
    """The intervals in which a planned fault may keep a node of the target from answering (_unresponsive)."""
    from faults.base import FaultSpecError
    from faults.catalog import is_client_fault

    covers = []
    for fault in timeline.faults:
        try:
            client = is_client_fault(fault.kind)
        except FaultSpecError:  # a kind this checker does not know: it may have stopped anything
            client = False
        if client or not guarantees.of_target(fault.node):
            continue
        end = fault.t_healed if fault.t_healed is not None else fault.t_heal
        covers.append((fault.t_start, NEVER if end is None else max(end, fault.t_start)))
    workload_end, heal_all = timeline.phases.get(Phase.WORKLOAD_END), timeline.phases.get(Phase.HEAL_ALL)
    if timeline.faults and workload_end is not None:
        covers.append((workload_end["t_mono_us"], heal_all["t_mono_us"] if heal_all is not None else NEVER))
    return sorted(covers)


def _uncovered_from(since: int, until: int, covers: list[tuple[int, int]], grace_us: int) -> int | None:
    """The start of the first part of [since, until] that no cover overlaps and that lasts at least the grace,
    or None."""
    t = since
    for lo, hi in covers:
        if hi < t:
            continue
        if lo > t and min(lo, until) - t >= grace_us:
            return t
        if lo >= until:
            break
        t = max(t, hi)
    return t if until - t >= grace_us else None


def unresponsive_note(timeline: Timeline) -> str:
    """'; node X had stopped answering ... outside every planned fault', or ''."""
    found = timeline.violations.get("health.unresponsive", [])
    if not found:
        return ""
    first = found[0]
    again = ("and never answered again" if first["t_to"] is None
             else f"until {(first['t_to'] - timeline.t_first) / 1e6:.3f} s")
    return (f"; node {first['node']} had stopped answering its probe ({first['probe']}: {first['error']}) at "
            f"{(first['t'] - timeline.t_first) / 1e6:.3f} s outside every planned fault, {again}")


def _phases(timeline: Timeline) -> None:
    if "error" in timeline.phases:
        timeline.incomplete.append(f"the run broke: {timeline.phases['error'].get('error')!r}")
    drain_end = timeline.phases.get(Phase.DRAIN_END)
    if drain_end is None:
        timeline.incomplete.append("no drain_end phase row: the run never finished draining")
    elif drain_end.get("reason") == "timeout":
        owed = drain_end.get("outstanding")
        timeline.incomplete.append(
            "the drain timed out" + (f" while {owed} owed message(s) were still missing" if owed else "")
            + f" (after {drain_end.get('elapsed_s', '?')} s, not quiet): they may still have been in flight"
            + unplanned_exit_note(timeline) + unresponsive_note(timeline))
    elif drain_end.get("reason") != "quiet":
        timeline.incomplete.append(f"drain_end reason {drain_end.get('reason')!r}, expected 'quiet'")


def _snapshots(timeline: Timeline, guarantees: Guarantees) -> None:
    if not guarantees.white_box:
        return
    if not timeline.snapshots:
        for invariant in ("whitebox.orphan_payloads", "whitebox.dangling_refs", "whitebox.last_packet_id_behind"):
            timeline.unknown[invariant] = "target.kind is 'reference' but the history has no session_snapshot rows"
        return
    for row in timeline.snapshots:
        base = {"client": row.get("client"), "t": row["t_mono_us"], "node": row.get("node")}
        if (row.get("orphan_payloads") or 0) > 0:
            timeline.violations.setdefault("whitebox.orphan_payloads", []).append(
                {**base, "count": row["orphan_payloads"]})
        if (row.get("dangling_refs") or 0) > 0:
            timeline.violations.setdefault("whitebox.dangling_refs", []).append({**base, "count": row["dangling_refs"]})
        if (row.get("zset_size") or 0) > guarantees.persisted_messages_limit:
            timeline.violations.setdefault("limits.over_limit", []).append(
                {**base, "kept": row["zset_size"], "limit": guarantees.persisted_messages_limit, "source": "white box"})
