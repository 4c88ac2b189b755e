"""Keep one local topology (Redis Cluster, Tansu and its S3 server) between the seeds of one command
(``ordeal explore``), reset to the state of a fresh start and verified before every next seed.

A fresh topology per seed costs its start and stop every time (9-18 s of a run's overhead on a loaded
2-core machine).  What a seed may leave behind, and what the reset does about it, in order:

- network rules of a fault (nft table, tc qdisc): removed (faults.network.heal_all_network);
- paused or killed Redis nodes: resumed / started, waited for; CLIENT PAUSE of a write stall: UNPAUSE;
- a replica promoted by a kill or a failover: the original master is failed back (CLUSTER FAILOVER on it),
  a replica following another master is sent back (CLUSTER REPLICATE), so the node -> role map is the one
  of the fresh start (a fault target such as ``redis-master-of:CLIENT`` resolves through it);
- every key: FLUSHALL on each master, SCRIPT FLUSH everywhere, then an AOF rewrite (a later kill restarts
  the node from an empty file, as on a fresh topology);
- Kafka: Tansu and its S3 server are killed and started again on an empty store (moto keeps the bucket in
  memory; an s3rver directory is emptied), so no topic, record or consumer-group offset survives;
- the reference-broker nodes are started per seed (in the seed's run directory) and stopped after it.

Then it is verified: the cluster is healthy (cluster_state ok, every link up, every view the same), the
node -> role map equals the one recorded at the fresh start, DBSIZE is 0 on every node, no Redis process is
paused, no network rule is left, and Kafka lists the topics a fresh start lists.  If any step fails or any
check does not hold, the topology is stopped and the next seed gets a fresh one; the reason is recorded in
that seed's summary.json (``topology_reuse.fresh_because``).  A seed never runs on an unverified leftover.

Each seed's run directory still holds every node's log: the part of a kept node's log written during the
seed is copied to ``<run>/logs/<node>.log`` before the reset (the reset's own lines belong to no seed).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from harness.topology import BrokerConfig, LocalTopology
from harness.topology_config import TopologyConfig

RESET_TIMEOUT_S = 60.0


class ResetError(RuntimeError):
    """The kept topology could not be brought back to a fresh start's state; the message says what held."""


def cluster_layout(topology: LocalTopology) -> dict[str, tuple]:
    """node name -> ("master", slot ranges) or ("replica", master's name), as the cluster sees itself now."""
    view = topology.redis._any_view()
    names = {entry.node_id: topology.redis.by_id(entry.node_id).name for entry in view}
    return {names[e.node_id]: ("master", e.slots) if e.is_master else ("replica", names.get(e.master_id, e.master_id))
            for e in view}


def _list_topics(bootstrap: str) -> list[str]:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def listing() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        await admin.start()
        try:
            return sorted(await admin.list_topics())
        finally:
            await admin.close()

    return asyncio.run(listing())


