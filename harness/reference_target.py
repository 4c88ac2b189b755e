"""The reference target: the reference broker's nodes on a topology of either provider (Redis Cluster,
Tansu, reference-broker nodes).  White box: ``snapshot()`` reads each session's Redis state after the drain,
and the drain may read the Kafka backlog.  It records a ``node_event`` row for every node it starts and stops.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from contracts.credentials import PROBE_CLIENT_ID
from contracts.history_schema import Kind
from contracts.scenario import Scenario
from contracts.topology import Endpoint, ServiceTopology
from harness.death_watch import PROBE_TIMEOUT_S, ProbeAnswer
from harness.history import HistoryRecorder
from harness.topology_config import TopologyConfig
from properties.plan import Plan


class TopologyLender(Protocol):
    """A kept topology lent for one seed (harness/local/keeper.py TopologyKeeper)."""

    info: dict[str, Any]

    def acquire(self, config: TopologyConfig, run_dir: Path, broker_config: Any) -> ServiceTopology: ...
    def release(self, run_dir: Path) -> dict[str, Any]: ...
    def log_files(self, run_dir: Path) -> list[tuple[str, str, Path]]: ...


class ReferenceTarget:
    """The reference broker on a topology of either provider; white box (Redis snapshots after the drain).
    ``topology_class`` is the provider's topology (harness/providers.py chooses it)."""

    white_box = True
    heal_ready_timeout_s = None  # the heal waits as long as the fault context says

    def __init__(self, scenario: Scenario, run_dir: Path, recorder: HistoryRecorder, config: TopologyConfig,
                 topology_class: Callable[..., ServiceTopology], keeper: TopologyLender | None = None):
        self.scenario = scenario
        self.run_dir = Path(run_dir).resolve()
        self.recorder = recorder
        self.config = config
        # keeper (harness/local/keeper.py): Redis and Kafka kept between seeds, reset and verified; only the
        # local provider.  The topology is then the keeper's, handed out at start().
        self.keeper = keeper if keeper is not None and self.config.provider == "local" else None
        self.reuse: dict[str, Any] | None = None  # what the keeper did (summary.json "topology_reuse")
        self.reset_s: float | None = None
        self.topology_class = topology_class  # prepare_clocks: a fresh topology instead of a kept one
        self.topology: ServiceTopology | None = None if self.keeper else topology_class(
            self.config, self.run_dir, broker_config=self._write_broker_config)
        self.link_proxy = None  # harness/toxiproxy: the proxy a plan's link faults need (prepare_links, route_links)
        self.link_proxy_process = None

    def _write_broker_config(self, topology: ServiceTopology) -> Path:
        path = self.run_dir / "broker-config.json"
        path.write_text(json.dumps({
            "redis_startup_nodes": [f"{h}:{p}" for h, p in topology.redis_startup_nodes()],
            "kafka_bootstrap": topology.kafka_bootstrap(),
            "broker": dict(self.scenario.broker),
        }, indent=2, sort_keys=True))
        return path

    def prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        if self.keeper is not None:
            self.topology = self.keeper.acquire(self.config, self.run_dir, self._write_broker_config)
            self.reuse = dict(self.keeper.info)
        else:
            self.topology.start()
        for node in self.topology.nodes():
            self.recorder.record(Kind.NODE_EVENT, node=node.name,
                                 detail={"action": "ready", "role": node.role, "pid": node.pid,
                                         "address": node.address})

    def prepare_clocks(self, plan: Plan) -> list[str]:
        """Before the nodes start: the roles the plan's clock faults may hit (faults/clock.py) start under
        libfaketime, each node reading its offset from <run_dir>/clock/<node> (faults/libfaketime.py).  A kept
        topology's Redis started without it, so such a seed runs on a fresh topology.  Nothing when the plan
        has no clock fault."""
        from faults.clock import planned_clock_roles
        from faults.libfaketime import (
            CLOCK_DIR,
            ClockError,
            ClockSetup,
            libfaketime_problem,
            redis_binary_problem,
        )
        from harness import binaries

        roles = planned_clock_roles(plan.faults)
        if not roles:
            return []
        problem = libfaketime_problem()
        if self.config.provider != "local":
            problem = (f"clock faults preload libfaketime into host processes; the {self.config.provider} provider's "
                       "nodes are containers")
        elif "redis" in roles:
            problem = problem or redis_binary_problem(binaries.redis_server(self.config.redis_server))
        if problem:
            raise ClockError(problem)
        notes = []
        if self.keeper is not None:
            self.keeper = None
            self.topology = self.topology_class(self.config, self.run_dir, broker_config=self._write_broker_config)
            notes.append("clock faults: a fresh topology for this seed (the kept one's nodes run without libfaketime)")
        self.topology.clocks = ClockSetup(self.run_dir / CLOCK_DIR, frozenset(roles))
        return notes + [f"clock faults: the {' and '.join(sorted(roles))} nodes run under libfaketime (offset files in "
                        f"{CLOCK_DIR}/)"]

    def prepare_disks(self, plan: Plan) -> list[str]:
        """Before the nodes start: put every Redis node's data dir on a size-limited tmpfs (harness/disk.py) when
        the plan holds a disk_full fault (faults/disk.py); its target is only resolved once the cluster formed,
        so each Redis node gets one.  Nothing when the plan has none."""
        from faults.disk import disk_full_size_bytes

        size = disk_full_size_bytes(plan.faults)
        if size is None:
            return []
        notes = []
        if self.keeper is not None:  # its Redis started before this plan, on the host's file system
            self.keeper = None
            self.reuse = {"kept": False, "fresh_because": "disk_full needs size-limited Redis data directories"}
            self.topology = self.topology_class(self.config, self.run_dir, broker_config=self._write_broker_config)
            notes.append("disk_full: this seed runs on a fresh topology, not the kept one")
        if not hasattr(self.topology, "disk_limits"):
            raise RuntimeError("disk_full faults need the Redis nodes' data directories on a size-limited file "
                               f"system from their start; the {self.config.provider} provider's topology has none")
        self.topology.disk_limits = {"redis": size}
        return notes + [f"disk_full: every Redis node's data directory is a {size >> 20} MiB tmpfs in the run's "
                        "mount namespace (harness/disk.py)"]

    def prepare_power(self, plan: Plan) -> list[str]:
        """Before the nodes start: put every Redis node's data dir on its own lazyfs mount (harness/power.py) when
        the plan holds a power_loss fault (faults/power.py); its target is only resolved once the cluster formed,
        so each Redis node gets one.  A kept topology's Redis runs on the host's file system, so such a seed runs
        on a fresh topology.  Nothing when the plan has none."""
        from harness.power import LAZYFS_DIR, planned_power_loss

        if not planned_power_loss(plan.faults):
            return []
        refusal = ("power_loss needs the node's data directory on the harness' lazyfs mount from the node's start; "
                   f"the {self.config.provider} provider's topology has none")
        if self.config.provider != "local":
            raise RuntimeError(refusal)
        notes = []
        if self.keeper is not None:  # its Redis started before this plan, on the host's file system
            self.keeper = None
            self.reuse = {"kept": False, "fresh_because": "power_loss needs lazyfs Redis data directories"}
            self.topology = self.topology_class(self.config, self.run_dir, broker_config=self._write_broker_config)
            notes.append("power_loss: this seed runs on a fresh topology, not the kept one")
        if not hasattr(self.topology, "power_roles"):
            raise RuntimeError(refusal)
        if getattr(self.topology, "disk_limits", None):
            raise RuntimeError("power_loss and disk_full in one plan: both need the Redis data directories (a lazyfs "
                               "mount, a size-limited tmpfs); split them into two scenarios")
        self.topology.power_roles = ("redis",)
        return notes + [f"power_loss: every Redis node's data directory is a lazyfs mount (backing dirs in "
                        f"{LAZYFS_DIR}/, unsynced file data held until fsync: harness/lazyfs/)"]

    def prepare_links(self, plan: Plan) -> list[str]:
        """Before the nodes start: the broker -> Kafka and broker -> Redis links the plan's link faults sit on
        (faults/latency.py) get the harness' toxiproxy, and the topology a router (harness/toxiproxy/routing.py)
        that makes each such node's proxy as the node is created: Tansu advertises its proxy, every Redis node
        announces its own.  A kept topology's nodes started unproxied, so such a seed runs on a fresh topology.
        Nothing when the plan has none.  A kill / pause of Kafka ``at_commit`` (faults/commit_hold.py) holds the
        commit on the broker -> Kafka link's proxy: it routes that link too."""
        from faults.commit_hold import at_commit_links
        from faults.latency import LINK_ATTRIBUTE, PREPARED_LINKS, proxied_links
        from harness.toxiproxy import LinkRouter

        links = sorted((proxied_links(plan.faults) | at_commit_links(plan.faults)) & set(PREPARED_LINKS))
        if not links:
            return []
        refusal = (f"link faults on {', '.join(links)} need Tansu advertising / the Redis nodes announcing a proxy "
                   f"of the harness from their start; the {self.config.provider} provider's topology has none")
        if self.config.provider != "local":
            raise RuntimeError(refusal)
        notes = []
        if self.keeper is not None:  # its Redis and Kafka started before this plan, unproxied
            self.keeper = None
            self.reuse = {"kept": False, "fresh_because": f"link faults on {', '.join(links)} need proxied nodes"}
            self.topology = self.topology_class(self.config, self.run_dir, broker_config=self._write_broker_config)
            notes.append(f"link faults on {', '.join(links)}: this seed runs on a fresh topology, not the kept one")
        if not hasattr(self.topology, "link_router"):
            raise RuntimeError(refusal)
        proxy = self._start_link_proxy()
        router = LinkRouter(proxy.api, set(links))
        self.topology.link_router = router
        setattr(self.topology, LINK_ATTRIBUTE, router.link_proxies)  # filled as the nodes are created
        what = {"broker-kafka": "Tansu advertises its proxy (the bootstrap address too: the harness' own Kafka "
                                "reads cross it)",
                "broker-redis": "every Redis node announces its proxy's port (the harness' own Redis reads cross "
                                "them)"}
        return notes + [f"link {link} routed through the harness' toxiproxy (API {proxy.api}, pid {proxy.pid}): "
                        f"{what[link]}" for link in links]

    def _start_link_proxy(self):
        """The run's toxiproxy process (harness/toxiproxy/), started once; its log: logs/toxiproxy.log."""
        from harness.toxiproxy import running_toxiproxy

        if self.link_proxy is None:
            (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
            context = running_toxiproxy(log_path=self.run_dir / "logs" / "toxiproxy.log")
            self.link_proxy_process = context.__enter__()
            self.link_proxy = context
        return self.link_proxy_process

    def route_links(self, plan: Plan) -> list[str]:
        """After the nodes started: route the client -> broker link when the plan's link faults sit on it
        (faults/latency.py) through the harness' toxiproxy; nothing when none does.  The topology then carries
        ``link_proxies`` and the clients connect to the proxies (``endpoints``)."""
        from faults.latency import CLIENT_BROKER, LINK_ATTRIBUTE, proxied_links
        from harness.toxiproxy import route_client_links

        if CLIENT_BROKER not in proxied_links(plan.faults):
            return []
        proxy = self._start_link_proxy()
        routed = route_client_links(proxy.api, list(self.topology.brokers), self.topology.addresses)
        prepared = getattr(self.topology, LINK_ATTRIBUTE, None)
        if prepared:  # prepare_links' routes, on the same proxy process
            prepared["links"].update(routed["links"])
        else:
            setattr(self.topology, LINK_ATTRIBUTE, routed)
        return [f"link {CLIENT_BROKER} routed through the harness' toxiproxy (API {proxy.api}, pid {proxy.pid})"]

    def _stop_link_proxy(self) -> None:
        from faults.latency import LINK_ATTRIBUTE

        if self.link_proxy is not None:
            proxy, self.link_proxy, self.link_proxy_process = self.link_proxy, None, None
            proxy.__exit__(None, None, None)
        if self.topology is not None and getattr(self.topology, LINK_ATTRIBUTE, None) is not None:
            setattr(self.topology, LINK_ATTRIBUTE, None)  # a kept topology goes to the next seed unrouted

    def stop(self) -> None:
        if self.topology is None:
            self._stop_link_proxy()
            return
        names = [n.name for n in self.topology.nodes()]
        if self.keeper is not None:
            self._stop_link_proxy()
            # The seed is over for every node: recorded before the reset, which belongs to no seed.
            for name in names:
                self.recorder.record(Kind.NODE_EVENT, node=name, detail={"action": "stop", "kept": True})
            released = self.keeper.release(self.run_dir)
            self.reset_s = released["reset_s"]
            self.reuse = {**(self.reuse or {}), "released": released}
            return
        try:
            self.topology.stop()
        finally:  # after the nodes: a broker node stopping still reaches Redis and Kafka through their proxies
            self._stop_link_proxy()
        for name in names:
            self.recorder.record(Kind.NODE_EVENT, node=name, detail={"action": "stop"})

    def log_files(self) -> list[tuple[str, str, Path]] | None:
        """With a kept topology: where each node's log for this seed will be (harness/local/keeper.py)."""
        return self.keeper.log_files(self.run_dir) if self.keeper is not None else None

    def kill(self) -> None:
        self.stop()

    def answers(self, node: Any) -> ProbeAnswer:
        """The run's health probe of a broker node (harness/death_watch.py): an MQTT 3.1.1 CONNECT gets a
        CONNACK 0.  Not its start-up ready check (the port accepts and the log says ready), which a node
        stopped with SIGSTOP still passes: the kernel accepts its TCP connections."""
        from harness.mqtt_probe import mqtt_connect

        result = mqtt_connect(node.host, node.port, level=4, timeout_s=PROBE_TIMEOUT_S,
                              client_id=f"{PROBE_CLIENT_ID}-{node.name}")  # one id per node: no takeover between them
        return ProbeAnswer(f"MQTT CONNECT {node.host}:{node.port}", None if result.ok else result.detail)

    def endpoints(self) -> list[Endpoint]:
        """Where the clients connect: each broker node, or its proxy when route_links routed the link."""
        from faults.latency import LINK_ATTRIBUTE
        from harness.toxiproxy import proxied_endpoints

        return proxied_endpoints([(b.host, b.port, b.name) for b in self.topology.brokers],
                                 getattr(self.topology, LINK_ATTRIBUTE, None))

    def client_bind_address(self) -> str:
        """With distinct node addresses (private netns) the clients own 127.0.0.1 (harness/addresses.py)."""
        own = self.topology.client_bind_address  # containers: the run network's gateway
        if own:
            return own
        return "127.0.0.1" if self.topology.addresses.mode == "distinct" else ""

    @property
    def key_prefix(self) -> str:
        return str(self.scenario.broker.get("key_prefix", ""))

    def _key_prefix(self) -> str:
        return self.key_prefix

    def apply_presets(self, plan: Plan) -> list[str]:
        from harness.snapshot import preset_last_packet_ids

        presets = {c.client_id: c.preset_last_packet_id for c in plan.clients if c.preset_last_packet_id}
        if presets:
            preset_last_packet_ids(self.topology.redis_startup_nodes(), self._key_prefix(), presets)
        return []

    def queue_size_probe(self):
        """``probe(client, why)`` recording the client's message-queue size (harness/snapshot.QueueSizeProbe)."""
        from harness.snapshot import QueueSizeProbe

        return QueueSizeProbe(self.topology.redis_startup_nodes(), self._key_prefix(), self.recorder)

    def snapshot(self, plan: Plan) -> int:
        from harness.snapshot import snapshot_sessions

        return snapshot_sessions(self.topology.redis_startup_nodes(), self._key_prefix(),
                                 [c.client_id for c in plan.subscribers()], self.recorder)

    def describe(self) -> dict[str, Any]:
        described = {"kind": "reference", **self.topology.endpoints()}
        if self.topology.link_proxies:
            described["link_proxies"] = self.topology.link_proxies
        if getattr(self.topology, "disk_holder", None) is not None:  # faults/disk.py: the size-limited data dirs
            described["disk_holder"] = self.topology.disk_holder.describe()
        if getattr(self.topology, "power_mounts", None) is not None:  # faults/power.py: the lazyfs data dirs
            described["lazyfs"] = self.topology.power_mounts.describe()
        if self.reuse is not None:
            described["reuse"] = self.reuse
        return described
