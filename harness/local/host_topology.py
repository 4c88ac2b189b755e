"""The local provider's topology: Redis Cluster + Tansu (+ its S3 server) + reference-broker nodes, as
real processes under one run directory (data/<node>/, logs/<node>.log, topology.json).

    with LocalTopology(TopologyConfig(), run_dir) as topology:
        topology.redis_startup_nodes(); topology.kafka_bootstrap(); topology.endpoints()

Start-up is all or nothing: if any part fails, everything already started is stopped before the error
propagates.  Addresses: inside a private network namespace (harness/netns.py) every node gets its own
127.0.0.x; on the host network everything is on 127.0.0.1 with free ports (harness/addresses.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path

from harness import netns
from harness.addresses import AddressPlan
from harness.binaries import REPO_ROOT
from harness.local.redis_processes import RedisNode
from harness.local.tansu import TansuNode, storage_node
from harness.node import ProcessNode, port_accepts
from harness.running_redis_cluster import RedisCluster
from harness.topology_base import KAFKA_PORT, MQTT_PORT, REDIS_PORT, S3_PORT, BrokerConfig, TopologyBase
from harness.topology_config import TopologyConfig


def _broker_ready(node: ProcessNode) -> bool:
    """docs/architecture.md: the MQTT port accepts and the node's log says ready."""
    return port_accepts(node.host, node.port) and " ready" in node.log_since_start()


