"""Link faults on the broker -> Kafka and broker -> Redis links (faults/latency.py, harness/toxiproxy/routing.py
LinkRouter) on a real local topology: Tansu advertising its proxy and every Redis node announcing its proxy's
port, so that real Kafka and Redis Cluster clients (aiokafka, redis-py) reach them through the proxies; a
link_latency's added round trip (Kafka ApiVersions, Redis PING) in its evidence, felt by those clients and
healed; a failover and a restart keeping the announced ports; and a short whole run with a broker-kafka latency."""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time

import pytest
import redis
from support.capabilities import missing_capability

from faults.base import FaultContext
from faults.catalog import build_fault, validate_spec
from faults.latency import BROKER_KAFKA, BROKER_REDIS, LINK_ATTRIBUTE, round_trip_ms, round_trips
from harness.addresses import BUS_OFFSET
from harness.toxiproxy import LinkRouter, running_toxiproxy

pytestmark = pytest.mark.integration

LATENCY_MS = 200  # per direction; the probes' added round trip is about twice this (direction "both")


def _require() -> None:
    for binary in ("redis-server",):
        if shutil.which(binary) is None:
            missing_capability(f"{binary} is not installed: run scripts/bootstrap.sh")


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """A local topology (3 Redis masters + 3 replicas, Tansu on memory) with both backend links routed."""
    from harness.local.host_topology import LocalTopology
    from harness.topology_config import TopologyConfig

    _require()
    base = tmp_path_factory.mktemp("links-backend")
    with running_toxiproxy(log_path=base / "toxiproxy.log") as proxy:
        topology = LocalTopology(TopologyConfig(kafka_storage="memory"), base / "run", broker_config={})
        topology.link_router = LinkRouter(proxy.api, {BROKER_KAFKA, BROKER_REDIS})
        setattr(topology, LINK_ATTRIBUTE, topology.link_router.link_proxies)
        try:
            topology.start()
            yield topology
        finally:
            topology.stop()


def routes(topology, link: str) -> dict:
    return topology.link_proxies["links"][link]


def fault(kind: str, target: str, **params):
    return build_fault(validate_spec({"id": f"t_{kind}", "kind": kind, "target": target, "params": params}))


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def evidence_check(evidence, what: str) -> dict:
    return next(check for check in evidence.checks if check.what == what).observed


# --- broker -> Kafka -------------------------------------------------------------------------------------------

async def _kafka_advertised(bootstrap: str) -> list[str]:
    from aiokafka import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        return [f"{broker.host}:{broker.port}" for broker in client.cluster.brokers()]
    finally:
        await client.close()


