"""A running Redis Cluster (either provider's nodes): its formation, its readiness, and each node's cluster
commands (``RedisCommands``).

Ready means all three (docs/recipes.md): ``cluster_state:ok`` on every node, every replica's
``master_link_status:up``, and every node's ``CLUSTER NODES`` agreeing on the same masters (with all
16384 slots) and replicas.  ``cluster_health()`` reports exactly which of those is not yet true."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from harness.node import NodeError

SLOTS = 16384


@dataclass(frozen=True)
class ClusterNodeEntry:
    """One line of CLUSTER NODES."""

    node_id: str
    address: str  # host:port
    flags: frozenset[str]
    master_id: str | None
    link_state: str
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})

    def owns_slot(self, slot: int) -> bool:
        return any(start <= slot <= end for start, end in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterNodeEntry]:
    entries = []
    for line in text.strip().splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        slots = []
        for item in parts[8:]:
            if item.startswith("["):  # a slot being migrated/imported, not owned yet
                continue
            start, _, end = item.partition("-")
            slots.append((int(start), int(end or start)))
        entries.append(ClusterNodeEntry(
            node_id=parts[0], address=parts[1].split("@")[0], flags=frozenset(parts[2].split(",")),
            master_id=None if parts[3] == "-" else parts[3], link_state=parts[7], slots=tuple(sorted(slots))))
    return entries


def _view(entries: Sequence[ClusterNodeEntry]) -> frozenset:
    """The part of one node's CLUSTER NODES that every node must agree on."""
    return frozenset((e.node_id, e.address, e.is_master, e.master_id if not e.is_master else None, e.slots)
                     for e in entries)


