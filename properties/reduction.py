"""Plan reduction for ``ordeal shrink``: a plan in, smaller candidate plans out (pure data, no I/O).

Delta-debugging style: for each dimension of a plan — fault slots, clients (each with all its events),
the tail (a shorter workload), subscriber offline periods (a disconnect with its reconnect), publishes —
the items are split into n chunks (n = 2, 4, 8, ... up to one item per chunk) and each candidate drops one
chunk.  Coarse chunks come first, so a run that fails without half of the publishes saves many attempts.
``ordeal/shrink.py`` runs the candidates against a real topology and keeps the first that still fails.

Every candidate is a valid plan (``validate_plan``):
- a publisher's sequence numbers are **renumbered** 1..n in offset order after publishes are dropped.  The
  plan contract (properties/plan.py) says "per publisher, from 1, in offset order", and the checkers'
  loss-gap explanation reads runs of consecutive pub_seq; a gap in a shrunk plan would look like a
  publish the plan never made.  The payload identity (publisher index, seq) stays self-consistent because
  it is derived from the plan at run time;
- a subscriber keeps its offset-0 connect; offline periods are dropped as a unit (the disconnect and the
  reconnect that ends it), so its actions still alternate connect / disconnect;
- a shorter workload drops every event at or after the new duration and ends the fault slots there;
- publisher indices (payload identity) and broker node indices are kept as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from contracts.topics import filter_matches
from properties.plan import CONNECT, DISCONNECT, PUBLISHER, SUBSCRIBER, Plan, PublishPlan, SubscriberAction

DIMENSIONS = ("faults", "clients", "tail", "offline", "publishes")
MIN_DURATION_S = 0.5  # a workload shorter than this is not worth a run (connect time dominates)


@dataclass(frozen=True, order=True)
class PlanSize:
    """How big a plan is; compared in this field order (fewer faults first, then clients, ...)."""

    faults: int
    clients: int
    publishes: int
    subscriber_actions: int
    duration_s: float

    def __str__(self) -> str:
        return (f"{self.faults} faults, {self.clients} clients, {self.publishes} publishes, "
                f"{self.subscriber_actions} subscriber actions, {self.duration_s:g} s")


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    dimension: str  # one of DIMENSIONS
    chunks: int  # the granularity n it came from (the driver resumes there after a success)
    description: str


def plan_size(plan: Plan) -> PlanSize:
    return PlanSize(len(plan.faults), len(plan.clients), len(plan.publishes), len(plan.subscriber_actions),
                    plan.duration_s)


# -- the reductions (each returns a valid plan) -----------------------------------------------------------
def renumbered(publishes: Sequence[PublishPlan]) -> tuple[PublishPlan, ...]:
    """Per publisher, seq = 1..n in offset order (the plan contract)."""
    ordered = sorted(publishes, key=lambda p: (p.offset_s, p.publisher, p.seq))
    counters: dict[str, int] = {}
    out = []
    for publish in ordered:
        counters[publish.publisher] = counters.get(publish.publisher, 0) + 1
        out.append(replace(publish, seq=counters[publish.publisher]))
    return tuple(out)


def without_clients(plan: Plan, client_ids: set[str]) -> Plan:
    return replace(
        plan,
        clients=tuple(c for c in plan.clients if c.client_id not in client_ids),
        publishes=tuple(p for p in plan.publishes if p.publisher not in client_ids),
        subscriber_actions=tuple(a for a in plan.subscriber_actions if a.client_id not in client_ids))


def without_publishes(plan: Plan, indices: set[int]) -> Plan:
    return replace(plan, publishes=renumbered([p for i, p in enumerate(plan.publishes) if i not in indices]))


def without_faults(plan: Plan, indices: set[int]) -> Plan:
    return replace(plan, faults=tuple(f for i, f in enumerate(plan.faults) if i not in indices))


def offline_periods(plan: Plan) -> list[tuple[int, ...]]:
    """Indices (into plan.subscriber_actions) of each offline period: a disconnect and the connect that
    follows it for the same subscriber (or the disconnect alone when the run ends offline)."""
    periods: list[tuple[int, ...]] = []
    open_disconnect: dict[str, int] = {}
    for index, action in enumerate(plan.subscriber_actions):
        if action.action == DISCONNECT:
            open_disconnect[action.client_id] = index
        elif action.action == CONNECT and action.client_id in open_disconnect:
            periods.append((open_disconnect.pop(action.client_id), index))
    periods.extend((index,) for index in open_disconnect.values())
    return sorted(periods)


def without_offline_periods(plan: Plan, periods: Sequence[tuple[int, ...]]) -> Plan:
    dropped = {index for period in periods for index in period}
    return replace(plan, subscriber_actions=tuple(
        a for i, a in enumerate(plan.subscriber_actions) if i not in dropped))


def cut_tail(plan: Plan, duration_s: float) -> Plan:
    """The plan's first duration_s seconds: later events dropped, fault slots ended at the new end; a
    subscriber left offline by the cut is reconnected by the run's final phase as usual."""
    duration_s = round(duration_s, 6)
    kept_actions = [a for a in plan.subscriber_actions if a.offset_s < duration_s or a.offset_s == 0.0]
    return replace(
        plan, duration_s=duration_s,
        publishes=renumbered([p for p in plan.publishes if p.offset_s < duration_s]),
        subscriber_actions=tuple(kept_actions),
        faults=tuple(replace(f, end_s=min(f.end_s, duration_s)) for f in plan.faults if f.start_s < duration_s))


