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


def lazyfs_of(node: Any) -> Any:
    mount = getattr(node, "lazyfs", None)
    if mount is None:
        raise FaultNotApplicable(
            f"power_loss of {node.name}: its data directory {getattr(node, 'data_dir', '?')} is not on a lazyfs "
            "mount, so there are no unsynced writes to lose (the local topology mounts one for a Redis node when "
            "the plan has a power_loss fault)")
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
