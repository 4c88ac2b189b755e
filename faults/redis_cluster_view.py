"""Reading Redis Cluster's own view of itself: who is master, who replicates whom, who owns a slot.

Faults ask the cluster, not the harness' bookkeeping, because after a failover the roles the topology
started with are stale.  ``parse_cluster_nodes`` is pure (unit-tested); ``ClusterView.read`` asks every
reachable node and keeps the newest view (highest config epoch), so an isolated old master that still
believes it is master does not win.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from contracts.topology import NodeHandle, Topology
from faults.base import FaultNotApplicable

# Short timeouts: a paused or partitioned node must not stall the nemesis.
_SOCKET_TIMEOUT_S = 1.0


def client_messages_key(client_id: str) -> str:
    """The key whose slot decides which master holds a client's session (TBMQ's hash tag)."""
    return "{" + client_id + "}_messages"


@dataclass(frozen=True)
class ClusterEntry:
    node_id: str
    address: str  # "host:port"
    flags: frozenset[str]
    master_id: str | None
    config_epoch: int
    connected: bool
    slots: tuple[tuple[int, int], ...]  # inclusive ranges

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def is_failed(self) -> bool:
        return "fail" in self.flags or "fail?" in self.flags or "noaddr" in self.flags

    def owns_slot(self, slot: int) -> bool:
        return any(low <= slot <= high for low, high in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterEntry]:
    """Parse the text of CLUSTER NODES (one node a line)."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        node_id, address_field, flags, master = fields[:4]
        address = address_field.split("@", 1)[0].split(",", 1)[0]
        slots = []
        for slot_field in fields[8:]:
            if slot_field.startswith("["):  # a slot being imported / migrated: not owned yet
                continue
            low, _, high = slot_field.partition("-")
            slots.append((int(low), int(high or low)))
        entries.append(ClusterEntry(
            node_id=node_id,
            address=address,
            flags=frozenset(flags.split(",")),
            master_id=None if master == "-" else master,
            config_epoch=int(fields[6]),
            connected=fields[7] == "connected",
            slots=tuple(slots),
        ))
    return entries


def connect(host: str, port: int, timeout_s: float = _SOCKET_TIMEOUT_S) -> redis.Redis:
    """A client for one node that sends each command once.  redis-py >= 6 retries a timed-out command by
    default (8.x: 10 times, with backoff, each on a new connection): a query of a paused node then took
    ~15 s instead of ``timeout_s``, and a write was sent again each time (a FAILOVER, a SET probe)."""
    return redis.Redis(host=host, port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                       decode_responses=True, retry=Retry(NoBackoff(), 0))


def query(host: str, port: int, *command: Any) -> Any:
    """Run one command on one node, sent once; closes the connection afterwards."""
    client = connect(host, port)
    try:
        return client.execute_command(*command)
    finally:
        client.close()


def read_cluster_nodes(host: str, port: int) -> list[ClusterEntry]:
    entries = parse_cluster_nodes(query(host, port, "CLUSTER", "NODES"))
    # A node lists itself as ":port" before it learned its own address; fill it in.
    return [entry if not entry.address.startswith(":") else
            ClusterEntry(entry.node_id, f"{host}{entry.address}", entry.flags, entry.master_id,
                         entry.config_epoch, entry.connected, entry.slots)
            for entry in entries]


