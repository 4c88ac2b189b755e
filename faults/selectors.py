"""Target selectors: which node a fault hits, and which addresses a network fault's groups cover.

A selector is a short string, so plans stay plain JSON:

    node:NAME                 the node with that name ("redis-7001", "kafka", "broker-2", ...)
    redis-master-of:CLIENT    the Redis master that owns the slot of ``{CLIENT}_messages`` now
    redis-replica-of:CLIENT   a replica of that master (seeded choice)
    redis-random-master       a Redis master (seeded choice)
    redis-random-replica      a Redis replica (seeded choice)
    kafka | storage           the Kafka-protocol broker | its storage server
    broker:N                  reference-broker node N (1-based, as in "broker-N")
    broker-random             a broker node (seeded choice)
    broker-minority           a minority of the broker nodes (seeded choice; 1 of 3, 2 of 5; at least 1)
    broker-majority           a majority of the broker nodes (seeded choice; 2 of 3, 3 of 5)
    redis-all                 every Redis node at once (a whole-cluster fault: power loss of every node)
    broker-holding:CLIENT     the broker node holding that client's session: the reference topology reads
                              it from Redis; an external target asks its [target.formation] holding command,
                              else it is the node of the client's current (or last) connection

A selector names one node, except broker-minority, broker-majority and redis-all, which name a set
(``resolve_nodes``); a process fault on a set acts on each of its nodes.

Network faults take *groups*: a role — ``redis``, ``broker``, ``kafka``, ``storage``, ``client`` — or
``client:ID``, or any node selector above; a group may also be a list of those.

Parsing is pure (validated when the plan is built); resolution needs the running topology and is done
when the fault is applied, so "the master that owns this slot" means the master at that moment.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from contracts.target_nodes import majority_size, minority_size
from contracts.topology import NodeHandle, Topology
from faults.base import FaultNotApplicable, FaultSpecError

_NO_ARG = ("redis-random-master", "redis-random-replica", "kafka", "storage", "broker-random", "broker-minority",
           "broker-majority", "redis-all")
SET_SELECTORS = ("broker-minority", "broker-majority", "redis-all")  # name several nodes at once
_WITH_ARG = ("node", "redis-master-of", "redis-replica-of", "broker", "broker-holding")
ROLE_GROUPS = ("redis", "broker", "kafka", "storage", "client")

SELECTOR_HELP = (
    "node:NAME, redis-master-of:CLIENT, redis-replica-of:CLIENT, redis-random-master, "
    "redis-random-replica, redis-all, kafka, storage, broker:N, broker-random, broker-minority, broker-majority, "
    "broker-holding:CLIENT"
)
GROUP_HELP = "a role (" + ", ".join(ROLE_GROUPS) + "), client:ID, or a node selector (" + SELECTOR_HELP + ")"


@dataclass(frozen=True)
class Selector:
    how: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.how if self.arg is None else f"{self.how}:{self.arg}"


def parse_selector(text: Any) -> Selector:
    """Parse a node selector; errors say what is allowed."""
    if not isinstance(text, str) or not text.strip():
        raise FaultSpecError(f"target selector {text!r}: expected a non-empty string, one of {SELECTOR_HELP}")
    how, sep, arg = text.strip().partition(":")
    if how in _NO_ARG and not sep:
        return Selector(how)
    if how in _WITH_ARG and sep and arg:
        if how == "broker" and not (arg.isdigit() and int(arg) >= 1):
            raise FaultSpecError(f"target selector {text!r}: broker:N needs a node number N >= 1")
        return Selector(how, arg)
    raise FaultSpecError(f"target selector {text!r} not understood; expected one of {SELECTOR_HELP}")


# The node names harness/local/tansu.py gives the Kafka broker (Tansu) and its S3 storage server.
KAFKA_NODE_NAMES = {"kafka": "kafka", "s3": "storage"}


def kafka_role_of(text: str) -> str | None:
    """'kafka' or 'storage' when the selector names the Kafka broker or its storage server, else None.
    Pure, for validating a scenario before anything runs."""
    selector = parse_selector(text)
    if selector.how in ("kafka", "storage"):
        return selector.how
    if selector.how == "node":
        return KAFKA_NODE_NAMES.get(selector.arg or "")
    return None


def parse_group(value: Any) -> tuple[str, ...]:
    """Parse a network group (a string or a list of strings) into its members; errors say what is allowed.
    A member prefixed with "-" is taken out of the group: ["redis", "-redis-master-of:c1"] = the other
    Redis nodes, which is how a Redis<->Redis partition is written."""
    members = [value] if isinstance(value, str) else value
    if not isinstance(members, list | tuple) or not members:
        raise FaultSpecError(f"network group {value!r}: expected {GROUP_HELP}, or a non-empty list of those")
    for member in members:
        plain = member[1:] if isinstance(member, str) and member.startswith("-") else member
        if plain in ROLE_GROUPS:
            continue
        if isinstance(plain, str) and plain.startswith("client:") and len(plain) > len("client:"):
            continue
        try:
            parse_selector(plain)
        except FaultSpecError:
            raise FaultSpecError(f"network group member {member!r}: expected {GROUP_HELP} (a leading '-' "
                                 "excludes)") from None
    if all(member.startswith("-") for member in members):
        raise FaultSpecError(f"network group {value!r}: only exclusions; name what the group holds first")
    return tuple(members)


def group_error(value: Any) -> str | None:
    """For Param.check: the problem with a group value, or None."""
    try:
        parse_group(value)
    except FaultSpecError as error:
        return str(error)
    return None


# --- resolution against a running topology ----------------------------------------------------------


def all_nodes(topology: Topology) -> list[NodeHandle]:
    """Every node handle of the topology, in a stable order."""
    nodes: list[NodeHandle] = list(getattr(topology, "redis_nodes", []) or [])
    for attribute in ("kafka", "storage"):
        node = getattr(topology, attribute, None)
        if node is not None:
            nodes.append(node)
    nodes.extend(getattr(topology, "services", []) or [])  # processes inside an external target
    nodes.extend(getattr(topology, "brokers", []) or [])
    return nodes


def node_by_name(topology: Topology, name: str) -> NodeHandle:
    for node in all_nodes(topology):
        if node.name == name:
            return node
    names = ", ".join(node.name for node in all_nodes(topology)) or "(no nodes)"
    raise FaultNotApplicable(f"no node named {name!r} in the topology; nodes: {names}")


def _choose(rng: random.Random, candidates: list[NodeHandle], what: str) -> NodeHandle:
    if not candidates:
        raise FaultNotApplicable(f"no {what} to choose from")
    return rng.choice(sorted(candidates, key=lambda node: node.name))


def resolve_nodes(topology: Topology, selector: Selector | str, rng: random.Random,
                  key_prefix: str = "") -> list[NodeHandle]:
    """The node handles a selector means right now: one node, or a seeded minority / majority of the
    broker nodes (in name order)."""
    selector = parse_selector(selector) if isinstance(selector, str) else selector
    if selector.how not in SET_SELECTORS:
        return [resolve_node(topology, selector, rng, key_prefix)]
    if selector.how == "redis-all":
        nodes = sorted(getattr(topology, "redis_nodes", []) or [], key=lambda node: node.name)
        if not nodes:
            raise FaultNotApplicable(f"target {selector}: the topology has no Redis nodes")
        return nodes
    brokers = sorted(getattr(topology, "brokers", []) or [], key=lambda node: node.name)
    if not brokers:
        raise FaultNotApplicable(f"target {selector}: the topology has no broker nodes")
    size = minority_size(len(brokers)) if selector.how == "broker-minority" else majority_size(len(brokers))
    return sorted(rng.sample(brokers, size), key=lambda node: node.name)


def resolve_node(topology: Topology, selector: Selector | str, rng: random.Random,
                 key_prefix: str = "") -> NodeHandle:
    """The node handle a selector means right now (key_prefix: the broker's Redis key prefix)."""
    from faults import redis_cluster_view  # Redis queries only when a Redis selector is used

    selector = parse_selector(selector) if isinstance(selector, str) else selector
    how, arg = selector.how, selector.arg
    if how in SET_SELECTORS:
        raise FaultNotApplicable(f"target {selector}: names a set of nodes; this fault acts on one node")
    if how == "node":
        return node_by_name(topology, arg)
    if how in ("kafka", "storage"):
        node = getattr(topology, how, None)
        if node is None:
            raise FaultNotApplicable(f"target {selector}: the topology has no {how} node")
        return node
    if how == "broker":
        brokers = list(getattr(topology, "brokers", []) or [])
        index = int(arg)
        for node in brokers:  # prefer the name, fall back to the position
            if node.name == f"broker-{index}":
                return node
        if index <= len(brokers):
            return brokers[index - 1]
        raise FaultNotApplicable(f"target {selector}: the topology has {len(brokers)} broker node(s)")
    if how == "broker-random":
        return _choose(rng, list(getattr(topology, "brokers", []) or []), "broker node")
    if how == "broker-holding":
        holding = getattr(topology, "holding_node", None)  # an external target's own answer
        name = holding(arg) if callable(holding) else redis_cluster_view.session_owner(topology, arg, key_prefix)
        return node_by_name(topology, name)
    view = redis_cluster_view.ClusterView.read(topology)
    if how == "redis-master-of":
        return view.handle(topology, view.master_of_key(redis_cluster_view.client_messages_key(arg)))
    if how == "redis-replica-of":
        master = view.master_of_key(redis_cluster_view.client_messages_key(arg))
        replicas = [view.handle(topology, entry) for entry in view.replicas_of(master.node_id)]
        return _choose(rng, replicas, f"replica of the master owning {arg}'s slot ({master.address})")
    if how == "redis-random-master":
        return _choose(rng, [view.handle(topology, entry) for entry in view.masters()], "Redis master")
    if how == "redis-random-replica":
        return _choose(rng, [view.handle(topology, entry) for entry in view.replicas()], "Redis replica")
    raise FaultSpecError(f"target selector {selector}: not understood; expected one of {SELECTOR_HELP}")


def client_hosts(topology: Topology) -> dict[str, str]:
    """client id -> source address, as the topology / executor declares them (``client_hosts``)."""
    hosts = getattr(topology, "client_hosts", None)
    if callable(hosts):
        hosts = hosts()
    if not hosts and getattr(getattr(topology, "addresses", None), "mode", None) == "distinct":
        # harness/addresses.py: with distinct node addresses, 127.0.0.1 is left to the clients.
        hosts = "127.0.0.1"
    if not hosts:
        raise FaultNotApplicable(
            "the topology declares no client source addresses (topology.client_hosts), so a client "
            "group cannot be matched to packets"
        )
    if isinstance(hosts, str):
        return {"*": hosts}
    if isinstance(hosts, list | tuple | set):
        return {f"client@{host}": host for host in hosts}
    return dict(hosts)


def resolve_group(topology: Topology, group: Any, rng: random.Random, key_prefix: str = "",
                  cache: dict[str, Any] | None = None) -> dict[str, str]:
    """A network group -> {member name: address}.  ``cache`` (one per fault) makes a selector used on both
    sides (or as an exclusion) mean the same node, even a seeded random one."""
    cache = {} if cache is None else cache
    included: dict[str, str] = {}
    excluded: dict[str, str] = {}
    for member in parse_group(group):
        into, plain = (excluded, member[1:]) if member.startswith("-") else (included, member)
        into.update(_resolve_member(topology, plain, rng, key_prefix, cache))
    result = {name: host for name, host in included.items()
              if name not in excluded and host not in excluded.values()}
    if not result:
        raise FaultNotApplicable(f"network group {group!r} resolves to no address (everything excluded)")
    return result


def _resolve_member(topology: Topology, member: str, rng: random.Random, key_prefix: str,
                    cache: dict[str, Any]) -> dict[str, str]:
    if member == "client":
        return client_hosts(topology)
    if member.startswith("client:"):
        client_id = member.split(":", 1)[1]
        hosts = client_hosts(topology)
        host = hosts.get(client_id) or hosts.get("*")
        if host is None:
            raise FaultNotApplicable(f"network group member {member!r}: no source address for client "
                                     f"{client_id!r} in topology.client_hosts")
        return {member: host}
    if member in ("redis", "broker"):
        nodes = list(getattr(topology, "redis_nodes" if member == "redis" else "brokers", []) or [])
        if not nodes:
            raise FaultNotApplicable(f"network group {member!r}: the topology has no {member} nodes")
        return {node.name: node.host for node in nodes}
    if member not in cache:
        cache[member] = resolve_nodes(topology, member, rng, key_prefix)
    return {node.name: node.host for node in cache[member]}
