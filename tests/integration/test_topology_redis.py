"""The Redis Cluster of the local topology, with real processes: readiness, scripts, failover."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from harness import netns
from harness.local.host_topology import LocalTopology
from harness.local.redis_processes import RedisNode
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration

# A stand-in for the broker's save script: hash-tagged keys, so the whole call hits one slot.
SAVE_SCRIPT = """
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], seq, ARGV[1] .. seq)
redis.call('SET', KEYS[1] .. '_' .. seq, ARGV[1], 'EX', 60)
return seq
"""
KEYS = ["{c1}_messages", "{c1}_last_packet_id"]
TRANSIENT_ERRORS = {"ConnectionError", "TimeoutError", "ClusterDownError", "TryAgainError", "MaxConnectionsError",
                    "SlotNotCoveredError"}


def _wait(condition, timeout: float, what: str) -> float:
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def _reports_master(node: RedisNode) -> bool:
    try:
        return node.is_master()
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def redis_only(tmp_path_factory: pytest.TempPathFactory):
    """A topology of this module's own (Redis only): these tests kill and pause its nodes."""
    topology = LocalTopology(TopologyConfig(kafka_storage="none"), tmp_path_factory.mktemp("redis-only"))
    topology.start()
    try:
        yield topology
    finally:
        topology.stop()


def test_cluster_is_ready_by_the_full_definition(topology: LocalTopology) -> None:
    health = topology.redis.health()
    assert health.ok, health.problems
    assert (health.masters, health.replicas) == (3, 3)
    masters = [n for n in topology.redis_nodes if n.is_master()]
    replicas = [n for n in topology.redis_nodes if not n.is_master()]
    assert len(masters) == 3 and len(replicas) == 3
    for replica in replicas:
        assert replica.info("replication")["master_link_status"] == "up"
        assert replica.master_id() in {m.node_id for m in masters}
    views = {frozenset((e.node_id, e.is_master, e.slots) for e in n.cluster_nodes()) for n in topology.redis_nodes}
    assert len(views) == 1
    node = topology.redis_nodes[0]
    settings = {key: node.command("CONFIG", "GET", key)[key] for key in
                ("appendonly", "appendfsync", "cluster-node-timeout", "repl-diskless-sync-delay")}
    assert settings == {"appendonly": "yes", "appendfsync": "everysec", "cluster-node-timeout": "1000",
                        "repl-diskless-sync-delay": "0"}
    if netns.in_private_netns():  # each node on its own address, ready for per-node network faults
        assert len({n.host for n in topology.redis_nodes}) == 6
    assert topology.timings["redis_ready_s"] < 30
    print(f"\nreadiness: {topology.timings}")


def test_hash_tagged_evalsha_runs_on_the_slot_owner(topology: LocalTopology) -> None:
    # the shared session topology also serves other tests' brokers: keys of a client nobody else uses
    keys = ["{topology-test}_messages", "{topology-test}_last_packet_id"]
    client = redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in
                                               topology.redis_startup_nodes()], decode_responses=True)
    try:
        sha = client.script_load(SAVE_SCRIPT)
        client.delete(*keys)
        first = client.evalsha(sha, 2, *keys, "m")
        second = client.evalsha(sha, 2, *keys, "m")
        assert second == first + 1
        owner = topology.redis.master_for_key(keys[0])
        assert owner.command("ZCARD", keys[0]) == 2  # the data really is on the node owning the slot
        assert owner.command("GET", f"{keys[0]}_{second}") == "m"
        with pytest.raises(redis.ResponseError, match="same slot"):  # CROSSSLOT: why the keys are hash-tagged
            owner.command("EVAL", SAVE_SCRIPT, 2, keys[0], "{other-test}_last_packet_id", "m")
    finally:
        client.delete(*keys, f"{keys[0]}_1", f"{keys[0]}_2")
        client.close()


async def _run_script_through(fault, cluster_nodes: list[tuple[str, int]]) -> dict:
    """Keep calling the save script through the async cluster client while ``fault()`` runs in a thread;
    returns counts of successes before/after and of errors the client surfaced."""
    client = AsyncRedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_nodes],
                               socket_timeout=1, socket_connect_timeout=1)
    script = client.register_script(SAVE_SCRIPT)  # reloads the script on NOSCRIPT
    stats = {"ok": 0, "errors": [], "ok_after_fault": 0}
    fault_done = asyncio.Event()

    async def writer() -> None:
        while not (fault_done.is_set() and stats["ok_after_fault"] >= 20):
            try:
                await script(keys=KEYS, args=["m"])
                stats["ok"] += 1
                if fault_done.is_set():
                    stats["ok_after_fault"] += 1
            except (redis.RedisError, OSError) as error:
                stats["errors"].append(type(error).__name__)
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.01)

    try:
        await script(keys=KEYS, args=["m"])
        task = asyncio.create_task(writer())
        stats["fault"] = await asyncio.to_thread(fault)
        fault_done.set()
        await asyncio.wait_for(task, 30)
    finally:
        await client.aclose()
    return stats


