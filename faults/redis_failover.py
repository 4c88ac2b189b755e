"""Redis forced failover: CLUSTER FAILOVER on a replica, evidence that the roles really swapped.

The target may name the replica (``redis-replica-of:CLIENT``, ``redis-random-replica``, ``node:NAME``) or
its master (``redis-master-of:CLIENT``, ``redis-random-master``): a master is replaced by one of its
replicas, chosen with the fault's seeded random source.  (Named ``redis_failover`` rather than
``redis`` so the module never shadows the redis-py package.)
"""

from __future__ import annotations

from typing import Any

import redis

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
from faults.redis_cluster_view import ClusterView, query, read_cluster_nodes, wait_until
from faults.selectors import resolve_node


class FailoverFault:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.replica: Any = None
        self.old_master: Any = None

    def _pick(self, ctx: FaultContext) -> tuple[Any, str, str]:
        rng = ctx.rng_for(self.spec.id)
        node = resolve_node(ctx.topology, self.spec.target, rng, ctx.broker_key_prefix)
        view = ClusterView.read(ctx.topology)
        entry = view.entry_for(node)
        if entry is None:
            raise FaultNotApplicable(f"fault {self.spec.id}: {node.name} is not a Redis Cluster node")
        if entry.is_master:
            replicas = sorted(view.replicas_of(entry.node_id), key=lambda replica: replica.address)
            if not replicas:
                raise FaultNotApplicable(f"fault {self.spec.id}: master {node.name} has no healthy replica")
            master_entry, entry = entry, rng.choice(replicas)
            node = view.handle(ctx.topology, entry)
        else:
            master_entry = view.by_id(entry.master_id or "")
            if master_entry is None:
                raise FaultNotApplicable(f"fault {self.spec.id}: replica {node.name} has no known master")
        self.replica, self.old_master = node, view.handle(ctx.topology, master_entry)
        return node, entry.node_id, master_entry.node_id

    def apply(self, ctx: FaultContext) -> Evidence:
        replica, replica_id, master_id = self._pick(ctx)
        mode = self.spec.params.get("mode", "default")
        command = ("CLUSTER", "FAILOVER") if mode == "default" else ("CLUSTER", "FAILOVER", mode.upper())
        try:
            query(replica.host, replica.port, *command)
        except (redis.RedisError, OSError) as error:
            raise FaultNotApplicable(f"fault {self.spec.id}: {' '.join(command)} on {replica.name} "
                                     f"failed: {error}") from None
        ctx.note_node_event(replica.name, "failover", fault_id=self.spec.id, mode=mode,
                            old_master=self.old_master.name)

        def swapped() -> tuple[bool, dict]:
            try:
                entries = {entry.node_id: entry for entry in read_cluster_nodes(replica.host, replica.port)}
                old_role = query(self.old_master.host, self.old_master.port, "ROLE")[0]
            except (redis.RedisError, OSError) as error:
                return False, {"error": str(error)}
            new, old = entries.get(replica_id), entries.get(master_id)
            promoted = new is not None and new.is_master and bool(new.slots)
            demoted = old is not None and not old.is_master and old.master_id == replica_id
            return promoted and demoted and old_role == "slave", {
                "replica": replica.name, "replica_flags": sorted(new.flags) if new else None,
                "old_master": self.old_master.name, "old_master_flags": sorted(old.flags) if old else None,
                "old_master_role": old_role,
            }

        ok, observed, waited = wait_until(swapped, ctx.effect_timeout_s)
        return Evidence.of(Check("roles swapped", {**observed, "mode": mode, "waited_s": waited}, ok))

    def heal(self, ctx: FaultContext) -> Evidence:
        # Nothing to undo: the cluster keeps its new master.  Check it is healthy under the new roles.
        def cluster_ok() -> tuple[bool, dict]:
            try:
                info = query(self.replica.host, self.replica.port, "CLUSTER", "INFO")
            except (redis.RedisError, OSError) as error:
                return False, {"error": str(error)}
            state = info.get("cluster_state") if isinstance(info, dict) else (
                "ok" if "cluster_state:ok" in str(info) else "fail")
            return state == "ok", {"node": self.replica.name, "cluster_state": state}

        ok, observed, waited = wait_until(cluster_ok, ctx.effect_timeout_s)
        return Evidence.of(Check("cluster ok after failover", {**observed, "waited_s": waited}, ok))


register(KindInfo(
    name="redis_failover", category="redis", target="node", factory=FailoverFault, instant=True,
    description="CLUSTER FAILOVER on a replica (or a replica of the targeted master); evidence: roles swapped",
    params=(Param("mode", str, "default", "CLUSTER FAILOVER option", choices=("default", "force", "takeover")),),
))