# -- candidates --------------------------------------------------------------------------------------------
def chunked(count: int, chunks: int) -> list[range]:
    """count items in `chunks` contiguous, nearly equal chunks (fewer when count < chunks)."""
    chunks = max(1, min(chunks, count))
    size = math.ceil(count / chunks)
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _granularities(count: int, start: int) -> Iterator[int]:
    """n = start, 2*start, ... until one item per chunk (ddmin's refinement)."""
    n = max(2, start)
    while True:
        yield min(n, count)
        if n >= count:
            return
        n *= 2


def candidates(plan: Plan, start_chunks: dict[str, int] | None = None) -> Iterator[Candidate]:
    """Smaller variants of plan, coarse before fine, dimension by dimension (DIMENSIONS order: faults
    first, since they make runs least repeatable; publishes last, since there are most of them).
    start_chunks: per dimension, the granularity to start at (where the last success happened)."""
    start = start_chunks or {}
    yield from _drop_items("faults", len(plan.faults), start.get("faults", 2),
                           lambda drop: without_faults(plan, drop), "fault slot")
    groups = client_groups(plan)
    if len(groups) > 1:  # whole groups first (a publisher with its subscribers), keeping at least one
        yield from _drop_items(
            "clients", len(groups), start.get("clients", 2),
            lambda drop: without_clients(plan, {c for i in drop for c in groups[i]}), "client group",
            names=lambda drop: " + ".join(", ".join(groups[i]) for i in sorted(drop)), keep_one=True)
    yield from _single_clients(plan)
    yield from _tail_candidates(plan)
    periods = offline_periods(plan)
    yield from _drop_items("offline", len(periods), start.get("offline", 2),
                           lambda drop: without_offline_periods(plan, [periods[i] for i in drop]),
                           "offline period")
    yield from _drop_items("publishes", len(plan.publishes), start.get("publishes", 2),
                           lambda drop: without_publishes(plan, drop), "publish", keep_one=True)


def client_groups(plan: Plan) -> list[tuple[str, ...]]:
    """Clients that only matter together: each publisher with the subscribers whose filters match its
    topics (a subscriber matching several publishers joins the first); subscribers matching no publisher
    form groups of their own."""
    topics: dict[str, set[str]] = {}
    for p in plan.publishes:
        topics.setdefault(p.publisher, set()).add(p.topic)
    placed: set[str] = set()
    groups: list[tuple[str, ...]] = []
    subscribers = [c for c in plan.clients if c.role == SUBSCRIBER]
    for publisher in (c for c in plan.clients if c.role == PUBLISHER):
        members = [publisher.client_id]
        for sub in subscribers:
            if sub.client_id not in placed and any(
                    filter_matches(s.topic_filter, t) for s in sub.subscriptions for t in topics.get(
                        publisher.client_id, ())):
                members.append(sub.client_id)
                placed.add(sub.client_id)
        groups.append(tuple(members))
    groups += [(s.client_id,) for s in subscribers if s.client_id not in placed]
    return groups


