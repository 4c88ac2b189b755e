"""Scenario + seed → Plan.

The generator is written once, against a tiny ``Draw`` interface (integer / uniform / chance / weighted),
and driven two ways:
- ``make_plan(scenario, seed)``: a ``random.Random(seed)`` behind the interface.  Python's Mersenne
  Twister and the arithmetic below are fully specified, so the same scenario and seed give a
  byte-identical plan.json on any machine and Python version >= 3.2 — no dependence on Hypothesis
  internals (whose first example for any seed is the all-minimal one, and whose engine may change).
- ``plans(scenario)``: a Hypothesis strategy whose draws feed the very same generator, so Hypothesis can
  generate and *shrink* plans as pure data (fewer disconnects, earlier/shorter offline periods, simpler
  QoS/expiry choices, fewer and shorter faults).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from contracts.history_schema import RETAINED_FILTER, WILL_FILTER, WILL_WATCHER, retained_topic, will_topic
from contracts.scenario import Scenario, fill_placeholders, full_fault_params, uses_placeholder
from properties.plan import (
    CONNECT,
    DISCONNECT,
    PUBLISHER,
    SUBSCRIBER,
    ClientPlan,
    FaultSlot,
    Plan,
    PublishPlan,
    SubscriberAction,
    Subscription,
    WillPlan,
)

T = TypeVar("T")
OFFSET_DECIMALS = 6  # offsets are rounded to µs so the JSON never carries float noise


class Draw(Protocol):
    def integer(self, low: int, high: int) -> int: ...  # inclusive
    def uniform(self, low: float, high: float) -> float: ...
    def chance(self, probability: float) -> bool: ...
    def weighted(self, options: Sequence[tuple[T, float]]) -> T: ...


def _pick(options: Sequence[tuple[T, float]], position: float) -> T:
    """The option whose cumulative-weight interval contains position (0 <= position < total)."""
    live = [(value, weight) for value, weight in options if weight > 0]
    for value, weight in live:
        if position < weight:
            return value
        position -= weight
    return live[-1][0]


class RandomDraw:
    """Deterministic draws from a seeded random.Random."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self.random.randint(low, high)

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random.random()

    def chance(self, probability: float) -> bool:
        if probability <= 0:
            return False
        if probability >= 1:
            return True
        return self.random.random() < probability

    def weighted(self, options: Sequence[tuple[T, float]]) -> T:
        live = [o for o in options if o[1] > 0]
        if len(live) == 1:  # no draw at all when there is no choice: keeps plans stable under edits
            return live[0][0]
        return _pick(live, self.random.random() * sum(w for _, w in live))


class HypothesisDraw:
    """Draws through a Hypothesis ``draw`` so the engine can shrink them (smaller = simpler)."""

    RESOLUTION = 1_000_000

    def __init__(self, draw: Callable):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def integer(self, low: int, high: int) -> int:
        return self.draw(self.st.integers(low, high))

    def _unit(self) -> float:
        return self.draw(self.st.integers(0, self.RESOLUTION - 1)) / self.RESOLUTION

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self._unit()

    def chance(self, probability: float) -> bool:
        if probability <= 0:
            return False
        if probability >= 1:
            return True
        return self._unit() >= 1 - probability  # shrinks towards False: fewer events

    def weighted(self, options: Sequence[tuple[T, float]]) -> T:
        live = [o for o in options if o[1] > 0]
        if len(live) == 1:
            return live[0][0]
        return _pick(live, self._unit() * sum(w for _, w in live))  # shrinks towards the first option