async def _produce_ms(bootstrap: str, during) -> tuple[float, float, float]:
    """An aiokafka producer's send_and_wait (acks=all) median before, while ``during`` runs (a callable that
    returns after installing a fault, then ``during.heal`` undoes it) and after."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("ordeal-links", num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()

    async def median(samples: int = 5) -> float:
        times = []
        for _ in range(samples):
            mark = time.monotonic()
            await producer.send_and_wait("ordeal-links", b"x")
            times.append((time.monotonic() - mark) * 1000)
        return statistics.median(times)

    try:
        await median(2)  # the first sends fetch metadata
        before = await median()
        await asyncio.to_thread(during.apply)
        slowed = await median(3)  # the producer's connection was open before the fault: it is slowed too
        await asyncio.to_thread(during.heal)
        after = await median()
    finally:
        await producer.stop()
    return before, slowed, after


class Played:
    """A fault applied and healed from another thread, its evidence kept."""

    def __init__(self, topology, live) -> None:
        self.ctx, self.live = FaultContext(topology), live
        self.applied = self.healed = None

    def apply(self) -> None:
        self.applied = self.live.apply(self.ctx)

    def heal(self) -> None:
        self.healed = self.live.heal(self.ctx)


def test_tansu_advertises_its_proxy_so_kafka_clients_go_through_it(proxied):
    route = routes(proxied, BROKER_KAFKA)["kafka"]
    assert route["upstream"] == proxied.kafka.address and route["listen"] != proxied.kafka.address
    assert proxied.kafka_bootstrap() == route["listen"]  # the bootstrap handed out is the proxy too
    # a client bootstrapping from Tansu's own address is sent to the proxy as well
    assert asyncio.run(_kafka_advertised(proxied.kafka.address)) == [route["listen"]]
    direct = round_trips(BROKER_KAFKA, *address(proxied.kafka.address), "links-direct")
    assert direct["answered"] and len(direct["ping_ms"]) == 5, direct


def test_broker_kafka_latency_adds_the_round_trip_and_heals(proxied):
    played = Played(proxied, fault("link_latency", "kafka", link=BROKER_KAFKA, latency_ms=LATENCY_MS))
    before, slowed, after = asyncio.run(_produce_ms(proxied.kafka_bootstrap(), played))
    assert played.applied.bit, played.applied.to_dict()
    added = evidence_check(played.applied, "added round trip")
    assert added["during"]["protocol"] == "kafka" and added["expected_added_ms"] == 2 * LATENCY_MS
    assert added["added_ms"] >= 100, added
    assert played.healed.bit, played.healed.to_dict()
    back = evidence_check(played.healed, "round trip back")
    assert back["after"]["answered"] and back["extra_ms"] < 50, back
    # the producer (a real Kafka client following the advertised address) felt it, then no more
    assert slowed - before >= 100, (before, slowed)
    assert after - before < 50, (before, after)


# --- broker -> Redis -------------------------------------------------------------------------------------------

def test_every_redis_node_announces_its_proxy_and_the_bus_stays_direct(proxied):
    proxies = routes(proxied, BROKER_REDIS)
    assert set(proxies) == {node.name for node in proxied.redis_nodes}
    by_port = {address(route["listen"])[1]: name for name, route in proxies.items()}
    for node in proxied.redis_nodes:
        assert proxies[node.name]["upstream"] == node.address
        listen_host, listen_port = address(proxies[node.name]["listen"])
        assert listen_host == node.host and listen_port != node.port  # on the node's own address
    lines = proxied.redis_nodes[0].raw("CLUSTER", "NODES").splitlines()
    announced = {}
    for line in lines:
        where = line.split()[1]  # ip:port@bus
        host_port, _, bus = where.partition("@")
        announced[int(host_port.rpartition(":")[2])] = int(bus.split(",")[0])
    assert set(announced) == set(by_port), (announced, by_port)
    real = {node.name: node for node in proxied.redis_nodes}
    for port, bus in announced.items():
        assert bus == real[by_port[port]].port + BUS_OFFSET  # the bus: the node's own port + 10000
    # the proxy's connection to its node leaves from the node's own address (with distinct addresses, a network
    # fault on the clients' 127.0.0.1 must not cut the broker -> Redis link)
    node = proxied.redis_nodes[0]
    through = redis.Redis(*address(proxies[node.name]["listen"]), socket_timeout=2)
    try:
        assert through.client_info()["addr"].rpartition(":")[0] == node.host
    finally:
        through.close()
    # redis-py's cluster client, from the nodes' own addresses, follows CLUSTER SLOTS to the proxies
    client = redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(n.host, n.port) for n in proxied.redis_nodes])
    try:
        ports = {node.port for node in client.get_nodes()}  # the masters (no reads from replicas)
        assert len(ports) == 3 and ports <= set(by_port), (ports, by_port)
        client.set("{links}probe", "1")
        assert client.get("{links}probe") == b"1"
    finally:
        client.close()


def test_broker_redis_latency_on_one_node_adds_the_round_trip_and_heals(proxied):
    from faults.selectors import resolve_node

    target = "redis-master-of:links"  # the master owning {links}_messages' slot
    ctx = FaultContext(proxied)
    master = resolve_node(proxied, target, ctx.rng_for("t_link_latency"))
    other = next(node for node in proxied.redis_nodes if node.name != master.name)
    client = redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(master.host, master.port)])
    key = "{links}_messages"

    def get_ms(samples: int = 5) -> float:
        times = []
        for _ in range(samples):
            mark = time.monotonic()
            client.get(key)
            times.append((time.monotonic() - mark) * 1000)
        return statistics.median(times)

    latency = fault("link_latency", target, link=BROKER_REDIS, latency_ms=LATENCY_MS)
    try:
        before = get_ms()
        applied = latency.apply(ctx)
        slowed = get_ms(3)
        spared = round_trip_ms(round_trips(BROKER_REDIS, *address(routes(proxied, BROKER_REDIS)[other.name]["listen"]),
                                           "links-spared"))
        healed = latency.heal(ctx)
        after = get_ms()
    finally:
        client.close()
    assert applied.bit, applied.to_dict()
    added = evidence_check(applied, "added round trip")
    assert added["node"] == master.name and added["during"]["protocol"] == "redis", added
    assert added["added_ms"] >= 100, added
    installed = evidence_check(applied, "toxics installed")
    assert {toxic["proxy"] for toxic in installed["toxics"]} == {f"{BROKER_REDIS}-{master.name}"}  # that node only
    assert spared < 50, spared  # another node's proxy: no toxic
    assert healed.bit, healed.to_dict()
    assert slowed - before >= 100, (before, slowed)  # a cluster client's GET on that node's slot
    assert after - before < 50, (before, after)


def test_a_failover_and_a_restart_keep_the_announced_ports(proxied):
    from faults.redis_cluster_view import ClusterView

    proxy_ports = {address(route["listen"])[1] for route in routes(proxied, BROKER_REDIS).values()}

    def announced() -> set[int]:
        view = ClusterView.read(proxied)
        return {address(entry.address)[1] for entry in view.entries}

    ctx = FaultContext(proxied)
    failover = fault("redis_failover", "redis-master-of:links")
    applied = failover.apply(ctx)
    assert applied.bit, applied.to_dict()
    failover.heal(ctx)
    proxied.redis.wait_ready(30)
    assert announced() == proxy_ports
    node = proxied.redis_nodes[0]
    node.restart()
    proxied.redis.wait_ready(30)
    assert announced() == proxy_ports
    assert node.config_path.read_text().count("cluster-announce-port") == 1
    client = redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(node.host, node.port)])
    try:
        for index in range(20):  # keys on every master, each reached through its proxy
            client.set(f"links-{index}", index)
        assert {int(client.get(f"links-{index}")) for index in range(20)} == set(range(20))
    finally:
        client.close()


# --- a whole run -------------------------------------------------------------------------------------------------

RUN_SCENARIO = """
[scenario]
name = "link-kafka-run"
description = "a link_latency on the broker -> Kafka link under P2P load"
tier = "smoke"
duration_s = 10
drain_quiet_s = 2
drain_timeout_s = 60