def test_sigkill_of_master_promotes_replica_and_client_keeps_running_script(redis_only: LocalTopology) -> None:
    cluster = redis_only.redis
    master = cluster.master_for_key(KEYS[0])
    replica = cluster.replicas_of(master)[0]

    def kill_and_wait_for_promotion() -> float:
        time.sleep(0.3)  # let the writer run against the old master first
        killed_at = time.monotonic()
        master.kill()
        assert not master.is_alive()
        _wait(lambda: _reports_master(replica), 15, f"{replica.name} to be promoted")
        return time.monotonic() - killed_at

    stats = asyncio.run(_run_script_through(kill_and_wait_for_promotion, redis_only.redis_startup_nodes()))
    assert stats["ok_after_fault"] >= 20, stats
    # the client may surface connection trouble while the slot has no master, nothing else (no NOSCRIPT)
    assert set(stats["errors"]) <= TRANSIENT_ERRORS, stats["errors"]
    assert len(stats["errors"]) <= 40, stats["errors"]
    assert cluster.master_for_key(KEYS[0]) is replica

    restart_began = time.monotonic()
    master.start()
    master.wait_ready(15)
    cluster.wait_ready(30)
    restart_s = time.monotonic() - restart_began
    assert not master.is_master()
    assert master.master_id() == replica.node_id  # came back as a replica of the promoted node
    print(f"\nfailover after SIGKILL: {stats['fault']:.2f} s; restart to cluster ready: {restart_s:.2f} s; "
          f"client errors surfaced: {len(stats['errors'])} {sorted(set(stats['errors']))}")


def test_paused_master_beyond_node_timeout_fails_over_and_rejoins_as_replica(redis_only: LocalTopology) -> None:
    cluster = redis_only.redis
    cluster.wait_ready(30)
    master = cluster.master_for_key("{c7}_messages")
    replica = cluster.replicas_of(master)[0]
    paused_at = time.monotonic()
    master.pause()
    try:
        failover_s = _wait(lambda: _reports_master(replica), 15, f"{replica.name} to be promoted")
        assert master.is_alive()  # paused, not dead
    finally:
        master.resume()
    _wait(lambda: not _reports_master(master), 15, f"{master.name} to step down after resume")
    ready_s = cluster.wait_ready(30)
    assert master.master_id() == replica.node_id
    assert cluster.master_for_key("{c7}_messages") is replica
    print(f"\nfailover after SIGSTOP: {failover_s:.2f} s (node timeout 1 s); "
          f"rejoined and ready {time.monotonic() - paused_at:.2f} s after the pause ({ready_s:.2f} s after resume)")


def test_graceful_stop_and_restart_keeps_aof_data(redis_only: LocalTopology) -> None:
    cluster = redis_only.redis
    cluster.wait_ready(30)
    owner = cluster.master_for_key("{aof}_k")
    owner.command("SET", "{aof}_k", "kept")
    replica = cluster.replicas_of(owner)[0]
    owner.command("WAIT", 1, 2000)  # replicated before the restart
    replica.restart(ready_timeout=15)  # a replica: no failover, restarts from its own AOF + resync
    cluster.wait_ready(30)

    def replica_serves_key() -> bool:
        with replica.client() as connection:
            connection.execute_command("READONLY")
            return connection.get("{aof}_k") == "kept"

    _wait(replica_serves_key, 10, "the restarted replica to serve the key")
    assert (replica.data_dir / "appendonlydir").is_dir() or any(replica.data_dir.glob("*.aof"))


def test_valkey_server_from_the_wheel_forms_a_ready_cluster(topology_factory) -> None:
    topology = topology_factory(TopologyConfig(redis_server="valkey-server", kafka_storage="none"))
    node = topology.redis_nodes[0]
    assert node.argv[0].endswith("valkey-server")
    assert node.command("INFO", "server").get("server_name") == "valkey"
    assert topology.redis.health().ok


def test_a_run_directory_is_not_reused(topology: LocalTopology) -> None:
    with pytest.raises(RuntimeError, match="already holds node data"):
        LocalTopology(TopologyConfig(kafka_storage="none"), topology.run_dir).start()