def _single_clients(plan: Plan) -> Iterator[Candidate]:
    """One client at a time, keeping at least one publisher and one subscriber (without both a plan has
    no deliveries, and every invariant but the meta ones is about deliveries)."""
    roles = [c.role for c in plan.clients]
    for client in plan.clients:
        if roles.count(client.role) > 1:
            yield Candidate(without_clients(plan, {client.client_id}), "clients", len(plan.clients),
                            f"drop client {client.client_id}")


def _drop_items(dimension: str, count: int, start: int, make, noun: str, names=None,
                keep_one: bool = False) -> Iterator[Candidate]:
    if count == 0:
        return
    if not keep_one:  # everything at once first: the cheapest win (a fault-free failure, say)
        yield Candidate(make(set(range(count))), dimension, 1, f"drop all {count} {noun}(s)")
    for n in _granularities(count, start):
        if n < 2 and keep_one:
            continue
        for chunk in chunked(count, n):
            drop = set(chunk)
            if keep_one and len(drop) >= count:
                continue
            if not keep_one and len(drop) == count:
                continue  # already tried above
            what = names(drop) if names else (f"{noun} {chunk.start + 1}" if len(chunk) == 1 else
                                              f"{noun}s {chunk.start + 1}-{chunk.stop}")
            yield Candidate(make(drop), dimension, n, f"drop {what} (1/{n} of {count})")


def _tail_candidates(plan: Plan) -> Iterator[Candidate]:
    """Keep the first half, then three quarters, of the workload (the tail is rarely where a failure is
    caused: most failures are caused early and only observed at the drain)."""
    for fraction in (0.5, 0.75):
        duration = math.floor(plan.duration_s * fraction * 10) / 10
        if MIN_DURATION_S <= duration < plan.duration_s:
            yield Candidate(cut_tail(plan, duration), "tail", 1,
                            f"cut the tail: {plan.duration_s:g} s -> {duration:g} s")


# -- validity ------------------------------------------------------------------------------------------------
def validate_plan(plan: Plan) -> list[str]:
    """Problems that would make the plan unplayable or its history misleading ([] = valid)."""
    problems: list[str] = []
    ids = [c.client_id for c in plan.clients]
    if len(set(ids)) != len(ids):
        problems.append("duplicate client ids")
    publishers = {c.client_id for c in plan.clients if c.role == PUBLISHER}
    subscribers = {c.client_id for c in plan.clients if c.role == SUBSCRIBER}
    seqs: dict[str, list[int]] = {}
    last_offset: dict[str, float] = {}
    for p in plan.publishes:
        if p.publisher not in publishers:
            problems.append(f"publish by unknown publisher {p.publisher}")
        if not 0 <= p.offset_s <= plan.duration_s:
            problems.append(f"publish {p.publisher}#{p.seq} at {p.offset_s} s outside 0..{plan.duration_s} s")
        if p.offset_s < last_offset.get(p.publisher, -1.0):
            problems.append(f"publishes of {p.publisher} not in offset order")
        last_offset[p.publisher] = p.offset_s
        seqs.setdefault(p.publisher, []).append(p.seq)
    for publisher, numbers in seqs.items():
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"{publisher}: sequence numbers {numbers[:5]}... are not 1..{len(numbers)}")
    state: dict[str, str] = {}
    for a in plan.subscriber_actions:
        problems += _action_problems(a, subscribers, state, plan.duration_s)
    problems += [f"{s}: no connect at offset 0" for s in sorted(subscribers - set(state))]
    for f in plan.faults:
        if not 0 <= f.start_s <= f.end_s <= plan.duration_s:
            problems.append(f"fault {f.fault_id}: {f.start_s}..{f.end_s} s outside 0..{plan.duration_s} s")
    return problems


def _action_problems(action: SubscriberAction, subscribers: set[str], state: dict[str, str],
                     duration_s: float) -> list[str]:
    if action.client_id not in subscribers:
        return [f"subscriber action for unknown subscriber {action.client_id}"]
    previous = state.get(action.client_id)
    state[action.client_id] = action.action
    if previous is None and not (action.action == CONNECT and action.offset_s == 0.0):
        return [f"{action.client_id}: first action is {action.action} at {action.offset_s} s, not a connect at 0"]
    if previous == action.action:
        return [f"{action.client_id}: two {action.action}s in a row at {action.offset_s} s"]
    if not 0 <= action.offset_s <= duration_s:
        return [f"{action.client_id}: action at {action.offset_s} s outside the workload"]
    return []