class RedisCommands:
    """The cluster commands of a Redis node handle, for any node with ``host``, ``port`` and ``_node_id``
    (a local process, harness/local/redis_processes.py, or a container, harness/containers/topology.py)."""

    host: str
    port: int
    _node_id: str | None

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A plain (non-cluster) connection to this one node."""
        return redis.Redis(host=self.host, port=self.port, socket_timeout=timeout,
                           socket_connect_timeout=timeout, decode_responses=True)

    def command(self, *args, timeout: float = 2.0):
        with self.client(timeout) as connection:
            return connection.execute_command(*args)

    @property
    def node_id(self) -> str:
        if self._node_id is None:
            self._node_id = self.command("CLUSTER", "MYID")
        return self._node_id

    def raw(self, *args, timeout: float = 2.0):
        """The reply as the server sent it (redis-py would parse CLUSTER NODES / INFO into dicts)."""
        with self.client(timeout) as connection:
            link = connection.connection_pool.get_connection()
            try:
                link.send_command(*args)
                return link.read_response()
            finally:
                connection.connection_pool.release(link)

    def cluster_nodes(self) -> list[ClusterNodeEntry]:
        return parse_cluster_nodes(self.raw("CLUSTER", "NODES"))

    def myself(self) -> ClusterNodeEntry:
        return next(e for e in self.cluster_nodes() if "myself" in e.flags)

    def is_master(self) -> bool:
        return self.myself().is_master

    def cluster_role(self) -> str:
        return "master" if self.is_master() else "replica"

    def master_id(self) -> str | None:
        """The id of the master this node replicates (None when it is a master)."""
        return self.myself().master_id

    def info(self, section: str) -> dict:
        with self.client() as connection:
            return connection.info(section)


@dataclass(frozen=True)
class ClusterHealth:
    ok: bool
    problems: tuple[str, ...]
    masters: int = 0
    replicas: int = 0
    details: dict = field(default_factory=dict, compare=False)


class RedisCluster:
    """The nodes of one cluster plus formation and readiness.  Node i < masters starts as master i;
    the rest replicate masters round-robin in order."""

    def __init__(self, nodes: list[RedisCommands], masters: int, replicas_per_master: int) -> None:
        self.nodes, self.masters, self.replicas_per_master = nodes, masters, replicas_per_master

    # -- formation -------------------------------------------------------------------------------
    def start_processes(self) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready(15)

    def create(self, timeout: float = 30.0) -> None:
        """Form the cluster from freshly started, empty nodes (slots, meet, replicate)."""
        deadline = time.monotonic() + timeout
        masters, replicas = self.nodes[:self.masters], self.nodes[self.masters:]
        for epoch, node in enumerate(self.nodes, start=1):
            node.command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for index, node in enumerate(masters):
            first, last = index * SLOTS // self.masters, (index + 1) * SLOTS // self.masters - 1
            node.command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for node in self.nodes[1:]:
            self.nodes[0].command("CLUSTER", "MEET", node.host, node.port)
        self._wait(deadline, "every node to know every other node", self._all_met)
        for index, replica in enumerate(replicas):
            master = masters[index % self.masters]
            # retry: the replica may not have learned the master's id from gossip yet
            self._wait(deadline, f"{replica.name} to replicate {master.name}",
                       lambda r=replica, m=master: self._try_replicate(r, m))

    def _all_met(self) -> bool:
        for node in self.nodes:
            entries = node.cluster_nodes()
            if len(entries) != len(self.nodes) or any(e.failing or e.link_state != "connected" and
                                                        "myself" not in e.flags for e in entries):
                return False
        return True

    @staticmethod
    def _try_replicate(replica: RedisCommands, master: RedisCommands) -> bool:
        try:
            replica.command("CLUSTER", "REPLICATE", master.node_id)
            return True
        except redis.ResponseError:
            return False

    @staticmethod
    def _wait(deadline: float, what: str, condition) -> None:
        while not condition():
            if time.monotonic() > deadline:
                raise NodeError(f"Redis Cluster: timed out waiting for {what}")
            time.sleep(0.1)

    # -- readiness --------------------------------------------------------------------------------
    def health(self) -> ClusterHealth:
        problems: list[str] = []
        views: dict[str, frozenset] = {}
        entries_by_node: dict[str, list[ClusterNodeEntry]] = {}
        for node in self.nodes:
            if not node.is_alive():
                problems.append(f"{node.name}: process not running")
                continue
            if node.paused:
                problems.append(f"{node.name}: paused")
                continue
            try:
                cluster_info = node.raw("CLUSTER", "INFO")
                entries = node.cluster_nodes()
                replication = node.info("replication")
            except redis.RedisError as error:
                problems.append(f"{node.name}: not answering ({error})")
                continue
            if "cluster_state:ok" not in cluster_info:
                problems.append(f"{node.name}: cluster_state is not ok")
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                problems.append(f"{node.name}: master_link_status is {replication.get('master_link_status')}")
            failing = [e.address for e in entries if e.failing]
            if failing:
                problems.append(f"{node.name}: sees failing nodes {failing}")
            views[node.name] = _view(entries)
            entries_by_node[node.name] = entries
        masters = replicas = 0
        if views:
            distinct = set(views.values())
            if len(distinct) > 1:
                problems.append(f"CLUSTER NODES views disagree ({len(distinct)} different views)")
            entries = next(iter(entries_by_node.values()))
            with_slots = [e for e in entries if e.is_master and e.slots]
            masters = len(with_slots)
            replicas = sum(1 for e in entries if not e.is_master)
            covered = sum(end - start + 1 for e in with_slots for start, end in e.slots)
            if covered != SLOTS:
                problems.append(f"slots covered: {covered} of {SLOTS}")
            if masters != self.masters:
                problems.append(f"{masters} masters with slots, expected {self.masters}")
            if replicas != self.masters * self.replicas_per_master:
                problems.append(f"{replicas} replicas, expected {self.masters * self.replicas_per_master}")
            if len(entries) != len(self.nodes):
                problems.append(f"{len(entries)} nodes known, expected {len(self.nodes)}")
        return ClusterHealth(ok=not problems, problems=tuple(problems), masters=masters, replicas=replicas)

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Block until health().ok; returns the seconds it took."""
        started = time.monotonic()
        while True:
            health = self.health()
            if health.ok:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise NodeError(f"Redis Cluster not ready after {timeout:.0f} s: {'; '.join(health.problems)}")
            time.sleep(0.1)

    # -- inspection -------------------------------------------------------------------------------
    def by_id(self, node_id: str) -> RedisCommands:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(node_id)

    def _any_view(self) -> list[ClusterNodeEntry]:
        for node in self.nodes:
            if node.is_alive() and not node.paused:
                try:
                    return node.cluster_nodes()
                except redis.RedisError:
                    continue
        raise NodeError("no Redis node answers CLUSTER NODES")

    def master_for_key(self, key: str | bytes) -> RedisCommands:
        """The node serving the slot of ``key`` (hash tags honoured), as a live node sees it."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for entry in self._any_view():
            if entry.is_master and not entry.failing and entry.owns_slot(slot):
                return self.by_id(entry.node_id)
        raise NodeError(f"no master owns slot {slot} of key {key!r}")

    def replicas_of(self, master: RedisCommands) -> list[RedisCommands]:
        master_id = master.node_id
        return [self.by_id(e.node_id) for e in self._any_view() if e.master_id == master_id]

    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(node.host, node.port) for node in self.nodes]


def answers_ping(node: RedisCommands) -> bool:
    """A Redis node's readiness: it answers PING."""
    try:
        return bool(node.client(timeout=0.5).ping())
    except redis.RedisError:
        return False