def plan_notes(scenario: Scenario, plan: Plan) -> list[str]:
    """What a reader of the plan must know: a fault mix that produced no fault (the schedule did not fit); a
    per-client credentials pattern that fits no client of the plan (a typo, or a plan made smaller)."""
    notes = []
    if scenario.faults.mix and not plan.faults:
        spec = scenario.faults
        notes.append(f"the fault mix ({', '.join(kind for kind, _ in spec.mix)}) produced no fault with seed "
                     f"{plan.seed}: {scenario.scenario.duration_s:g} s of workload minus tail_s {spec.tail_s:g} s "
                     f"leaves no room for quiet_s {list(spec.quiet_s)} + duration_s {list(spec.duration_s)}, or no "
                     "subscriber fitted; this run tests nothing under faults")
    for pattern in scenario.target.credentials.unmatched([c.client_id for c in plan.clients]):
        notes.append(f"[[target.credentials.clients]] match = {pattern!r} fits no client of the plan (client ids: "
                     f"{', '.join(sorted(c.client_id for c in plan.clients)[:4])}, ...); it is not used")
    return notes


@dataclass(frozen=True)
class WillSpec:
    """[workload] wills (a share of the subscribers whose every CONNECT carries a Will) and will_delay_mix (the
    MQTT 5 Will Delay Interval, seconds -> weight; None: none sent).  Off (0) by default: nothing is drawn."""

    share: float = 0.0
    delay_mix: tuple[tuple[int | None, float], ...] = ((None, 1.0),)

    @classmethod
    def of(cls, scenario: Scenario) -> WillSpec:
        # The keys live in [workload] (contracts/scenario.py WorkloadSpec.wills / will_delay_mix).
        workload = scenario.workload
        return cls(float(getattr(workload, "wills", 0.0)),
                   tuple(getattr(workload, "will_delay_mix", cls.delay_mix)))


@dataclass(frozen=True)
class RetainedSpec:
    """[workload] retained (a share of the publishes sent with RETAIN 1, each on one of ``topics`` retained topics
    instead of its own), retained_topics and late_subscribers (clean-session subscribers of every retained topic,
    each connecting once, late in the workload, after retained publishes).  Off (0) by default."""

    share: float = 0.0
    topics: int = 2
    late_subscribers: int = 2

    @classmethod
    def of(cls, scenario: Scenario) -> RetainedSpec:
        # The keys live in [workload] (contracts/scenario.py WorkloadSpec.retained / retained_topics /
        # late_subscribers).
        workload = scenario.workload
        return cls(float(getattr(workload, "retained", 0.0)), int(getattr(workload, "retained_topics", cls.topics)),
                   int(getattr(workload, "late_subscribers", cls.late_subscribers)))


def make_plan(scenario: Scenario, seed: int) -> Plan:
    """The plan for this scenario and seed (deterministic)."""
    return generate_plan(scenario, seed, RandomDraw(seed))


def plans(scenario: Scenario, seed: int = 0):
    """A Hypothesis strategy of plans for this scenario (the seed is only recorded in the plan)."""
    from hypothesis import strategies as st

    @st.composite
    def _plans(draw):
        return generate_plan(scenario, seed, HypothesisDraw(draw))

    return _plans()


def _round(value: float) -> float:
    return round(value, OFFSET_DECIMALS)