[topology]
redis_masters = 3
redis_replicas_per_master = 0
broker_nodes = 1
kafka_storage = "memory"

[target]
kind = "reference"

[workload]
pattern = "p2p"
qos_mix = { qos1 = 1 }
protocol_mix = { mqtt311 = 1 }
pairs = 2
rate_per_publisher = 5

[faults]
mix = { link_latency = 1 }
targets = { link_latency = ["kafka"] }
params = { link_latency = { link = "broker-kafka", latency_ms = 150 } }
quiet_s = [2, 3]
duration_s = [3, 4]
tail_s = 2
max_faults = 1
"""


def test_a_run_with_a_broker_kafka_latency_routes_tansu_and_the_fault_bites(tmp_path):
    from contracts.history_schema import Kind
    from harness.history import read_history
    from harness.run import run_scenario

    _require()
    path = tmp_path / "link-kafka-run.toml"
    path.write_text(RUN_SCENARIO)
    began = time.monotonic()
    result = run_scenario(path, 1, tmp_path / "runs", check=False)
    took = time.monotonic() - began
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert result.exit_code == 0, summary
    counts = summary["counts"]
    assert counts["failed"] == 0 and counts["delivered_unique"] == counts["published"] > 0, counts
    assert any("broker-kafka routed" in note for note in summary.get("notes", [])), summary.get("notes")
    described = json.loads((result.run_dir / "topology.json").read_text())
    route = described["link_proxies"]["links"][BROKER_KAFKA]["kafka"]
    assert described["kafka"]["bootstrap"] == route["listen"], described
    rows = read_history(result.run_dir / "history").to_pylist()
    evidence = {json.loads(r["detail"])["stage"]: json.loads(r["detail"]) for r in rows
                if r["kind"] == Kind.FAULT_EVIDENCE}
    assert set(evidence) == {"apply", "heal"}, [r for r in rows if r["kind"] == Kind.FAULT_ERROR]
    assert evidence["apply"]["bit"] and evidence["heal"]["bit"], evidence
    added = {c["what"]: c["observed"] for c in evidence["apply"]["checks"]}["added round trip"]
    assert added["added_ms"] >= 150, added
    assert took < 60, took
