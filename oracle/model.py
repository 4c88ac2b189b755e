"""The whole of one run as the rules read it (``Model``): lives, subscriptions, publishes, deliveries,
received messages, claims and losses, faults and phases — each built once from the rows, in plain Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.history_schema import Kind, Phase
from oracle.messages import Delivery, Publish, Received, deliveries, is_will_flow, publishes, received
from oracle.owed import Claim, claims, losses
from oracle.run import NEVER, Declared, Run, detail
from oracle.sessions import Life, Subscription, walk

LIFE_KINDS = (Kind.CONNECT, Kind.DISCONNECT, Kind.SUBSCRIBE_ACK, Kind.UNSUBSCRIBE_ACK)
FAULT_KINDS = (Kind.FAULT_START, Kind.FAULT_HEAL, Kind.FAULT_EVIDENCE, Kind.FAULT_ERROR)


@dataclass(frozen=True)
class Fault:
    fault_id: str
    kind: str
    node: str | None
    t_start: int
    t_heal: int | None
    bit: bool | None  # every evidence row says it bit (True), one says not (False), no evidence (None)
    errors: int  # fault_error rows: it could not be applied (or healed)


@dataclass
class Model:
    run: Run
    declared: Declared
    lives: dict[str, Life] = field(default_factory=dict)
    subscriptions: list[Subscription] = field(default_factory=list)
    messages: dict[tuple[str, int], Publish] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    got: dict[tuple, Received] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    lost: list[Claim] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    node_events: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # the first row of each phase
    snapshots: list[dict[str, Any]] = field(default_factory=list)

    def rows(self, *kinds: str) -> list[dict[str, Any]]:
        return [r for r in self.run.rows if r["kind"] in kinds]

    def disturbances(self) -> list[tuple[int, int]]:
        """Every fault as (start, heal or NEVER) and every node event as (t, t)."""
        spans = [(f.t_start, f.t_heal if f.t_heal is not None else NEVER) for f in self.faults]
        return spans + [(e["t_mono_us"], e["t_mono_us"]) for e in self.node_events]

    def unpromised_starts(self) -> list[int]:
        """When each fault began that the target's declared persistence does not cover, on the target."""
        return [f.t_start for f in self.faults if self.declared.not_promised(f.kind) and self.declared.hits_target(f.node)]

    def mqtt5(self) -> bool:
        return any(r.get("protocol") == 5 for life in self.lives.values() for r in self.connect_rows(life.client))

    def connect_rows(self, client: str) -> list[dict[str, Any]]:
        return [r for r in self.run.rows if r["kind"] == Kind.CONNECT and r.get("client") == client]


def build(run: Run) -> Model:
    m = Model(run, run.declared)
    by_client: dict[str, list[dict[str, Any]]] = {}
    for row in run.rows:
        if row["kind"] in LIFE_KINDS and row.get("client"):
            by_client.setdefault(row["client"], []).append(row)
        elif row["kind"] == Kind.NODE_EVENT:
            m.node_events.append(row)
        elif row["kind"] == Kind.PHASE:
            m.phases.setdefault(str(detail(row).get("phase")), row)
        elif row["kind"] == Kind.SESSION_SNAPSHOT:
            m.snapshots.append(row)
    for client, rows in by_client.items():
        m.lives[client] = walk(client, rows, m.subscriptions)
    m.faults = _faults(run.rows)
    # a Will carries no payload identity and is no published message: its flow is left to the Will rules, which
    # the oracle does not judge (judge.py)
    traffic = tuple(row for row in run.rows if not is_will_flow(row))
    m.messages = publishes(traffic)
    m.deliveries = deliveries(traffic, m.lives)
    m.got = received(m.deliveries)
    m.claims = claims(m.messages, m.subscriptions, m.got, m.lives, m.declared)
    m.lost = losses(m.claims, m.lives, m.declared, m.unpromised_starts())
    return m


def _faults(rows: tuple[dict[str, Any], ...]) -> list[Fault]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] in FAULT_KINDS:
            groups.setdefault(row.get("fault_id") or f"<no fault_id at seq {row['seq']}>", []).append(row)
    out = []
    for fault_id, group in groups.items():
        start = next((r for r in group if r["kind"] == Kind.FAULT_START), group[0])
        heal = next((r for r in group if r["kind"] == Kind.FAULT_HEAL), None)
        evidence = [r.get("bit") for r in group if r["kind"] == Kind.FAULT_EVIDENCE]
        node = (start.get("node") or next((r.get("node") for r in group if r.get("node")), None)
                or detail(start).get("node") or detail(start).get("target"))
        out.append(Fault(fault_id, start.get("fault_kind") or "?", node, start["t_mono_us"],
                         heal["t_mono_us"] if heal else None,
                         (all(b is True for b in evidence)) if evidence else None,
                         sum(1 for r in group if r["kind"] == Kind.FAULT_ERROR)))
    return out


def phase_problems(m: Model) -> list[str]:
    """Why the phases say the history is not whole (docs/invariants.md, "How an incomplete ... is decided")."""
    problems = []
    if "error" in m.phases:
        problems.append("the run broke (an error phase)")
    end = m.phases.get(Phase.DRAIN_END)
    if end is None:
        problems.append("no drain_end phase")
    elif detail(end).get("reason") != "quiet":
        problems.append(f"drain_end reason {detail(end).get('reason')!r}")
    return problems
