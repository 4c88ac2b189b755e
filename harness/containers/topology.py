"""The containers topology provider: the local topology's parts as containers, created and torn down
through testcontainers-python against the run's own Podman (harness/containers/engine.py).

Redis Cluster (masters + replicas of the [topology] table), Tansu with its S3 stand-in (moto), and the
reference-broker nodes, each a container on the run's network (10.123.0.0/24, inside the run's private
network namespace; the harness reaches them from the bridge address 10.123.0.1).  It has the local
topology's attributes and methods (contracts/topology.py ServiceTopology), so the executor, faults/, the drain
and the checkers use it unchanged:

    with ContainerTopology(TopologyConfig(provider="containers"), run_dir) as topology:
        topology.redis_startup_nodes(); topology.kafka_bootstrap(); topology.endpoints()
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import time
from pathlib import Path

from harness.containers.autobuild import missing_message, reference_images
from harness.containers.engine import RUN_LABEL, Engine
from harness.containers.images import image_reference
from harness.containers.node import ContainerNode
from harness.containers.sandbox import cgroup_parent
from harness.kafka import BUCKET, MOTO_KEYS, _create_bucket, _s3_answers
from harness.node import NodeError, port_accepts
from harness.running_redis_cluster import RedisCluster, RedisCommands, answers_ping
from harness.topology_base import MQTT_PORT, REDIS_PORT, S3_PORT, TopologyBase
from harness.topology_config import TopologyConfig

SUBNET = ipaddress.ip_network("10.123.0.0/24")
GATEWAY = "10.123.0.1"  # the harness' (and so the clients') address on the run's network
KAFKA_PORT = 9092
# Fixed addresses: the same node has the same address in every run (readable logs, stable fault rules).
REDIS_FIRST, S3_HOST, KAFKA_HOST, BROKER_FIRST, TARGET_HOST = 11, 30, 31, 41, 60


def _host(index: int) -> str:
    return str(SUBNET.network_address + index)


def run_id_for(run_dir: Path) -> str:
    """A label value naming the run: readable, unique (hash of the absolute run directory)."""
    resolved = str(Path(run_dir).resolve())
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(resolved).name)[:40]
    return f"{clean}-{hashlib.blake2b(resolved.encode(), digest_size=4).hexdigest()}"


class ContainerRedisNode(RedisCommands, ContainerNode):
    """A Redis Cluster node in a container, with the same cluster commands as a local one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._node_id = None


def _broker_ready(node: ContainerNode) -> bool:
    return port_accepts(node.host, node.port) and " ready" in node.log_since_start()