def generate_plan(scenario: Scenario, seed: int, draw: Draw, wills: WillSpec | None = None,
                  retained: RetainedSpec | None = None) -> Plan:
    """``wills``, ``retained``: the Will and retained workloads (default: the scenario's [workload] keys)."""
    workload = scenario.workload
    wills = WillSpec.of(scenario) if wills is None else wills
    retained = RetainedSpec.of(scenario) if retained is None else retained
    node_names = scenario.broker_nodes()
    nodes = len(node_names)
    duration = scenario.scenario.duration_s
    clients: list[ClientPlan] = []
    publisher_topics: list[tuple[str, str]] = []  # (client id, topic)

    # Clients.  The seeds' P2P pattern: publisher i -> europe/ua/kyiv/i/0, persistent subscriber i on
    # europe/ua/kyiv/i/+.  Fan-in: every publisher j -> europe/ua/kyiv/fanin/j, every subscriber on
    # europe/ua/kyiv/fanin/+.
    publisher_ids, subscriber_ids = workload.client_ids()
    if workload.pattern == "p2p":
        topics = [f"europe/ua/kyiv/{i}/0" for i in range(workload.pairs)]
        subscriber_filters = [(client_id, f"europe/ua/kyiv/{i}/+") for i, client_id in enumerate(subscriber_ids)]
    else:
        topics = [f"europe/ua/kyiv/fanin/{j}" for j in range(workload.publishers)]
        subscriber_filters = [(client_id, "europe/ua/kyiv/fanin/+") for client_id in subscriber_ids]
    fixed = {client_id: node_names.index(node) for client_id, node in workload.home_nodes}

    def home(client_id: str, index: int) -> int:
        """The client's first node: fixed per client, else round-robin or seeded ([workload] home_node)."""
        if client_id in fixed:
            return fixed[client_id]
        if workload.home_node == "seeded" and nodes > 1:
            return draw.integer(0, nodes - 1)
        return index % nodes

    for index, (client_id, topic) in enumerate(zip(publisher_ids, topics, strict=True)):
        clients.append(ClientPlan(
            client_id=client_id, role=PUBLISHER, protocol=draw.weighted(workload.protocol_mix),
            node=home(client_id, index), publisher_index=index))
        publisher_topics.append((client_id, topic))
    subscriber_plans: list[ClientPlan] = []
    for index, (client_id, topic_filter) in enumerate(subscriber_filters):
        protocol = draw.weighted(workload.protocol_mix)
        v5 = protocol == 5  # the MQTT 5 options ([workload]) only on MQTT 5 connections
        subscription = Subscription(topic_filter, workload.subscription_qos,
                                    sub_id=index + 1 if v5 and workload.subscription_identifiers else None,
                                    retain_as_published=v5 and workload.retain_as_published)
        subscriber_plans.append(ClientPlan(
            client_id=client_id, role=SUBSCRIBER, protocol=protocol, node=home(client_id, index),
            subscriptions=(subscription,), persistent=True,
            session_expiry_s=scenario.subscribers.session_expiry_s if v5 else None,
            preset_last_packet_id=workload.preset_last_packet_id,
            receive_maximum=workload.receive_maximum if v5 else None,
            maximum_packet_size=workload.maximum_packet_size if v5 else None))
    # Fan-in subscribers beside the pairs, then shared groups' members: persistent subscribers of a wide or a
    # $share filter, flapping like the others (drawn after them: a plan without them is the one it always was).
    for index, (client_id, topic_filter) in enumerate(workload.fan_in_subscribers_of() + workload.shared_members_of()):
        protocol = draw.weighted(workload.protocol_mix)
        v5 = protocol == 5
        subscriber_plans.append(ClientPlan(
            client_id=client_id, role=SUBSCRIBER, protocol=protocol, node=home(client_id, index),
            subscriptions=(Subscription(topic_filter, workload.subscription_qos),), persistent=True,
            session_expiry_s=scenario.subscribers.session_expiry_s if v5 else None,
            receive_maximum=workload.receive_maximum if v5 else None,
            maximum_packet_size=workload.maximum_packet_size if v5 else None))
    clients.extend(subscriber_plans)
    protocols = {c.client_id: c.protocol for c in clients}

    # Publishes: a steady rate per publisher with a random phase, so publishers do not fire in lockstep.
    publishes: list[PublishPlan] = []
    interval = 1.0 / workload.rate_per_publisher
    for client_id, topic in publisher_topics:
        phase = draw.uniform(0.0, interval)
        count = max(0, math.ceil((duration - phase) / interval))
        for n in range(count):
            expiry = draw.weighted(workload.expiry_mix) if protocols[client_id] == 5 else None
            publishes.append(PublishPlan(
                offset_s=_round(phase + n * interval), publisher=client_id, seq=n + 1, topic=topic,
                qos=draw.weighted(workload.qos_mix), size=workload.payload_size, expiry_s=expiry,
                properties=workload.mqtt5_properties and protocols[client_id] == 5))
    publishes.sort(key=lambda p: (p.offset_s, p.publisher, p.seq))

    actions = _subscriber_actions(scenario, subscriber_plans, nodes, draw)
    faults = _faults(scenario, subscriber_plans, actions, draw)
    # Drawn last: a scenario without publisher reconnects draws nothing here, so its plans stay as they were.
    actions = actions + _publisher_actions(scenario, clients[:len(publisher_topics)], nodes, draw)
    if wills.share > 0:  # drawn after everything else: a plan without wills is the one it always was
        clients, will_actions = _wills(wills, clients, nodes, draw)
        actions += will_actions
    if retained.share > 0:  # likewise
        publishes, late_clients, late_actions = _retained(retained, scenario, publishes, nodes, draw)
        clients = [*clients, *late_clients]
        actions += late_actions
    actions = sorted(actions, key=lambda a: (a.offset_s, a.client_id))
    return Plan(scenario=scenario.name, seed=seed, duration_s=duration, clients=tuple(clients),
                publishes=tuple(publishes), subscriber_actions=tuple(actions), faults=tuple(faults))


