"""Generated runs for the property test: a Hypothesis strategy of plans (``drawn_runs``) — publishers and
persistent or clean subscribers (MQTT 3.1.1 and 5), publishes at QoS 0/1/2 with and without expiry, subscribers
leaving (clean or abrupt) and coming back, broker and Redis kills — played on a correct broker
(oracle/simulate.py), then perturbed by random anomalies (oracle/perturb.py), and written as run directories
(``write``) with the history schema's own writers and a scenario.json in the format the checkers read.

An independent idea of a history: nothing here comes from spark_checkers/synthetic.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from hypothesis import strategies as st

from contracts.history_schema import (
    EVENT_SCHEMA,
    LOG_SCHEMA,
    SCHEMA_VERSION,
    LogSource,
    Manifest,
    write_log_table,
    write_manifest,
    write_part,
)
from oracle.perturb import PERTURBATIONS, RUN_PERTURBATIONS
from oracle.plan import Behaviour, Plan, Publisher, Setup, Step, Subscriber
from oracle.simulate import simulate

START_WALL_US = 1_800_000_000_000_000
# Invariants a scenario may allow (checks.allowed) in a generated run: the common anomalies.
ALLOWABLE = ("durability.lost", "duplicates.redelivered_after_ack", "order.out_of_order", "order.dup_flag")


@dataclass(frozen=True)
class Drawn:
    """One generated run: its plan and the anomalies planted in it, (name, choice) each in order."""

    plan: Plan
    perturbations: tuple[tuple[str, int], ...] = ()

    def label(self) -> str:
        return ", ".join(f"{n}#{c}" for n, c in self.perturbations) or "clean"


def weighted(*pairs):
    """sampled_from with weights: (value, weight) pairs."""
    return st.sampled_from([v for v, w in pairs for _ in range(w)])


@st.composite
def setups(draw) -> Setup:
    target = draw(weighted(("reference", 3), ("external", 2)))
    policy = draw(weighted(("none", 1), ("drop_oldest", 2), ("drop_newest", 2), ("reject", 1))) \
        if target == "external" else "drop_oldest"
    limit = draw(weighted((2, 2), (3, 2), (5, 1), (10000, 3)))
    if policy == "reject":
        limit = 10000  # a rejecting queue the workload never fills: nothing is refused
    return Setup(target, policy, limit, ttl_s=draw(weighted((None, 4), (2, 1), (5, 1))),
                 tolerance_ms=draw(st.sampled_from([100, 200, 500])), slack_ms=draw(st.sampled_from([20, 100, 2000])),
                 persistence=draw(weighted(("kill", 4), ("graceful", 1), ("none", 1))),
                 allowed=tuple(draw(st.lists(st.sampled_from(ALLOWABLE), max_size=1))))


@st.composite
def publishers(draw) -> tuple[Publisher, ...]:
    n = draw(st.integers(1, 3))
    return tuple(Publisher(f"pub-{i}", draw(st.sampled_from([4, 5])),
                           tuple(f"t/pub-{i}/{k}" for k in range(draw(st.integers(1, 2))))) for i in range(n))


@st.composite
def subscribers(draw, pubs: tuple[Publisher, ...]) -> tuple[Subscriber, ...]:
    filters = ["t/#", "t/+/0", *[f"t/{p.name}/+" for p in pubs], *[t for p in pubs for t in p.topics]]
    out = []
    for i in range(draw(st.integers(1, 3))):
        protocol = draw(st.sampled_from([4, 5]))
        persistent = draw(weighted((True, 3), (False, 1)))
        expiry = draw(weighted((0, 2), (1, 1), (3600, 2))) if protocol == 5 and persistent else None
        v5 = protocol == 5
        out.append(Subscriber(
            f"sub-{i}", protocol, persistent, expiry, draw(st.sampled_from(filters)),
            draw(weighted((0, 1), (1, 4), (2, 2))),
            sub_id=draw(st.one_of(st.none(), st.integers(1, 9))) if v5 else None,
            receive_maximum=draw(weighted((None, 4), (1, 1), (2, 1))) if v5 else None,
            # Above every packet of a plan (about 100 bytes): a correct broker never meets it.
            maximum_packet_size=draw(weighted((None, 2), (1000, 1))) if v5 else None,
            stays_away=draw(weighted((False, 9), (True, 1)))))
    return tuple(out)


def gaps():
    return weighted((st.integers(0, 30), 6), (st.integers(100, 1500), 2), (st.integers(2000, 4000), 1)).flatmap(
        lambda s: s)


@st.composite
def steps(draw, n_pubs: int, n_subs: int) -> tuple[Step, ...]:
    out = []
    for _ in range(draw(st.integers(8, 40))):
        kind = draw(weighted(("publish", 8), ("leave", 2), ("back", 2), ("fault", 1)))
        gap = draw(gaps())
        if kind == "publish":
            out.append(Step("publish", gap, who=draw(st.integers(0, n_pubs - 1)), topic=draw(st.integers(0, 1)),
                            qos=draw(weighted((0, 1), (1, 4), (2, 2))),
                            expiry_s=draw(weighted((None, 5), (0, 1), (1, 1), (2, 1), (60, 1))),
                            props=tuple(draw(st.lists(st.tuples(st.sampled_from(["k", "trace"]),
                                                                st.sampled_from(["1", "x"])), max_size=2))),
                            content_type=draw(st.one_of(st.none(), st.just("text/plain")))))
        elif kind == "leave":
            out.append(Step("leave", gap, who=draw(st.integers(0, n_subs - 1)), abrupt=draw(st.booleans())))
        elif kind == "back":
            out.append(Step("back", gap, who=draw(st.integers(0, n_subs - 1)),
                            clean_start=draw(weighted((False, 9), (True, 1)))))
        else:
            node = draw(st.sampled_from(["broker-1", "broker-1", "redis-7001"]))
            out.append(Step("fault", gap, node=node, fault_kind=draw(weighted(("process_kill", 3), ("kill", 1))),
                            duration_ms=draw(st.integers(20, 900))))
    return tuple(out)


@st.composite
def plans(draw) -> Plan:
    pubs = draw(publishers())
    subs = draw(subscribers(pubs))
    behaviour = Behaviour(seed=draw(st.integers(0, 2**31)), first_packet_id=draw(weighted((1, 3), (65530, 1),
                                                                                          (65534, 1))),
                          trim=draw(weighted(("oldest", 8), ("none", 1), ("newest", 1))),
                          slow_acks=draw(st.booleans()), drain_cycle=draw(weighted((False, 3), (True, 1))),
                          lose_on_unpromised_kill=draw(st.booleans()))
    return Plan(draw(setups()), pubs, subs, draw(steps(len(pubs), len(subs))), behaviour)


ANOMALIES = (*sorted(PERTURBATIONS), *RUN_PERTURBATIONS)


def anomaly(value: int) -> tuple[str, int]:
    """(name, choice) of one drawn number: the name by its remainder, where by the rest.  Why one wide number, not
    sampled_from: Hypothesis reuses a small choice across the examples it derives from each other, so a batch's
    anomalies bunched into a few kinds; a wide integer spreads them over all."""
    return ANOMALIES[value % len(ANOMALIES)], (value // len(ANOMALIES)) % 10_007


def drawn_runs():
    """A plan and 0-3 anomalies for it (about a quarter of the runs clean)."""
    anomalies = weighted((st.just([]), 1), (st.lists(st.integers(0, 2**32 - 1).map(anomaly), min_size=1, max_size=3),
                                            3)).flatmap(lambda s: s)
    return st.builds(lambda p, a: Drawn(p, tuple(a)), plans(), anomalies)


def rows_of(drawn: Drawn) -> list[dict]:
    rows = simulate(drawn.plan)
    for name, choice in drawn.perturbations:
        if name in PERTURBATIONS:
            rows = PERTURBATIONS[name](rows, choice) or rows
    return rows


def scenario_of(setup: Setup) -> dict:
    """scenario.json as a run writes it (docs/scenarios.md), with only what the checks read."""
    checks = {"clock_tolerance_ms": setup.tolerance_ms, "pipeline_slack_ms": setup.slack_ms,
              "allowed": list(setup.allowed)}
    if setup.target == "reference":
        broker = {"persisted_messages_limit": setup.limit}
        if setup.ttl_s is not None:
            broker["persisted_message_ttl_s"] = setup.ttl_s
        target = {"kind": "reference", "promises": {"persistence": setup.persistence}}
    else:
        broker = {}
        target = {"kind": "external", "name": "broker-1", "start": ["mosquitto"],
                  "promises": {"queue_limit": None if setup.queue_policy == "none" else setup.limit,
                               "queue_policy": setup.queue_policy, "persistence": setup.persistence,
                               "message_ttl_s": setup.ttl_s, "mqtt_versions": ["3.1.1", "5"]}}
    return {"name": "oracle", "broker": broker, "checks": checks, "target": target}


def write(run_dir: str | Path, drawn: Drawn) -> Path:
    """``drawn`` as a run directory: history/ (parts + manifest + an empty log table), scenario.json."""
    run_dir = Path(run_dir)
    history = run_dir / "history"
    history.mkdir(parents=True, exist_ok=True)
    (run_dir / "scenario.json").write_text(json.dumps(scenario_of(drawn.plan.setup), indent=2))
    (run_dir / "drawn.txt").write_text(f"{drawn.label()}\n{drawn.plan!r}\n")
    records = [{**row, "seq": seq, "t_wall_us": START_WALL_US + row["t_mono_us"]}
               for seq, row in enumerate(rows_of(drawn), 1)]
    table = pa.Table.from_pylist(records, schema=EVENT_SCHEMA)
    half = max(1, len(records) // 2)
    parts = (write_part(history, 0, table.slice(0, half)), write_part(history, 1, table.slice(half)))
    complete = not any(name == "manifest_incomplete" for name, _ in drawn.perturbations)
    write_manifest(history, Manifest(run_id=run_dir.name, complete=complete, parts=parts,
                                     end_reason="run_end" if complete else "killed",
                                     incomplete_reason="" if complete else "killed",
                                     started_wall_us=START_WALL_US, updated_wall_us=START_WALL_US,
                                     meta={"scenario": "oracle", "seed": drawn.plan.behaviour.seed},
                                     schema_version=SCHEMA_VERSION))
    nodes = ("broker-1", "redis-7001") if drawn.plan.setup.target == "reference" else ("broker-1",)
    write_log_table(history, pa.Table.from_pylist([], schema=LOG_SCHEMA),
                    [LogSource(n, "broker" if n.startswith("broker") else "redis", f"logs/{n}.log") for n in nodes])
    return run_dir


def draw(n: int, seed_value: int) -> list[Drawn]:
    """``n`` distinct runs from ``drawn_runs`` (Hypothesis's generation phase only, the seed fixed, no database):
    the same ``n`` runs for the same seed, every time."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    drawn: list[Drawn] = []
    seen: set[str] = set()

    @seed(seed_value)
    @settings(max_examples=3 * n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @given(drawn_runs())
    def collect(run: Drawn) -> None:
        if len(drawn) < n and repr(run) not in seen:
            seen.add(repr(run))
            drawn.append(run)

    collect()
    return drawn
