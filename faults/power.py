"""Power loss: the writes a node never fsynced are lost, and the node dies with them.

The node's data directory must be a lazyfs mount (harness/lazyfs/: file data held in memory until fsync),
reachable as ``node.lazyfs`` (a ``LazyFsMount``).  Apply: read the mount's stats, SIGKILL the node (the
process_kill fault's kill, down checks and, for a Redis master, promotion wait), then drop every unsynced
write.  The kill comes first so that no write lands between the drop and the death: the backing directory is
then exactly what the disk held at the kill.  Heal starts the node again on the same mount, which now shows
only what was fsynced.

Evidence: the node killed (pid gone, port refuses), the unsynced bytes and files dropped (stats before and
after: nothing unsynced is left), and at heal the node running again.

``target = "redis-all"`` (faults/selectors.py) is a whole-cluster power loss: every Redis node, one after the
other within a few tens of milliseconds (well inside the cluster's node timeout, so no replica is promoted and
none waited for); heal starts them all and waits until the cluster is healthy again.  That is the power loss
replication cannot cover: only what each node fsynced survives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    KindInfo,
    Param,
    register,
)
from faults.process import KillFault, NodeSetFault
from faults.redis_cluster_view import wait_until
from faults.selectors import SET_SELECTORS, parse_selector

# The selectors that reach an external target's nodes (faults/catalog.py EXTERNAL_NODE_SELECTORS): node:NAME and
# broker:N one node each; broker-random, broker-minority, broker-majority, broker-holding:CLIENT any broker node.
EXTERNAL_ANY_BROKER = ("broker-random", "broker-minority", "broker-majority", "broker-holding")


def external_reach(selector: str, nodes: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    """The names of the external target's nodes (``(name, role, ...)``, brokers in order) that a power_loss with
    this target selector may hit when the plan is played (a seeded or holding choice: every broker)."""
    parsed = parse_selector(selector)
    brokers = [node[0] for node in nodes if node[1] == "broker"]
    if parsed.how == "node":
        return tuple(node[0] for node in nodes if node[0] == parsed.arg)
    if parsed.how == "broker":
        index = int(parsed.arg or 0)
        return (brokers[index - 1],) if 0 < index <= len(brokers) else ()
    if parsed.how in EXTERNAL_ANY_BROKER:
        return tuple(brokers)
    return ()


def external_power_refusal(selectors: tuple[str, ...], nodes: tuple[tuple[Any, ...], ...]) -> str:
    """Why power_loss with these selectors cannot apply to an external target, or ''.  ``nodes``: (name, role,
    own_data_dir) triples, own_data_dir from harness/power.py ``harness_data_dirs`` (a pair without it: not
    known here, the run checks it before the nodes start).  The lazyfs mount goes on the data directory the
    harness gives the node ({data_dir}); a node that keeps its data elsewhere would write past the mount."""
    own = {node[0]: node[2] for node in nodes if len(node) > 2}
    for text in selectors:
        foreign = [name for name in external_reach(text, nodes) if own.get(name) is False]
        if foreign:
            return (f"targets.power_loss = {text!r}: power_loss puts the node's data directory on the harness' "
                    f"lazyfs mount, and node {foreign[0]!r} does not keep its data in the directory the harness "
                    "gives it: neither {data_dir} nor {nodes[NAME].data_dir} appears in its start argv, env "
                    "values, files or config_text, so its writes would go past the mount; point its data "
                    "directory there (Mosquitto: persistence_location {data_dir}/, RabbitMQ: "
                    "RABBITMQ_MNESIA_BASE = \"{data_dir}/mnesia\") or target another node")
    return ""


def lazyfs_of(node: Any) -> Any:
    mount = getattr(node, "lazyfs", None)
    if mount is None:
        raise FaultNotApplicable(
            f"power_loss of {node.name}: its data directory {getattr(node, 'data_dir', '?')} is not on a lazyfs "
            "mount, so there are no unsynced writes to lose (the run mounts one before the node starts when the "
            "plan has a power_loss fault: every Redis node, the s3rver storage node, an external target's nodes "
            "that keep their data in {data_dir})")
    return mount


class PowerLossFault(KillFault):
    def __init__(self, spec: FaultSpec) -> None:
        if spec.target and parse_selector(spec.target).how in SET_SELECTORS:
            # one node of a set: its replicas die with it, so there is no promotion to wait for
            spec = dataclasses.replace(spec, params={**spec.params, "wait_promotion": False})
        super().__init__(spec)
        self.dropped: dict | None = None

    def apply(self, ctx: FaultContext) -> Evidence:
        node = self._resolve(ctx)
        mount = lazyfs_of(node)
        before = mount.stats()
        evidence = super().apply(ctx)  # SIGKILL and its checks
        self.dropped = mount.drop_unsynced()
        after = self.dropped["stats"]
        ctx.note_node_event(node.name, "power_loss", fault_id=self.spec.id, pid=self.pid_before,
                            bytes_dropped=self.dropped["bytes_dropped"], files=self.dropped["files"])
        return evidence.plus(Check("unsynced writes dropped", {
            "node": node.name, "mount": str(mount.mountpoint), "bytes_dropped": self.dropped["bytes_dropped"],
            "files": self.dropped["files"], "unsynced_bytes_before": before["unsynced_bytes"],
            "unsynced_bytes_after": after["unsynced_bytes"], "fsyncs_before": before["fsyncs"],
        }, after["unsynced_bytes"] == 0 and after["drops"] == before["drops"] + 1))


class PowerLossSetFault(NodeSetFault):
    """Power loss of a set of nodes (redis-all); heal also waits for the Redis Cluster to be healthy again."""

    def heal(self, ctx: FaultContext) -> Evidence:
        evidence = super().heal(ctx)
        cluster = getattr(ctx.topology, "redis", None)
        if cluster is None or not hasattr(cluster, "health"):
            return evidence

        def healthy() -> tuple[bool, dict]:
            health = cluster.health()
            return health.ok, {"problems": list(health.problems)[:5]}

        ok, observed, waited = wait_until(healthy, ctx.ready_timeout_s)
        return evidence.plus(Check("redis cluster healthy", {**observed, "waited_s": waited}, ok))


def _factory(spec: FaultSpec) -> Any:
    if spec.target and parse_selector(spec.target).how in SET_SELECTORS:
        return PowerLossSetFault(spec, PowerLossFault)
    return PowerLossFault(spec)


register(KindInfo(
    name="power_loss", category="process", target="node", factory=_factory,
    description="lose every write the target node did not fsync (its data directory on lazyfs) and SIGKILL it; "
                "heal starts it again on the same data",
    params=(Param("wait_promotion", bool, True,
                  "for a Redis master with replicas: wait for (and require) a replica's promotion (not with a set "
                  "target such as redis-all: its replicas go down too)"),),
))