def _wills(spec: WillSpec, clients: list[ClientPlan], nodes: int,
           draw: Draw) -> tuple[list[ClientPlan], list[SubscriberAction]]:
    """A share of the subscribers connect with a Will (QoS 1 on their own will topic; on MQTT 5 a Will Delay drawn
    from the mix), and one watcher, a persistent subscriber of every will topic that never flaps, records what
    arrives.  The subscribers' planned flaps decide: an abrupt drop owes the Will, a clean DISCONNECT forbids it."""
    out: list[ClientPlan] = []
    for client in clients:
        if client.role == SUBSCRIBER and draw.chance(spec.share):
            delay = draw.weighted(spec.delay_mix) if client.protocol == 5 else None
            client = replace(client, will=WillPlan(topic=will_topic(client.client_id), qos=1, delay_s=delay))
        out.append(client)
    if not any(c.will is not None for c in out):
        return out, []
    # MQTT 5 when the workload speaks it (a 3.1.1-only target refuses an MQTT 5 CONNECT)
    protocol = 5 if any(c.protocol == 5 for c in out) else 4
    expiry = 3600 if protocol == 5 else None
    watcher = ClientPlan(client_id=WILL_WATCHER, role=SUBSCRIBER, protocol=protocol, node=draw.integer(0, nodes - 1),
                         subscriptions=(Subscription(WILL_FILTER, 1),), persistent=True, session_expiry_s=expiry)
    return [*out, watcher], [SubscriberAction(offset_s=0.0, client_id=WILL_WATCHER, action=CONNECT,
                                              session_expiry_s=expiry, node=watcher.node)]


# The late subscribers connect in this part of the workload: after retained publishes (and, in a scenario with
# faults, often after one), and long enough before its end to receive what is retained.
LATE_FROM, LATE_TO_S = 0.3, 1.0


def _retained(spec: RetainedSpec, scenario: Scenario, publishes: list[PublishPlan], nodes: int,
              draw: Draw) -> tuple[list[PublishPlan], list[ClientPlan], list[SubscriberAction]]:
    """A share of the publishes go with RETAIN 1 to one of the retained topics (instead of their own), and the
    late subscribers (clean sessions of the retained filter) each connect once, late in the workload."""
    out = [replace(p, topic=retained_topic(draw.integer(0, spec.topics - 1)), retain=True)
           if draw.chance(spec.share) else p for p in publishes]
    duration = scenario.scenario.duration_s
    clients, actions = [], []
    for k in range(spec.late_subscribers):
        protocol = draw.weighted(scenario.workload.protocol_mix)
        client = ClientPlan(client_id=f"test_late_sub_client_{k}_0", role=SUBSCRIBER, protocol=protocol,
                            node=draw.integer(0, nodes - 1), subscriptions=(Subscription(RETAINED_FILTER, 1),))
        clients.append(client)
        offset = draw.uniform(duration * LATE_FROM, max(duration * LATE_FROM, duration - LATE_TO_S))
        actions.append(SubscriberAction(offset_s=_round(offset), client_id=client.client_id, action=CONNECT,
                                        clean_start=True, node=client.node))
    return out, clients, actions


