"""Keep one local topology (Redis Cluster, Tansu and its S3 server) between the seeds of one command
(``ordeal explore``), reset to the state of a fresh start and verified before every next seed.

A fresh topology per seed costs its start and stop every time (most of a run's overhead on a loaded
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
- the reference-broker nodes are stopped after the seed; each seed gets new ones (started in its run
  directory, or, with a spare, by the background reset once it was verified: see below).

Then it is verified: the cluster is healthy (cluster_state ok, every link up, every view the same), the
node -> role map equals the one recorded at the fresh start, DBSIZE is 0 on every node, no Redis process is
paused, no network rule is left, and Kafka lists the topics a fresh start lists.  If any step fails or any
check does not hold, the topology is stopped and the next seed gets a fresh one; the reason is recorded in
that seed's summary.json (``topology_reuse.fresh_because``).  A seed never runs on an unverified leftover.

Spares (``spares``, default 1): the reset of the topology a seed just used runs in the background while
the next seed runs on another kept topology (a second one is started once), so the reset costs the next
seed no wall time.  The two share nothing a reset touches: their own processes and addresses; the one
shared thing, the network namespace's fault rules, is removed and checked at the end of the seed, before
the next starts (never by a background reset).  A topology is handed out only after its reset was
verified; the seed that uses it records that verification (``topology_reuse.reset_verified``).  After
the verification that reset also starts the next seed's broker nodes with the last seed's config (the
same scenario; the seed compares its own config file and starts new ones if it differs), so they are
ready when the seed takes the topology; their log is copied into the seed's run directory like a kept
node's.  With
``spares=0`` the reset runs before the next seed, in line.

Each seed's run directory still holds every node's log: the part of a kept node's log written during the
seed is copied to ``<run>/logs/<node>.log`` before the reset (the reset's own lines belong to no seed).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from harness.local.host_topology import LocalTopology
from harness.topology_base import BrokerConfig
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


def clear_network_rules() -> None:
    """Remove every network fault rule of this namespace and check none is left (they are shared by every
    topology in it: called only between seeds, never beside a running one)."""
    from faults.network import heal_all_network

    heal_all_network()
    left = heal_all_network()  # the first call removed every rule: anything found now came back
    if left:
        raise ResetError(f"network rules were still in place after removing them: {left}")


class KeptTopology:
    """One started topology (Redis Cluster, Kafka; no brokers between seeds) with what a fresh start looked
    like (role map, topic list), and its reset and verification."""

    def __init__(self, topology: LocalTopology, config: TopologyConfig, name: str) -> None:
        self.topology, self.config, self.name = topology, config, name
        self.layout = cluster_layout(topology)
        self.topics = _list_topics(topology.kafka_bootstrap()) if topology.kafka is not None else []
        self.broker_addresses: list[tuple[str, int]] = []
        self.seeds = 0
        self.offsets: dict[str, int] = {}
        self.steps: dict[str, float] = {}  # the last reset's steps, seconds each
        self.reset_s = 0.0
        self.broker_config_text: str | None = None  # the last seed's broker config (the next one's, prestarted)
        self.prestarted = False  # the broker nodes running now were started by the reset, for the next seed
        self.own_broker_logs = False  # this seed's broker logs are the prestarted ones (copied at release)

    def reset(self, prestart: bool = False) -> None:
        """Back to a fresh start's state, verified (ResetError says what differs).  prestart: then start
        the next seed's broker nodes (a spare's reset, in the background)."""
        from faults.probes import is_stopped

        topology = self.topology
        deadline = time.monotonic() + RESET_TIMEOUT_S
        began = time.monotonic()
        self.steps = {}
        mark = self._step("", time.monotonic())
        # Kafka in its own thread: its restart (a new S3 server, Tansu) overlaps the Redis steps.
        kafka = _Background(lambda: self._restart_kafka(deadline))
        for node in topology.redis_nodes:  # like the nemesis' heal_all: nothing may stay paused or dead
            if node.is_alive() and (node.paused or is_stopped(node.pid)):
                node.resume()
            elif not node.is_alive():
                node.start()
        for node in topology.redis_nodes:
            node.wait_ready(_left(deadline))
            node.command("CLIENT", "UNPAUSE")
        topology.redis.wait_ready(_left(deadline))
        mark = self._step("redis healed", mark)
        self._restore_layout(deadline)
        mark = self._step("roles restored", mark)
        for node in topology.redis_nodes:
            if node.is_master():
                node.command("FLUSHALL")
        for node in topology.redis_nodes:
            node.command("SCRIPT", "FLUSH")
        _wait(deadline, "every Redis node to hold no key (DBSIZE 0; replicas apply the FLUSHALL)",
              lambda: all(n.command("DBSIZE") == 0 for n in topology.redis_nodes))
        for node in topology.redis_nodes:
            node.command("BGREWRITEAOF")  # a later kill replays an empty AOF, not every earlier seed's writes
        _wait(deadline, "every AOF rewrite to finish",
              lambda: all(int(n.info("persistence").get("aof_rewrite_in_progress", 0)) == 0
                          and int(n.info("persistence").get("aof_rewrite_scheduled", 0)) == 0
                          for n in topology.redis_nodes))
        mark = self._step("flushed", mark)
        kafka.join(_left(deadline))
        mark = self._step("kafka restarted (waited for)", mark)
        self.verify()
        mark = self._step("verified", mark)
        if prestart:
            self.prestart_brokers(_left(deadline))
            self._step("brokers started for the next seed", mark)
        self.reset_s = round(time.monotonic() - began, 3)

    def prestart_brokers(self, timeout: float) -> None:
        """Start the next seed's broker nodes now, on the verified empty topology, with the last seed's config
        (the same scenario: the same file, compared again when the next seed takes them).  A fresh start
        starts them just the same before any client connects; only the idle time before the seed differs."""
        if self.broker_config_text is None or not self.config.broker_nodes:
            return
        home = self.topology.run_dir / "brokers"
        home.mkdir(parents=True, exist_ok=True)
        path = home / "broker-config.json"
        path.write_text(self.broker_config_text)
        self.topology.broker_config = path
        for index in range(1, self.config.broker_nodes + 1):
            self.offsets[f"broker-{index}"] = _size(home / "logs" / f"broker-{index}.log")
        self.topology.start_brokers(home, self.broker_addresses or None)
        self.prestarted = True

    def verify(self) -> None:
        """Raise ResetError naming what differs from a fresh start (the network rules are checked apart,
        by ``clear_network_rules``, between seeds)."""
        from faults.probes import is_stopped

        topology = self.topology
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
        if topology.kafka is not None:
            topics = _list_topics(topology.kafka_bootstrap())
            if topics != self.topics:
                problems.append(f"Kafka topics {topics}, a fresh start has {self.topics}")
        if topology.brokers:
            problems.append(f"broker nodes still running: {[b.name for b in topology.brokers]}")
        if problems:
            raise ResetError("; ".join(problems))

    def _restore_layout(self, deadline: float) -> None:
        """Fail back every original master that is a replica now, then re-point any replica that follows
        another master than at the fresh start."""
        topology = self.topology
        for name, (role, _) in self.layout.items():
            if role == "master" and cluster_layout(topology)[name][0] != "master":
                node = topology.node(name)
                node.command("CLUSTER", "FAILOVER")
                # Why wait per node: a second failover while the first one's epochs settle is refused
                _wait(deadline, f"{name} to be master again (CLUSTER FAILOVER)", lambda n=node: n.is_master())
                topology.redis.wait_ready(_left(deadline))
        for name, (role, master) in self.layout.items():
            if role == "replica" and cluster_layout(topology)[name] != (role, master):
                replica, original = topology.node(name), topology.node(master)
                replica.command("CLUSTER", "REPLICATE", original.node_id)
        _wait(deadline, "the node -> role map of the fresh start", lambda: cluster_layout(topology) == self.layout)
        topology.redis.wait_ready(_left(deadline))

    def _restart_kafka(self, deadline: float) -> None:
        """Kill Tansu and its S3 server, empty a disk-backed store, start both: an empty Kafka."""
        topology = self.topology
        for node in (topology.kafka, topology.storage):
            if node is not None:
                node.kill()
        if topology.storage is not None and self.config.storage_kind() == "s3rver":
            shutil.rmtree(topology.storage.data_dir, ignore_errors=True)
        for node in (topology.storage, topology.kafka):
            if node is not None:
                node.start()
                node.wait_ready(_left(deadline))

    def copy_log_slices(self, run_dir: Path, nodes: list) -> None:
        """This seed's part of each kept node's log (and of prestarted brokers' logs) into run_dir/logs."""
        logs = Path(run_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for node in nodes:
            if node.role == "broker" and not self.own_broker_logs:
                continue  # started in the run directory: its log is there already
            try:
                with open(node.log_path, "rb") as source, open(logs / f"{node.name}.log", "wb") as target:
                    source.seek(self.offsets.get(node.name, 0))
                    shutil.copyfileobj(source, target)
            except OSError:
                continue  # the log table then records the node's log as unreadable (the checker: unknown)

    def _step(self, name: str, mark: float) -> float:
        now = time.monotonic()
        if name:
            self.steps[name] = round(now - mark, 3)
        return now

    def stop(self) -> None:
        try:
            self.topology.stop()
        except Exception:  # noqa: BLE001 - a node that would not stop is killed by its process group
            pass


class TopologyKeeper:
    """Hands out a started local topology per seed (``acquire``) and takes it back (``release``).  Only the
    local provider is kept; ``acquire`` returns None for any other (the caller starts its own)."""

    def __init__(self, home: Path | str, spares: int = 1) -> None:
        self.home = Path(home)
        self.spares = spares
        self.current: KeptTopology | None = None  # lent to the running seed
        self.idle: list[KeptTopology] = []  # reset and verified, ready for a seed
        self.resetting: list[tuple[KeptTopology, _Background]] = []
        self.fresh_starts = 0
        self.fallbacks: list[str] = []  # why a kept topology was given up (one entry each)
        self.resets: list[float] = []  # seconds of every finished reset (in line or in the background)
        self._fresh_because = "the first seed"
        self.info: dict[str, Any] = {}  # the last acquire: kept or fresh (and why), for the seed's summary.json

    @property
    def topology(self) -> LocalTopology | None:
        return self.current.topology if self.current is not None else None

    # -- per seed --------------------------------------------------------------------------------------
    def acquire(self, config: TopologyConfig, run_dir: Path, broker_config: BrokerConfig) -> LocalTopology | None:
        if config.provider != "local":
            return None
        began = time.monotonic()
        kept = self._take(config)
        waited = round(time.monotonic() - began, 3)
        if kept is None:
            kept = self._start_fresh(config)
            info: dict[str, Any] = {"kept": False, "fresh_because": self._fresh_because}
        else:
            info = {"kept": True, "seed_on_topology": kept.seeds + 1, "reset_verified": True,
                    "reset_s": kept.reset_s, "reset_steps_s": dict(kept.steps), "waited_for_reset_s": waited}
        self.current = kept
        topology = kept.topology
        kept.seeds += 1
        kept.offsets.update({n.name: _size(n.log_path) for n in topology.nodes() if n.role != "broker"})
        mark = time.monotonic()
        try:
            topology.broker_config = broker_config
            config_path = topology._broker_config_path()  # the seed's own broker-config.json, in its run dir
            text = config_path.read_text()
            reuse = (kept.prestarted and text == kept.broker_config_text
                     and all(b.is_alive() and b.ready_check(b) for b in topology.brokers))
            kept.prestarted, kept.broker_config_text, kept.own_broker_logs = False, text, reuse
            if not reuse:
                topology.stop_brokers()
                topology.broker_config = config_path
                topology.start_brokers(run_dir, kept.broker_addresses or None)
        except BaseException:
            self.current = None
            self._discard(kept, "a broker node did not start on the kept topology")
            raise
        kept.broker_addresses = [(b.host, b.port) for b in topology.brokers]
        topology.timings["brokers_ready_s"] = round(time.monotonic() - mark, 3)
        info["brokers"] = "started by the reset before this seed" if reuse else "started for this seed"
        self.info = {**info, "topology": kept.name, "home": str(topology.run_dir), "fresh_starts": self.fresh_starts,
                     "fallbacks": len(self.fallbacks)}
        return topology

    def release(self, run_dir: Path) -> dict[str, Any]:
        """After a seed: stop its brokers, copy its part of the kept nodes' logs into ``run_dir/logs``, clear
        the network rules; then reset and verify (in line, or in the background with a spare).  Returns
        {"reset_s" (in line), "verified", "problem", "steps_s", "background"}; never raises for a failed
        reset (that topology is then given up; a later seed gets another or a fresh one)."""
        kept, self.current = self.current, None
        if kept is None:
            return {"reset_s": 0.0, "verified": False, "problem": "no kept topology", "steps_s": {},
                    "background": False}
        began = time.monotonic()
        problem = ""
        nodes = list(kept.topology.nodes())
        try:
            kept.topology.stop_brokers()
        except Exception as error:  # noqa: BLE001 - a broker that would not stop: give the topology up
            problem = f"stopping the brokers: {error}"
        kept.copy_log_slices(Path(run_dir), nodes)
        try:
            clear_network_rules()
        except Exception as error:  # noqa: BLE001
            problem = problem or f"{type(error).__name__}: {error}"
        if problem:
            self._discard(kept, f"after seed {kept.seeds} on {kept.name}: {problem}")
            return {"reset_s": round(time.monotonic() - began, 3), "verified": False, "problem": problem,
                    "steps_s": {}, "background": False}
        if self.spares > 0:
            self.resetting.append((kept, _Background(lambda: kept.reset(prestart=True))))
            return {"reset_s": round(time.monotonic() - began, 3), "verified": None, "problem": "",
                    "steps_s": {}, "background": True}
        try:
            kept.reset()
        except Exception as error:  # noqa: BLE001 - any doubt: the next seed gets a fresh topology
            problem = f"{type(error).__name__}: {error}"
            self._discard(kept, f"the reset after seed {kept.seeds} on {kept.name} failed: {problem}")
        else:
            self.resets.append(kept.reset_s)
            self.idle.append(kept)
        return {"reset_s": round(time.monotonic() - began, 3), "verified": not problem, "problem": problem,
                "steps_s": dict(kept.steps), "background": False}

    def log_files(self, run_dir: Path) -> list[tuple[str, str, Path]]:
        """(name, role, log path in ``run_dir``) of every node the seed ran on (kept nodes: their copied slice)."""
        if self.current is None:
            return []
        kept = self.current
        return [(n.name, n.role, n.log_path if n.role == "broker" and not kept.own_broker_logs
                 else Path(run_dir) / "logs" / f"{n.name}.log") for n in kept.topology.nodes()]

    def close(self) -> None:
        for kept, worker in self.resetting:
            worker.join(RESET_TIMEOUT_S + 10, quiet=True)
            kept.stop()
        for kept in self.idle + ([self.current] if self.current else []):
            kept.stop()
        self.resetting, self.idle, self.current = [], [], None

    # -- helpers ---------------------------------------------------------------------------------------
    def _take(self, config: TopologyConfig) -> KeptTopology | None:
        """A verified topology for ``config``: an idle one, else the one whose background reset ends first
        when no more may be started, else None (start a fresh one)."""
        self._collect(wait=False)
        for kept in list(self.idle):
            if kept.config != config:
                self.idle.remove(kept)
                self._discard(kept, "the scenario's [topology] differs from the kept topology's")
        if self.idle:
            return self.idle.pop(0)
        while self.resetting and len(self.resetting) + len(self.idle) >= 1 + self.spares:
            self._collect(wait=True)
            if self.idle:
                return self._take(config)
        return None

    def _collect(self, wait: bool) -> None:
        """Move finished background resets to idle (verified) or give their topology up (why recorded)."""
        for item in list(self.resetting):
            kept, worker = item
            if not wait and worker.running():
                continue
            self.resetting.remove(item)
            try:
                worker.join(RESET_TIMEOUT_S + 10)
            except Exception as error:  # noqa: BLE001 - its reset failed or hung: never lend it again
                self._discard(kept, f"the reset after seed {kept.seeds} on {kept.name} failed: "
                                    f"{type(error).__name__}: {error}")
                continue
            self.resets.append(kept.reset_s)
            self.idle.append(kept)
            if wait:
                return

    def _start_fresh(self, config: TopologyConfig) -> KeptTopology:
        self.fresh_starts += 1
        name = f"topology-{self.fresh_starts}"
        topology = LocalTopology(config, self.home / name)
        topology.start(with_brokers=False)
        try:
            return KeptTopology(topology, config, name)
        except BaseException:
            topology.stop()
            raise

    def _discard(self, kept: KeptTopology, reason: str) -> None:
        self.fallbacks.append(reason)
        self._fresh_because = reason
        kept.stop()


class _Background:
    """A step in a thread of its own; ``join`` re-raises what it raised."""

    def __init__(self, action) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(action,), name="keeper-reset", daemon=True)
        self._thread.start()

    def _run(self, action) -> None:
        try:
            action()
        except BaseException as error:  # noqa: BLE001 - handed to join()
            self._error = error

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float, quiet: bool = False) -> None:
        self._thread.join(timeout)
        if quiet:
            return
        if self._thread.is_alive():
            raise ResetError(f"did not finish within {timeout:.0f} s")
        if self._error is not None:
            raise self._error


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ResetError(f"the reset took longer than {RESET_TIMEOUT_S:.0f} s")
    return left


def _wait(deadline: float, what: str, condition) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise ResetError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
