"""The declared interface between the run stage and what it runs against: a node handle, a topology (the
nodes faults act on), and a target (the broker under test with its life cycle).

These are structural types (``typing.Protocol``): the harness' providers (harness/local/, harness/containers/)
and target kinds (reference, external) satisfy them without importing this module's classes, and faults/
types its topology with them without importing the harness.  Members a fault treats as optional (a test's
stand-in topology may leave them out) are still declared here: every real topology has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Endpoint = tuple[str, int, str]  # (host, port, node name): one MQTT listener the clients connect to


@runtime_checkable
class NodeHandle(Protocol):
    """One server of a topology (a Redis node, Kafka, its storage, a broker) with full control over its life."""

    name: str
    role: str
    host: str
    port: int
    log_path: Path
    data_dir: Path
    paused: bool

    @property
    def pid(self) -> int | None: ...
    @property
    def address(self) -> str: ...
    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...
    def kill(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def restart(self, timeout: float = 10.0, ready_timeout: float | None = 30.0) -> None: ...
    def is_alive(self) -> bool: ...
    def wait_ready(self, timeout: float = 30.0) -> None: ...
    def describe(self) -> dict: ...


@runtime_checkable
class AddressMode(Protocol):
    """How the topology's nodes are addressed: "distinct" (own 127.0.0.x), "loopback" or "containers"."""

    mode: str


@runtime_checkable
class Topology(Protocol):
    """What the nemesis acts on: the nodes by role, how they are addressed, and where network faults go.

    ``config`` is the [topology] settings (harness/topology_config.py) or None for an external target;
    ``client_hosts`` the clients' source address(es) when the topology fixes them (None: derived from the
    address mode); ``network_fault_place`` "bridge" when network faults act on the run's bridge, else None."""

    redis_nodes: Sequence[NodeHandle]
    kafka: NodeHandle | None
    storage: NodeHandle | None
    brokers: Sequence[NodeHandle]
    config: Any
    addresses: AddressMode
    client_hosts: str | None
    network_fault_place: str | None

    def nodes(self) -> list[NodeHandle]: ...


@runtime_checkable
class ServiceTopology(Topology, Protocol):
    """A topology with the reference broker's services (Redis Cluster, Kafka): the white-box target's."""

    run_dir: Path
    redis: Any  # the running Redis Cluster (wait_ready, health)
    client_bind_address: str  # the address the clients bind, or "" (the provider does not fix one)

    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...
    def node(self, name: str) -> NodeHandle: ...
    def redis_startup_nodes(self) -> list[tuple[str, int]]: ...
    def kafka_bootstrap(self) -> str: ...
    def endpoints(self) -> dict: ...


@runtime_checkable
class Target(Protocol):
    """The broker under test as the run stage drives it (harness/run.py).

    ``white_box``: the target's storage can be read after the drain (session snapshots, the Kafka backlog);
    ``topology``: the nodes faults act on, None before start (and for a target that offers none);
    ``heal_ready_timeout_s``: how long a heal waits for a restarted node at least (a slow-booting external
    broker), or None; ``reuse`` / ``reset_s``: what a kept topology did (None when it was fresh).
    ``plan`` arguments are properties.plan.Plan (typed loosely here: contracts is the lowest layer)."""

    white_box: bool
    topology: Topology | None
    reuse: Mapping[str, Any] | None
    reset_s: float | None

    @property
    def key_prefix(self) -> str: ...
    @property
    def heal_ready_timeout_s(self) -> float | None: ...
    def prepare(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def endpoints(self) -> list[Endpoint]: ...
    def client_bind_address(self) -> str: ...
    def apply_presets(self, plan: Any) -> list[str]: ...
    def queue_size_probe(self) -> Any: ...
    def snapshot(self, plan: Any) -> int: ...
    def describe(self) -> dict[str, Any]: ...
    def log_files(self) -> list[tuple[str, str, Path]] | None: ...