def _publisher_actions(scenario: Scenario, publishers: list[ClientPlan], nodes: int,
                       draw: Draw) -> list[SubscriberAction]:
    """Publishers reconnecting mid-stream: drops as a Poisson process of the scenario's rate, each followed by
    an offline time and a clean-start reconnect (a publisher keeps no session; its packet ids restart on the
    new connection, which a broker keeping the old connection's QoS 2 state would mistake for duplicates).
    They share the plan's action list (``subscriber_actions``: every client's connects and disconnects)."""
    workload = scenario.workload
    rate_per_s = workload.publisher_disconnects_per_minute / 60.0
    duration = scenario.scenario.duration_s
    actions: list[SubscriberAction] = []
    for client in publishers if rate_per_s > 0 else ():
        node, now = client.node, 0.0
        while True:
            now += -math.log(draw.uniform(1e-6, 1.0)) / rate_per_s  # as for subscribers: shrinks to fewer
            if now >= duration:
                break
            actions.append(SubscriberAction(offset_s=_round(now), client_id=client.client_id, action=DISCONNECT,
                                            abrupt=draw.chance(workload.publisher_abrupt_fraction)))
            now += draw.uniform(*workload.publisher_offline_s)
            if now >= duration:
                # the publisher stays away to the end; settle() finds it disconnected
                break
            node = _reconnect_node(scenario.subscribers.reconnect_node, node, nodes, draw)
            actions.append(SubscriberAction(offset_s=_round(now), client_id=client.client_id, action=CONNECT,
                                            clean_start=True, node=node))
            now += 0.1
    return actions


def _subscriber_actions(scenario: Scenario, subscribers: list[ClientPlan], nodes: int,
                        draw: Draw) -> list[SubscriberAction]:
    """Connect at 0 (never clean start: a preset session must survive), then disconnects as a Poisson
    process of the scenario's rate, each followed by an offline time and a reconnect."""
    behaviour = scenario.subscribers
    duration = scenario.scenario.duration_s
    rate_per_s = behaviour.disconnects_per_minute / 60.0
    actions: list[SubscriberAction] = []
    for client in subscribers:
        node = client.node
        actions.append(SubscriberAction(offset_s=0.0, client_id=client.client_id, action=CONNECT,
                                        clean_start=False, session_expiry_s=client.session_expiry_s, node=node))
        now = 0.0
        while rate_per_s > 0:
            # Exponential inter-arrival time -ln(u) / rate; u's simplest value (its low end) gives the
            # longest gap, so a shrinking Hypothesis removes disconnects instead of adding them.
            now += -math.log(draw.uniform(1e-6, 1.0)) / rate_per_s
            if now >= duration:
                break
            abrupt = draw.chance(behaviour.abrupt_fraction)
            actions.append(SubscriberAction(offset_s=_round(now), client_id=client.client_id, action=DISCONNECT,
                                            abrupt=abrupt,
                                            withhold_acks_s=behaviour.withhold_acks_s if abrupt else 0.0))
            now += draw.uniform(*behaviour.offline_s)
            if now >= duration:
                break  # the final phase reconnects every persistent subscriber
            node = _reconnect_node(behaviour.reconnect_node, node, nodes, draw)
            clean_start = draw.chance(behaviour.clean_start_fraction)
            expiry = client.session_expiry_s
            if client.protocol == 5 and behaviour.session_expiry_mix:
                # per connect: one client id goes persistent -> clean / short-lived -> persistent
                expiry = draw.weighted(behaviour.session_expiry_mix)
            actions.append(SubscriberAction(
                offset_s=_round(now), client_id=client.client_id, action=CONNECT,
                clean_start=clean_start, session_expiry_s=expiry, node=node))
            now += 0.1  # at least a moment connected before the next disconnect
    actions.sort(key=lambda a: (a.offset_s, a.client_id))
    return actions


