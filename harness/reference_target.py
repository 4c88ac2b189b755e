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
        self.topology: ServiceTopology | None = None if self.keeper else topology_class(
            self.config, self.run_dir, broker_config=self._write_broker_config)
        self.link_proxy = None  # harness/toxiproxy: the proxy a plan's link faults need (route_links)

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

    def route_links(self, plan: Plan) -> list[str]:
        """Route the links the plan's link faults sit on (faults/latency.py) through the harness' toxiproxy;
        nothing when it has none.  The topology then carries ``link_proxies`` and the clients connect to the
        proxies (``endpoints``)."""
        from faults.latency import CLIENT_BROKER, LINK_ATTRIBUTE, proxied_links
        from harness.toxiproxy import route_client_links, running_toxiproxy

        links = proxied_links(plan.faults)
        if not links:
            return []
        unrouted = sorted(links - {CLIENT_BROKER})
        if unrouted:
            raise RuntimeError(f"link(s) {', '.join(unrouted)} cannot be routed through the proxy; "
                               f"routed: {CLIENT_BROKER}")
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.link_proxy = running_toxiproxy(log_path=self.run_dir / "logs" / "toxiproxy.log")
        proxy = self.link_proxy.__enter__()
        routed = route_client_links(proxy.api, list(self.topology.brokers), self.topology.addresses)
        setattr(self.topology, LINK_ATTRIBUTE, routed)
        return [f"link {CLIENT_BROKER} routed through the harness' toxiproxy (API {proxy.api}, pid {proxy.pid})"]

    def _stop_link_proxy(self) -> None:
        from faults.latency import LINK_ATTRIBUTE

        if self.link_proxy is not None:
            proxy, self.link_proxy = self.link_proxy, None
            proxy.__exit__(None, None, None)
        if self.topology is not None and getattr(self.topology, LINK_ATTRIBUTE, None) is not None:
            setattr(self.topology, LINK_ATTRIBUTE, None)  # a kept topology goes to the next seed unrouted

    def stop(self) -> None:
        self._stop_link_proxy()
        if self.topology is None:
            return
        names = [n.name for n in self.topology.nodes()]
        if self.keeper is not None:
            # The seed is over for every node: recorded before the reset, which belongs to no seed.
            for name in names:
                self.recorder.record(Kind.NODE_EVENT, node=name, detail={"action": "stop", "kept": True})
            released = self.keeper.release(self.run_dir)
            self.reset_s = released["reset_s"]
            self.reuse = {**(self.reuse or {}), "released": released}
            return
        self.topology.stop()
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
        if self.reuse is not None:
            described["reuse"] = self.reuse
        return described