class LocalTopology(TopologyBase):
    """Redis Cluster, Tansu (+ its S3 server) and reference-broker nodes as host processes."""

    def __init__(self, config: TopologyConfig | None = None, run_dir: Path | str = "runs/up", *,
                 address_mode: str = "auto", broker_config: BrokerConfig = None) -> None:
        """address_mode: "distinct" (own 127.0.0.x per node), "loopback" (127.0.0.1, free ports), or
        "auto" (distinct inside a private network namespace, else loopback)."""
        super().__init__(config, run_dir, broker_config)
        if address_mode == "auto":
            address_mode = "distinct" if netns.in_private_netns() else "loopback"
        self.addresses = AddressPlan(address_mode)
        self.redis_nodes: list[RedisNode] = []
        self.kafka: TansuNode | None = None
        self.storage: ProcessNode | None = None
        self.brokers: list[ProcessNode] = []
        self.clocks = None  # faults/libfaketime.py ClockSetup: the roles that start under libfaketime (clock faults)
        # faults/disk.py disk_full: role -> bytes of the tmpfs each such node's data dir is on (set before start,
        # from the plan: ReferenceTarget.prepare_disks); the holder of their mount namespace (harness/disk.py).
        self.disk_limits: dict[str, int] = {}
        self.disk_holder = None
        # faults/power.py power_loss: the roles whose data dirs go on lazyfs (set before start, from the plan:
        # ReferenceTarget.prepare_power); the mounts (harness/power.py PowerMounts), kept until stop.
        self.power_roles: tuple[str, ...] = ()
        self.power_mounts = None
        # faults/latency.py broker-kafka / broker-redis: the proxies Tansu advertises and the Redis nodes announce
        # (harness/toxiproxy/routing.py LinkRouter; set before start, from the plan: ReferenceTarget.prepare_links).
        self.link_router = None

    def start(self, with_brokers: bool = True) -> None:
        """with_brokers=False: Redis and Kafka only; the broker nodes are started later with ``start_brokers``
        (harness/local/keeper.py keeps Redis and Kafka between seeds and starts each seed's brokers in its run dir)."""
        if self.started or self.nodes():
            raise RuntimeError("this LocalTopology was already started; make a new one for a new run")
        data = self.run_dir / "data"
        if data.is_dir() and any(data.iterdir()):
            raise RuntimeError(f"run directory {self.run_dir} already holds node data from an earlier run "
                               "(data/); choose a new run directory")
        started = time.monotonic()
        found = self.config.resolve_binaries()  # before anything runs: a missing binary starts nothing
        try:
            self._start_redis(found["redis"])
            if self.config.kafka_storage != "none":
                self._start_kafka(found)
            # Redis readiness is awaited after Kafka started, so both come up in parallel
            self.redis.wait_ready(self.config.ready_timeout_s)
            if self.power_mounts is not None:  # the formed cluster's state counts as on disk (harness/power.py)
                self.power_mounts.settle()
            self.timings["redis_ready_s"] = round(time.monotonic() - started, 3)
            if self.config.broker_nodes and with_brokers:
                self.start_brokers()
        except BaseException:
            self.stop()
            raise
        self.started = True
        self.timings["ready_s"] = round(time.monotonic() - started, 3)
        self.write_description()

    def _start_redis(self, binary: Path) -> None:
        began = time.monotonic()
        for _ in range(self.config.redis_nodes):
            host, port = self.addresses.allocate(REDIS_PORT, with_bus=True)
            name = f"redis-{host.rsplit('.', 1)[1] if self.addresses.mode == 'distinct' else port}"
            proxy = self.link_router.listen_for("broker-redis", name, host, port) if self.link_router else None
            self.redis_nodes.append(RedisNode(
                name, host, port,
                binary, run_dir=self.run_dir, appendfsync=self.config.redis_appendfsync,
                node_timeout_ms=self.config.redis_node_timeout_ms, env=self._clock_env(name, "redis"),
                announce_port=proxy[1] if proxy else None))
        self._limit_disks("redis", self.redis_nodes)
        if "redis" in self.power_roles:  # lazyfs data dirs from the first start (harness/power.py)
            from harness.power import PowerMounts

            self.power_mounts = PowerMounts.start(self.redis_nodes, self.run_dir)
        self.redis = RedisCluster(self.redis_nodes, self.config.redis_masters,
                                  self.config.redis_replicas_per_master)
        self.redis.start_processes()
        self.redis.create(timeout=self.config.ready_timeout_s)
        self.timings["redis_formed_s"] = round(time.monotonic() - began, 3)

    def _power_storage(self, kind: str) -> None:
        """A plan with power_loss (power_roles set): s3rver keeps the bucket on disk in its data dir, so that dir
        goes on lazyfs too (a power loss of ``storage`` can then drop what s3rver did not fsync).  moto keeps the
        bucket in memory: a power loss of it is a kill that loses the log, refused on load (LOG_LOSING_KINDS)."""
        if not self.power_roles or kind != "s3rver":
            return
        from harness.power import PowerMounts

        if self.power_mounts is None:
            self.power_mounts = PowerMounts.start([self.storage], self.run_dir)
        else:
            self.power_mounts.extend([self.storage], self.run_dir)

    def _limit_disks(self, role: str, nodes: list[ProcessNode]) -> None:
        """Put the nodes' data dirs on tmpfs of ``disk_limits[role]`` bytes in the run's disk holder."""
        size = self.disk_limits.get(role)
        if not size or not nodes:
            return
        if role in getattr(self, "power_roles", ()):  # both would own the same data dirs
            raise RuntimeError(f"a plan with both disk_full and power_loss faults on {role} nodes: disk_full puts "
                               "their data directories on a size-limited tmpfs in its own mount namespace, "
                               "power_loss on lazyfs on the host, and a node can write to one of them only")
        from harness.disk import DiskHolder

        self.disk_holder = DiskHolder.start({node.data_dir: size for node in nodes},
                                            self.run_dir / "logs" / "disk-holder.log")
        for node in nodes:
            node.disk = self.disk_holder

    def _start_kafka(self, found: Mapping[str, Path]) -> None:
        began = time.monotonic()
        kind = self.config.storage_kind()
        if kind:
            host, port = self.addresses.allocate(S3_PORT)
            self.storage = storage_node(kind, found[kind], host, port, self.run_dir)
            self._power_storage(kind)
            self.storage.start()
            self.storage.wait_ready(self.config.ready_timeout_s)
        host, port = self.addresses.allocate(KAFKA_PORT)
        proxy = self.link_router.listen_for("broker-kafka", "kafka", host, port) if self.link_router else None
        self.kafka = TansuNode(found["tansu"], host, port, self.run_dir, self.storage, kind, advertised=proxy)
        self.kafka.start()
        self.kafka.wait_ready(self.config.ready_timeout_s)
        self.timings["kafka_ready_s"] = round(time.monotonic() - began, 3)

    def start_brokers(self, run_dir: Path | None = None, addresses: list[tuple[str, int]] | None = None) -> None:
        """Start the broker nodes (logs and data under ``run_dir``, default the topology's; on ``addresses``,
        default newly allocated ones).  Stop them with ``stop_brokers``."""
        began = time.monotonic()
        run_dir = Path(run_dir or self.run_dir)
        config_path = self._broker_config_path()
        for index in range(1, self.config.broker_nodes + 1):
            host, port = addresses[index - 1] if addresses else self.addresses.allocate(MQTT_PORT)
            name = f"broker-{index}"
            argv = [sys.executable, "-m", "reference_broker", "--config", str(config_path),
                    "--node-id", name, "--listen", f"{host}:{port}"]
            node = ProcessNode(name, "broker", host, port, argv, log_path=run_dir / "logs" / f"{name}.log",
                               data_dir=run_dir / "data" / name, cwd=REPO_ROOT,
                               ready_check=_broker_ready, env=self._clock_env(name, "broker"))
            self.brokers.append(node)
            node.start()
        for node in self.brokers:
            node.wait_ready(self.config.ready_timeout_s)
        self.timings["brokers_ready_s"] = round(time.monotonic() - began, 3)

    def _clock_env(self, name: str, role: str) -> dict[str, str] | None:
        """The node's libfaketime environment when the run's clock faults may hit its role (faults/clock.py)."""
        return self.clocks.env_for(name, role) if self.clocks is not None else None

    def stop_brokers(self, timeout: float = 10.0) -> None:
        """Stop the broker nodes only (Redis and Kafka keep running) and forget them."""
        errors = []
        for node in self.brokers:
            try:
                node.stop(timeout)
            except Exception as error:  # noqa: BLE001 - keep stopping the others, report at the end
                errors.append(f"{node.name}: {error}")
        self.brokers = []
        if errors:
            raise RuntimeError("stopping the brokers: " + "; ".join(errors))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (brokers first, storage last); safe to call twice or after a failed start."""
        errors = []
        for node in [*self.brokers, self.kafka, *self.redis_nodes, self.storage]:
            if node is None:
                continue
            try:
                node.stop(timeout)
            except Exception as error:  # noqa: BLE001 - keep stopping the others, report at the end
                errors.append(f"{node.name}: {error}")
        if self.disk_holder is not None:  # after its nodes: the tmpfs goes with the last process in the namespace
            holder, self.disk_holder = self.disk_holder, None
            holder.stop()
        if self.power_mounts is not None:  # after its nodes: a mount with a node still on it would not go
            mounts, self.power_mounts = self.power_mounts, None
            try:
                mounts.stop()
            except Exception as error:  # noqa: BLE001 - reported with the others
                errors.append(str(error))
        self.started = False
        if errors:
            raise RuntimeError("stopping the topology: " + "; ".join(errors))