@dataclass(frozen=True)
class ClusterView:
    entries: tuple[ClusterEntry, ...]
    source: str  # the node the view came from

    @staticmethod
    def read(topology: Topology, exclude: tuple[str, ...] = ()) -> ClusterView:
        """The newest view among the reachable Redis nodes (not those named in ``exclude``)."""
        best: ClusterView | None = None
        problems = []
        for node in getattr(topology, "redis_nodes", []) or []:
            if node.name in exclude or not node.is_alive() or getattr(node, "paused", False):
                continue  # a paused node would only cost a timeout
            try:
                entries = read_cluster_nodes(node.host, node.port)
            except (redis.RedisError, OSError) as error:
                problems.append(f"{node.name}: {error}")
                continue
            view = ClusterView(tuple(entries), node.name)
            # The newest knowledge has the highest epoch among masters serving slots.
            if best is None or view.newest_epoch() > best.newest_epoch():
                best = view
        if best is None:
            raise FaultNotApplicable("no Redis node answered CLUSTER NODES: " + "; ".join(problems or ["none"]))
        return best

    def newest_epoch(self) -> int:
        return max((entry.config_epoch for entry in self.entries if entry.slots), default=0)

    def by_id(self, node_id: str) -> ClusterEntry | None:
        return next((entry for entry in self.entries if entry.node_id == node_id), None)

    def by_address(self, address: str) -> ClusterEntry | None:
        return next((entry for entry in self.entries if entry.address == address), None)

    def masters(self) -> list[ClusterEntry]:
        return [entry for entry in self.entries if entry.is_master and entry.slots and not entry.is_failed]

    def replicas(self) -> list[ClusterEntry]:
        return [entry for entry in self.entries if not entry.is_master and not entry.is_failed]

    def replicas_of(self, master_id: str) -> list[ClusterEntry]:
        return [entry for entry in self.replicas() if entry.master_id == master_id]

    def master_of_slot(self, slot: int) -> ClusterEntry:
        owners = [entry for entry in self.entries if entry.is_master and entry.owns_slot(slot)]
        if not owners:
            raise FaultNotApplicable(f"no master owns slot {slot} in the view of {self.source}")
        return max(owners, key=lambda entry: entry.config_epoch)

    def master_of_key(self, key: str) -> ClusterEntry:
        return self.master_of_slot(key_slot(key.encode()))

    def handle(self, topology: Topology, entry: ClusterEntry) -> NodeHandle:
        """The topology's node handle for a cluster entry (matched by address, then by node id)."""
        nodes = list(getattr(topology, "redis_nodes", []) or [])
        for node in nodes:
            if f"{node.host}:{node.port}" == entry.address:
                return node
        for node in nodes:
            if known_node_id(node) == entry.node_id:
                return node
        raise FaultNotApplicable(f"cluster node {entry.node_id[:8]} at {entry.address} is not in the topology")

    def entry_for(self, node: NodeHandle) -> ClusterEntry | None:
        by_address = self.by_address(f"{node.host}:{node.port}")
        if by_address is not None:
            return by_address
        node_id = known_node_id(node)
        return self.by_id(node_id) if node_id else None


def known_node_id(node: NodeHandle) -> str | None:
    """The node's cluster id if the handle knows it (asking a dead node must not raise)."""
    try:
        return getattr(node, "node_id", None)
    except (redis.RedisError, OSError):
        return None


def wait_until(predicate: Callable[[], tuple[bool, dict]], timeout_s: float, interval_s: float = 0.1
               ) -> tuple[bool, dict, float]:
    """Poll ``predicate`` (-> ok, observed) until ok or timeout; returns ok, last observed, seconds waited."""
    started = time.monotonic()
    while True:
        ok, observed = predicate()
        waited = time.monotonic() - started
        if ok or waited >= timeout_s:
            return ok, observed, round(waited, 3)
        time.sleep(interval_s)  # a fixed short poll: promotions take 1-3 s, a busy loop would steal CPU


def session_key(client_id: str, key_prefix: str = "") -> str:
    """The reference broker's session hash (reference_broker/store.py: node, conn, persistent, ...)."""
    return f"{key_prefix}{{{client_id}}}_session"


def session_owner(topology: Topology, client_id: str, key_prefix: str = "") -> str:
    """The broker node name holding a subscriber's connection, as the reference broker records it: field
    ``node`` of its session hash, valid while ``conn`` is set (a disconnected session has conn = "")."""
    key = session_key(client_id, key_prefix)
    view = ClusterView.read(topology)
    master = view.handle(topology, view.master_of_key(key))
    try:
        session = query(master.host, master.port, "HGETALL", key)
    except (redis.RedisError, OSError) as error:
        raise FaultNotApplicable(f"broker-holding:{client_id}: reading {key!r} failed: {error}") from None
    if isinstance(session, list):  # a flat field/value list when no reply parser applied
        session = dict(zip(session[::2], session[1::2], strict=True))
    if not session:
        raise FaultNotApplicable(f"broker-holding:{client_id}: no session {key!r} in Redis (never connected, "
                                 "or a clean session that ended)")
    if not session.get("conn"):
        raise FaultNotApplicable(f"broker-holding:{client_id}: the session is not connected now (last node "
                                 f"{session.get('node')!r}); no broker holds it")
    return session["node"]