class TopologyKeeper:
    """Hands out a started local topology per seed (``acquire``) and takes it back (``release``).  Only the
    local provider is kept; ``acquire`` returns None for any other (the caller starts its own)."""

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)
        self.topology: LocalTopology | None = None
        self.config: TopologyConfig | None = None
        self.layout: dict[str, tuple] = {}
        self.topics: list[str] = []
        self.broker_addresses: list[tuple[str, int]] = []
        self.fresh_starts = 0
        self.seeds_on_current = 0
        self.fallbacks: list[str] = []  # why a kept topology was given up (one entry per fresh start it caused)
        self._fresh_because = "the first seed"
        self._offsets: dict[str, int] = {}
        self.steps: dict[str, float] = {}  # the last reset's steps, seconds each
        self.info: dict[str, Any] = {}  # the last acquire: kept or fresh (and why), for the seed's summary.json

    # -- per seed --------------------------------------------------------------------------------------
    def acquire(self, config: TopologyConfig, run_dir: Path, broker_config: BrokerConfig) -> LocalTopology | None:
        if config.provider != "local":
            return None
        if self.topology is not None and config != self.config:
            self._discard("the scenario's [topology] differs from the kept topology's")
        info: dict[str, Any]
        if self.topology is None:
            self._start_fresh(config)
            info = {"kept": False, "fresh_because": self._fresh_because}
        else:
            info = {"kept": True, "seed_on_topology": self.seeds_on_current + 1}
        topology = self.topology
        assert topology is not None
        self.seeds_on_current += 1
        self._offsets = {n.name: _size(n.log_path) for n in topology.nodes()}
        topology.broker_config = broker_config
        began = time.monotonic()
        try:
            topology.start_brokers(run_dir, self.broker_addresses or None)
        except BaseException:
            self._discard("a broker node did not start on the kept topology")
            raise
        self.broker_addresses = [(b.host, b.port) for b in topology.brokers]
        topology.timings["brokers_ready_s"] = round(time.monotonic() - began, 3)
        self.info = {**info, "home": str(topology.run_dir), "fresh_starts": self.fresh_starts,
                     "fallbacks": len(self.fallbacks)}
        return topology

    def release(self, run_dir: Path) -> dict[str, Any]:
        """After a seed: stop its brokers, copy its part of the kept nodes' logs into ``run_dir/logs``, reset
        and verify.  Returns {"reset_s", "verified", "problem"}; never raises for a failed reset (the
        topology is then discarded and the next seed gets a fresh one)."""
        topology = self.topology
        if topology is None:
            return {"reset_s": 0.0, "verified": False, "problem": "no kept topology"}
        problem = ""
        try:
            topology.stop_brokers()
        except Exception as error:  # noqa: BLE001 - a broker that would not stop: start fresh next time
            problem = f"stopping the brokers: {error}"
        self._copy_log_slices(topology, Path(run_dir))
        began = time.monotonic()
        if not problem:
            try:
                self.reset()
                self.verify()
            except Exception as error:  # noqa: BLE001 - any doubt: the next seed gets a fresh topology
                problem = f"{type(error).__name__}: {error}"
        reset_s = round(time.monotonic() - began, 3)
        if problem:
            self._discard(f"the reset after seed {self.seeds_on_current} on this topology failed: {problem}")
        return {"reset_s": reset_s, "verified": not problem, "problem": problem, "steps_s": dict(self.steps)}

    def log_files(self, run_dir: Path) -> list[tuple[str, str, Path]]:
        """(name, role, log path in ``run_dir``) of every node the seed ran on (kept nodes: their copied slice)."""
        topology = self.topology
        if topology is None:
            return []
        return [(n.name, n.role, n.log_path if n in topology.brokers else Path(run_dir) / "logs" / f"{n.name}.log")
                for n in topology.nodes()]

    def close(self) -> None:
        if self.topology is not None:
            topology, self.topology = self.topology, None
            topology.stop()

    # -- reset and verification ----------------------------------------------------------------------
    def reset(self) -> None:
        from faults.network import heal_all_network
        from faults.probes import is_stopped

        topology = self.topology
        assert topology is not None and self.config is not None
        deadline = time.monotonic() + RESET_TIMEOUT_S
        self.steps = {}
        mark = self._step("", time.monotonic())
        # Kafka first, in its own thread: its restart (a new S3 server, Tansu) overlaps the Redis steps.
        kafka = _Background(lambda: self._restart_kafka(deadline))
        heal_all_network()
        for node in topology.redis_nodes:  # like the nemesis' heal_all: nothing may stay paused or dead
            if node.is_alive() and (node.paused or is_stopped(node.pid)):
                node.resume()
            elif not node.is_alive():
                node.start()
        for node in topology.redis_nodes:
            node.wait_ready(self._left(deadline))
            node.command("CLIENT", "UNPAUSE")
        topology.redis.wait_ready(self._left(deadline))
        mark = self._step("redis healed", mark)
        self._restore_layout(deadline)
        mark = self._step("roles restored", mark)
        for node in topology.redis_nodes:
            if node.is_master():
                node.command("FLUSHALL")
        for node in topology.redis_nodes:
            node.command("SCRIPT", "FLUSH")
        self._wait(deadline, "every Redis node to hold no key (DBSIZE 0; replicas apply the FLUSHALL)",
                   lambda: all(n.command("DBSIZE") == 0 for n in topology.redis_nodes))
        for node in topology.redis_nodes:
            node.command("BGREWRITEAOF")  # a later kill replays an empty AOF, not every earlier seed's writes
        self._wait(deadline, "every AOF rewrite to finish",
                   lambda: all(int(n.info("persistence").get("aof_rewrite_in_progress", 0)) == 0
                               and int(n.info("persistence").get("aof_rewrite_scheduled", 0)) == 0
                               for n in topology.redis_nodes))
        mark = self._step("flushed", mark)
        kafka.join(self._left(deadline))
        self._step("kafka restarted (waited for)", mark)

    def _step(self, name: str, mark: float) -> float:
        now = time.monotonic()
        if name:
            self.steps[name] = round(now - mark, 3)
        return now

    def verify(self) -> None:
        """Raise ResetError naming what differs from a fresh start."""
        from faults.network import heal_all_network
        from faults.probes import is_stopped

        topology = self.topology
        assert topology is not None
        began = time.monotonic()
        problems = []
        health = topology.redis.health()
        if not health.ok:
            problems.append("Redis Cluster not healthy: " + "; ".join(health.problems))
        layout = cluster_layout(topology)
        if layout != self.layout:
            moved = sorted(name for name in self.layout if layout.get(name) != self.layout[name])
            problems.append(f"node -> role map differs from the fresh start's at {', '.join(moved)}: "
                            f"now {[(name, layout.get(name)) for name in moved]}")
        keys = {n.name: n.command("DBSIZE") for n in topology.redis_nodes}
        if any(keys.values()):
            problems.append(f"keys left: {keys}")
        paused = [n.name for n in topology.redis_nodes if n.paused or is_stopped(n.pid)]
        if paused:
            problems.append(f"paused: {paused}")
        left = heal_all_network()  # the reset removed every rule already: anything found now is a leftover
        if left:
            problems.append(f"network rules were still in place: {left}")
        if topology.kafka is not None:
            topics = _list_topics(topology.kafka_bootstrap())
            if topics != self.topics:
                problems.append(f"Kafka topics {topics}, a fresh start has {self.topics}")
        if problems:
            raise ResetError("; ".join(problems))
        self.steps["verified"] = round(time.monotonic() - began, 3)

    def _restore_layout(self, deadline: float) -> None:
        """Fail back every original master that is a replica now, then re-point any replica that follows
        another master than at the fresh start."""
        topology = self.topology
        assert topology is not None
        for name, (role, _) in self.layout.items():
            if role == "master" and cluster_layout(topology)[name][0] != "master":
                node = topology.node(name)
                node.command("CLUSTER", "FAILOVER")
                # Why wait per node: a second failover while the first one's epochs settle is refused
                self._wait(deadline, f"{name} to be master again (CLUSTER FAILOVER)",
                           lambda n=node: n.is_master())
                topology.redis.wait_ready(self._left(deadline))
        for name, (role, master) in self.layout.items():
            if role == "replica" and cluster_layout(topology)[name] != (role, master):
                replica, original = topology.node(name), topology.node(master)
                replica.command("CLUSTER", "REPLICATE", original.node_id)
        self._wait(deadline, "the node -> role map of the fresh start",
                   lambda: cluster_layout(topology) == self.layout)
        topology.redis.wait_ready(self._left(deadline))

    def _restart_kafka(self, deadline: float) -> None:
        """Kill Tansu and its S3 server, empty a disk-backed store, start both: an empty Kafka."""
        topology = self.topology
        assert topology is not None
        for node in (topology.kafka, topology.storage):
            if node is not None:
                node.kill()
        if topology.storage is not None and self.config.storage_kind() == "s3rver":
            shutil.rmtree(topology.storage.data_dir, ignore_errors=True)
        for node in (topology.storage, topology.kafka):
            if node is not None:
                node.start()
                node.wait_ready(self._left(deadline))

    # -- helpers ---------------------------------------------------------------------------------------
    def _start_fresh(self, config: TopologyConfig) -> None:
        self.fresh_starts += 1
        home = self.home / f"topology-{self.fresh_starts}"
        topology = LocalTopology(config, home)
        topology.start(with_brokers=False)
        try:
            self.topology, self.config = topology, config
            self.layout = cluster_layout(topology)
            self.topics = _list_topics(topology.kafka_bootstrap()) if topology.kafka is not None else []
        except BaseException:
            self.topology = None
            topology.stop()
            raise
        self.seeds_on_current = 0
        self.broker_addresses = []

    def _discard(self, reason: str) -> None:
        self.fallbacks.append(reason)
        self._fresh_because = reason
        topology, self.topology = self.topology, None
        if topology is not None:
            try:
                topology.stop()
            except Exception:  # noqa: BLE001 - a node that would not stop is killed by its process group
                pass

    def _copy_log_slices(self, topology: LocalTopology, run_dir: Path) -> None:
        logs = run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for node in topology.nodes():
            if node in topology.brokers:
                continue
            try:
                with open(node.log_path, "rb") as source, open(logs / f"{node.name}.log", "wb") as target:
                    source.seek(self._offsets.get(node.name, 0))
                    shutil.copyfileobj(source, target)
            except OSError:
                continue  # the log table then records the node's log as unreadable (the checker: unknown)

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ResetError(f"the reset took longer than {RESET_TIMEOUT_S:.0f} s")
        return left

    def _wait(self, deadline: float, what: str, condition) -> None:
        while not condition():
            if time.monotonic() > deadline:
                raise ResetError(f"timed out waiting for {what}")
            time.sleep(0.05)


class _Background:
    """A step in a thread of its own; ``join`` re-raises what it raised."""

    def __init__(self, action) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(action,), name="keeper-step", daemon=True)
        self._thread.start()

    def _run(self, action) -> None:
        try:
            action()
        except BaseException as error:  # noqa: BLE001 - handed to join()
            self._error = error

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise ResetError(f"the Kafka restart did not finish within {timeout:.0f} s")
        if self._error is not None:
            raise self._error


def _size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