class ContainerTopology(TopologyBase):
    """The topology's nodes as containers on the run's own network and Podman."""

    provider = "containers"

    def __init__(self, config: TopologyConfig | None = None, run_dir: Path | str = "runs/up", *,
                 address_mode: str = "containers", broker_config=None) -> None:
        super().__init__(config, run_dir, broker_config)
        self.addresses = _ContainerAddresses()
        self.run_id = run_id_for(self.run_dir)
        self.network = f"ordeal-{self.run_id}"
        self.engine: Engine | None = None
        self.client_hosts = GATEWAY  # faults/selectors.py: the "client" group's address
        self.client_bind_address = GATEWAY
        self.network_fault_place = "bridge"  # faults/network.py: nft bridge-family chains on the run's bridge

    # -- life --------------------------------------------------------------------------------------
    def images_needed(self) -> list[str]:
        return reference_images(self.config)

    def start(self) -> None:
        if self.started or self.nodes():
            raise RuntimeError("this ContainerTopology was already started; make a new one for a new run")
        if self.config.storage_kind() == "s3rver":
            raise NodeError("kafka_storage = 's3rver' is not available on the containers provider (no s3rver "
                            "image); use 's3' (moto) or 'memory'")
        began = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.engine = Engine.start(self.run_dir, self.run_id)
            self.timings.update(self.engine.timings)
            # built on first use before the run entered its namespace (harness/containers/autobuild.py); here
            # only checked: inside the namespace the Debian mirror cannot be reached
            missing = missing_message(self.images_needed(), "in the host's network namespace, as root")
            if missing:
                raise NodeError(missing)
            self.engine.client.networks.create(
                self.network, driver="bridge", labels={RUN_LABEL: self.run_id},
                ipam={"Driver": "default", "Config": [{"Subnet": str(SUBNET), "Gateway": GATEWAY}]})
            self.timings["network_s"] = round(time.monotonic() - began, 3)
            # Kafka (+ its storage) comes up in a thread while the Redis Cluster forms: on 2 loaded cores the
            # containers' start-up is mostly waiting on the engine, which serves requests in parallel.
            kafka = None
            if self.config.kafka_storage != "none":
                kafka = _Background(self._start_kafka_containers)
            try:
                self._start_redis_containers()
            finally:
                if kafka is not None:  # never tear down while the thread still creates containers
                    kafka.join()
            self.redis.wait_ready(self.config.ready_timeout_s)
            self.timings["redis_ready_s"] = round(time.monotonic() - began, 3)
            if self.config.broker_nodes:
                self._start_broker_containers()
        except BaseException:
            self.stop()
            raise
        self.started = True
        self.timings["ready_s"] = round(time.monotonic() - began, 3)
        self.write_description()

    def _node(self, cls=ContainerNode, **kwargs) -> ContainerNode:
        return cls(self.engine, network=self.network, run_dir=self.run_dir,
                   cgroup_parent=cgroup_parent(self.run_id) if self.engine.process is not None else None,
                   **kwargs)

    def _start_redis_containers(self) -> None:
        began = time.monotonic()
        for index in range(self.config.redis_nodes):
            host = _host(REDIS_FIRST + index)
            name = f"redis-{REDIS_FIRST + index}"
            command = ["redis-server", "--bind", host, "--port", str(REDIS_PORT), "--protected-mode", "no",
                       "--dir", "/data", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-node-timeout", str(self.config.redis_node_timeout_ms),
                       "--cluster-announce-ip", host, "--appendonly", "yes",
                       "--appendfsync", self.config.redis_appendfsync, "--save", "",
                       "--repl-diskless-sync-delay", "0"]
            self.redis_nodes.append(self._node(ContainerRedisNode, name=name, role="redis",
                                               image=image_reference("redis"), host=host, port=REDIS_PORT,
                                               command=command, ready_check=answers_ping))
        self.redis = RedisCluster(self.redis_nodes, self.config.redis_masters,
                                  self.config.redis_replicas_per_master)
        _parallel([node.start for node in self.redis_nodes])
        _parallel([lambda node=node: node.wait_ready(15) for node in self.redis_nodes])
        self.redis.create(timeout=self.config.ready_timeout_s)
        self.timings["redis_formed_s"] = round(time.monotonic() - began, 3)

    def _start_kafka_containers(self) -> None:
        began = time.monotonic()
        env: dict[str, str] = {"NO_PROXY": "*", "no_proxy": "*", "RUST_LOG": "warn"}
        if self.config.storage_kind():
            self.storage = self._node(name="s3", role="storage", image=image_reference("s3"), host=_host(S3_HOST),
                                      port=S3_PORT, command=["-H", _host(S3_HOST), "-p", str(S3_PORT)],
                                      ready_check=_s3_answers, after_ready=_create_bucket, volume=False)
            self.storage.start()
            self.storage.wait_ready(self.config.ready_timeout_s)
            engine_url = f"s3://{BUCKET}/"
            env.update({**MOTO_KEYS, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT": f"http://{self.storage.address}", "AWS_ALLOW_HTTP": "true"})
        else:
            engine_url = f"memory://{BUCKET}/"
        url = f"tcp://{_host(KAFKA_HOST)}:{KAFKA_PORT}"
        self.kafka = self._node(name="kafka", role="kafka", image=image_reference("kafka"), host=_host(KAFKA_HOST),
                                port=KAFKA_PORT, env=env, volume=False,
                                command=["broker", "--cluster-id", "ordeal", "--listener-url", url,
                                         "--advertised-listener-url", url, "--storage-engine", engine_url])
        self.kafka.storage_engine = engine_url
        self.kafka.bootstrap = self.kafka.address
        self.kafka.start()
        self.kafka.wait_ready(self.config.ready_timeout_s)
        self.timings["kafka_ready_s"] = round(time.monotonic() - began, 3)

    def _start_broker_containers(self) -> None:
        began = time.monotonic()
        config_path = Path(self._broker_config_path()).resolve()
        for index in range(1, self.config.broker_nodes + 1):
            host = _host(BROKER_FIRST + index - 1)
            name = f"broker-{index}"
            node = self._node(name=name, role="broker", image=image_reference("broker"), host=host, port=MQTT_PORT,
                              command=["--config", str(config_path), "--node-id", name, "--listen",
                                       f"{host}:{MQTT_PORT}"],
                              binds={str(config_path.parent): str(config_path.parent)},
                              ready_check=_broker_ready, volume=False)
            self.brokers.append(node)
        _parallel([node.start for node in self.brokers])
        for node in self.brokers:
            node.wait_ready(self.config.ready_timeout_s)
        self.timings["brokers_ready_s"] = round(time.monotonic() - began, 3)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and remove every container (their output into logs/), then end the engine, which reaps
        whatever carries the run's label and takes its state with it.  Safe to call twice."""
        errors = []
        for node in [*self.brokers, self.kafka, *self.redis_nodes, self.storage]:
            if node is None:
                continue
            try:
                node.remove()
            except Exception as error:  # noqa: BLE001 - keep removing the others
                errors.append(f"{node.name}: {error}")
        if self.engine is not None:
            try:
                self.engine.remove_run_objects()
            except Exception as error:  # noqa: BLE001 - the sandbox reaps by label anyway
                errors.append(f"engine: {error}")
            self.engine.stop()
            self.engine = None
        _drop_bridge_rules()
        self.started = False
        if errors:
            raise RuntimeError("stopping the container topology: " + "; ".join(errors))

    def endpoints(self) -> dict:
        document = super().endpoints()
        document.update({"provider": "containers", "network": self.network, "subnet": str(SUBNET),
                         "client_address": GATEWAY, "run_label": f"{RUN_LABEL}={self.run_id}",
                         "docker_host": self.engine.url if self.engine else None, "timings": dict(self.timings)})
        return document


def _parallel(calls: list) -> None:
    """Run the calls in threads; re-raise the first error once all have ended."""
    from concurrent.futures import ThreadPoolExecutor

    if not calls:
        return
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        future.result()


class _Background:
    def __init__(self, call) -> None:
        import threading

        self.error: BaseException | None = None

        def run() -> None:
            try:
                call()
            except BaseException as error:  # noqa: BLE001 - re-raised by join()
                self.error = error

        self.thread = threading.Thread(target=run, name="ordeal-container-start", daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class _ContainerAddresses:
    mode = "containers"


def _drop_bridge_rules() -> None:
    """A network fault left behind (a broken run) must not outlive the run's bridge: the next topology in
    this namespace reuses the same addresses."""
    import subprocess

    subprocess.run(["nft", "delete", "table", "bridge", "ordeal_chaos"], capture_output=True, timeout=10)