def _reconnect_node(policy: str, current: int, nodes: int, draw: Draw) -> int:
    if nodes == 1 or policy == "same":
        return current
    if policy == "other":
        return (current + draw.integer(1, nodes - 1)) % nodes
    return draw.integer(0, nodes - 1)


# A subscriber named by a fault ({subscriber}) must be connected, by the plan, from this long before the
# fault starts until this long after it ends: a client fault on an already-offline client cannot bite,
# and "the broker node holding this subscriber" needs it connected.
STEADY_MARGIN_S = 1.0


def _faults(scenario: Scenario, subscribers: list[ClientPlan], actions: list[SubscriberAction],
            draw: Draw) -> list[FaultSlot]:
    """The fault schedule: quiet, fault, quiet, fault, ... on one lane, so no two faults ever overlap (in
    particular never two on the same node), each fault's kind weighted by the mix, and every fault over
    before the workload's last ``tail_s`` seconds so the final phase starts from a healed system."""
    spec = scenario.faults
    if not spec.mix:
        return []
    last_end = scenario.scenario.duration_s - spec.tail_s
    online = _online_intervals(actions, scenario.scenario.duration_s)
    subscriber_ids = [c.client_id for c in subscribers]
    slots: list[FaultSlot] = []
    now = 0.0
    while spec.max_faults == 0 or len(slots) < spec.max_faults:
        # Why high-minus: Hypothesis shrinks a draw towards its low end, and a longer quiet period and a
        # shorter fault make a simpler schedule (fewer, shorter faults).
        now += spec.quiet_s[1] - draw.uniform(0.0, spec.quiet_s[1] - spec.quiet_s[0])
        length = draw.uniform(*spec.duration_s)
        start, end = _round(now), _round(now + length)
        if end > last_end:
            break
        kind = draw.weighted(spec.mix)
        slot = _fault_slot(scenario, kind, f"f{len(slots) + 1:02d}-{kind}", start, end, subscriber_ids,
                           online, draw)
        if slot is not None:  # None: no subscriber fits this window; it stays quiet
            slots.append(slot)
        now = end
    return slots


def _fault_slot(scenario: Scenario, kind: str, fault_id: str, start: float, end: float,
                subscriber_ids: list[str], online: dict[str, list[tuple[float, float]]],
                draw: Draw) -> FaultSlot | None:
    spec = scenario.faults
    selectors = spec.targets_of(kind)
    target = draw.weighted([(t, 1.0) for t in selectors]) if selectors else None
    params = spec.params_of(kind)
    for name, values in spec.choices_of(kind):
        params[name] = draw.weighted([(v, 1.0) for v in values])
    subscriber = ""
    if uses_placeholder(target) or uses_placeholder(params):
        steady = [c for c in subscriber_ids if _connected_throughout(online.get(c, []), start - STEADY_MARGIN_S,
                                                                     end + STEADY_MARGIN_S)]
        if not steady:
            return None
        subscriber = steady[draw.integer(0, len(steady) - 1)]
    return FaultSlot(fault_id=fault_id, kind=kind,
                     target=fill_placeholders(target, subscriber) if target is not None else "",
                     start_s=start, end_s=end,
                     params=full_fault_params(kind, fill_placeholders(params, subscriber)))


def _online_intervals(actions: list[SubscriberAction], duration: float) -> dict[str, list[tuple[float, float]]]:
    """client -> the [connect, disconnect) intervals the plan keeps it connected."""
    intervals: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for action in sorted(actions, key=lambda a: (a.offset_s, a.client_id)):
        if action.action == CONNECT:
            since.setdefault(action.client_id, action.offset_s)
        elif action.client_id in since:
            intervals.setdefault(action.client_id, []).append((since.pop(action.client_id), action.offset_s))
    for client_id, begun in since.items():
        intervals.setdefault(client_id, []).append((begun, duration + 3600.0))  # connected to the end
    return intervals


def _connected_throughout(intervals: list[tuple[float, float]], low: float, high: float) -> bool:
    return any(begun <= max(low, 0.0) and high <= ended for begun, ended in intervals)
