"""What a generated run is made of, before any row exists: the scenario's declarations (``Setup``), the clients,
and the steps of the workload (``Plan``).  oracle/simulate.py plays a plan on a correct broker; oracle/perturb.py
then plants anomalies in the rows; oracle/generate.py draws plans with Hypothesis and writes the runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setup:
    """scenario.json's declarations."""

    target: str = "reference"  # reference | external
    queue_policy: str = "drop_oldest"  # an external target's: none | drop_oldest | drop_newest | reject
    limit: int = 10000
    ttl_s: int | None = None  # None: the reference broker's default / an external target declares none
    tolerance_ms: int = 500
    slack_ms: int = 2000
    persistence: str = "kill"  # kill | graceful | none
    allowed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Publisher:
    name: str
    protocol: int  # 4 | 5
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Subscriber:
    name: str
    protocol: int
    persistent: bool  # CleanSession = 0 / clean start 0
    session_expiry_s: int | None  # MQTT 5: the session expiry interval it connects with
    topic_filter: str
    qos: int  # requested, and granted
    sub_id: int | None = None  # MQTT 5 subscription identifier
    receive_maximum: int | None = None  # MQTT 5 CONNECT property (None: none sent = 65535)
    maximum_packet_size: int | None = None  # MQTT 5 CONNECT property (None: no limit)
    stays_away: bool = False  # not brought back by the drain if offline at the end


@dataclass(frozen=True)
class Step:
    """One action of the workload, ``gap_ms`` after the one before.

    kind: publish (who = publisher index, topic, qos, expiry_s, props), leave (who = subscriber index,
    abrupt), back (who = subscriber index, clean_start), fault (node, duration_ms, fault_kind)."""

    kind: str
    gap_ms: int
    who: int = 0
    topic: int = 0
    qos: int = 1
    expiry_s: int | None = None
    props: tuple[tuple[str, str], ...] = ()  # user properties (MQTT 5 publishers)
    content_type: str | None = None
    abrupt: bool = True
    clean_start: bool = False
    node: str = "broker-1"
    fault_kind: str = "process_kill"
    duration_ms: int = 0


@dataclass(frozen=True)
class Behaviour:
    """How the simulated broker treats what the plan does: latencies (drawn from ``seed``), its first stored
    packet id, and the knobs that make it a broken broker on purpose (``trim``)."""

    seed: int = 0
    first_packet_id: int = 1
    trim: str = "oldest"  # oldest (correct) | none (keeps more than the limit) | newest (drops the wrong end)
    slow_acks: bool = False  # publish acks sometimes after the deliveries
    drain_cycle: bool = False  # the drain disconnects and reconnects every persistent subscriber at once
    lose_on_unpromised_kill: bool = True  # a kill the persistence does not cover takes sessions and queues


@dataclass(frozen=True)
class Plan:
    setup: Setup
    publishers: tuple[Publisher, ...]
    subscribers: tuple[Subscriber, ...]
    steps: tuple[Step, ...]
    behaviour: Behaviour = Behaviour()
