"""Network faults (nftables, tc) against real Redis nodes, inside the test session's private network
namespace (tests/conftest.py): rules installed, packets really dropped (counters), effect seen from a
client socket, rules gone and traffic flowing again after heal."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from support.capabilities import missing_capability

from faults import probes
from faults.base import FaultContext, FaultNotApplicable
from faults.catalog import build_fault, validate_spec
from faults.network import TABLE, heal_all_network
from harness.local.host_topology import LocalTopology
from harness.topology_config import TopologyConfig

pytestmark = [pytest.mark.integration, pytest.mark.root]

if os.environ.get("ORDEAL_NETNS") != "private":
    missing_capability("network faults need the private network namespace (root test session); the refusal "
                       "without it is tested in tests/unit/test_faults_guard.py", allow_module_level=True)
if shutil.which("nft") is None:
    missing_capability("network faults need nftables (the nft binary): apt-get install nftables",
                       allow_module_level=True)


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory):
    topology = LocalTopology(TopologyConfig(kafka_storage="none"), tmp_path_factory.mktemp("faults-net"))
    topology.start()
    try:
        yield topology
    finally:
        topology.stop()


@pytest.fixture
def ctx(topo: LocalTopology):
    context = FaultContext(topo, seed=3, record=None, effect_timeout_s=5.0)
    yield context
    heal_all_network()  # whatever a failing test left behind
    topo.redis.wait_ready(30)


def _fault(kind: str, target: str | None = None, **params):
    return build_fault(validate_spec({"id": f"{kind}-t", "kind": kind, "target": target, "params": params}))


def _nft_table() -> str:
    import subprocess

    return subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, text=True).stdout


def _replica(topo: LocalTopology):
    return next(node for node in topo.redis_nodes if not node.is_master())


def test_isolate_node_silences_it_then_heals(topo: LocalTopology, ctx: FaultContext):
    node = _replica(topo)
    assert probes.port_state(node.host, node.port) == "accepts"
    fault = _fault("net_isolate", f"node:{node.name}")
    began = time.monotonic()
    evidence = fault.apply(ctx)
    apply_s = time.monotonic() - began
    assert evidence.bit, evidence.to_dict()
    assert fault.chain in _nft_table()
    assert probes.port_state(node.host, node.port, timeout_s=0.3) == "silent"  # dropped, not refused
    time.sleep(0.3)  # cluster-bus pings keep coming: more packets for the counters
    began = time.monotonic()
    healed = fault.heal(ctx)
    print(f"net_isolate apply (rules + evidence) {apply_s * 1000:.0f} ms, heal {(time.monotonic() - began) * 1000:.0f} ms")
    assert healed.bit, healed.to_dict()
    assert healed.checks[0].observed["packets"] > 0
    assert _nft_table() == ""  # the last chain took the table with it
    assert probes.port_state(node.host, node.port) == "accepts"


def test_partition_between_two_masters_is_seen_by_the_cluster(topo: LocalTopology, ctx: FaultContext):
    first, second = [node for node in topo.redis_nodes if node.is_master()][:2]
    fault = _fault("net_partition", a=f"node:{first.name}", b=f"node:{second.name}")
    assert fault.apply(ctx).bit
    began = time.monotonic()
    flags: set[str] = set()
    while time.monotonic() - began < 4:  # node timeout is 1 s: first must suspect second (fail?)
        flags = next(e.flags for e in first.cluster_nodes() if e.node_id == second.node_id)
        if "fail?" in flags or "fail" in flags:
            break
        time.sleep(0.1)
    healed = fault.heal(ctx)
    assert "fail?" in flags or "fail" in flags, flags
    assert healed.bit, healed.to_dict()
    # the rest of the cluster still reaches both: only the pair was cut
    assert first.client(timeout=1).ping() and second.client(timeout=1).ping()


def test_oneway_partition_from_clients(topo: LocalTopology, ctx: FaultContext):
    node = topo.redis_nodes[0]
    fault = _fault("net_partition_oneway", src="client", dst=f"node:{node.name}")
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    assert evidence.checks[0].observed["sides"]["src"] == {"*": "127.0.0.1"}
    assert probes.port_state(node.host, node.port, timeout_s=0.3) == "silent"
    assert topo.redis_nodes[1].client(timeout=1).ping()  # other nodes untouched
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert probes.port_state(node.host, node.port) == "accepts"


def test_lossy_link_drops_some_not_all(topo: LocalTopology, ctx: FaultContext):
    node = topo.redis_nodes[1]
    fault = _fault("net_lossy", a="client", b=f"node:{node.name}", percent=50)
    assert fault.apply(ctx).bit
    # Each connect needs the SYN and the SYN-ACK through: ~25% succeed within a short timeout.
    outcomes = [probes.port_state(node.host, node.port, timeout_s=0.1) for _ in range(30)]
    healed = fault.heal(ctx)
    accepted = outcomes.count("accepts")
    assert 0 < accepted < len(outcomes), outcomes
    assert healed.bit, healed.to_dict()


def test_bandwidth_limit_slows_a_transfer(topo: LocalTopology, ctx: FaultContext):
    node = topo.redis_nodes[2]
    payload = "x" * 120_000

    def echo_seconds() -> float:
        connection = node.client(timeout=10)
        try:
            connection.ping()
            began = time.monotonic()
            assert connection.echo(payload) == payload
            return time.monotonic() - began
        finally:
            connection.close()

    baseline = echo_seconds()
    fault = _fault("net_bandwidth", a="client", b=f"node:{node.name}", rate_kbit=800, burst_kb=65)
    assert fault.apply(ctx).bit
    try:
        limited = echo_seconds()
    finally:
        healed = fault.heal(ctx)
    after = echo_seconds()
    assert healed.bit, healed.to_dict()
    assert healed.checks[0].observed["packets"] > 0
    assert baseline < 0.2 and after < 0.2, (baseline, after)
    assert limited > 0.4, (baseline, limited)
    print(f"echo 120 kB: {baseline * 1000:.1f} ms, limited {limited:.2f} s, after {after * 1000:.1f} ms")


def test_overlapping_groups_are_refused(topo: LocalTopology, ctx: FaultContext):
    node = topo.redis_nodes[0]
    with pytest.raises(FaultNotApplicable, match="share address"):
        _fault("net_partition", a="redis", b=f"node:{node.name}").apply(ctx)
    assert _nft_table() == ""


def test_redis_redis_partition_of_a_master_from_the_rest_promotes_its_replica(topo: LocalTopology,
                                                                               ctx: FaultContext):
    from faults.redis_cluster_view import ClusterView, client_messages_key

    key = client_messages_key("net_client")
    master = topo.redis.master_for_key(key)
    selector = "redis-master-of:net_client"
    fault = _fault("net_partition", a=selector, b=["redis", f"-{selector}"])
    evidence = fault.apply(ctx)
    assert evidence.bit, evidence.to_dict()
    sides = evidence.checks[0].observed["sides"]
    assert sides["a"] == {master.name: master.host} and master.name not in sides["b"] and len(sides["b"]) == 5
    began = time.monotonic()
    promoted = None
    while time.monotonic() - began < 8:  # the majority promotes the cut-off master's replica
        owner = ClusterView.read(topo, exclude=(master.name,)).master_of_key(key)
        if owner.address != master.address:
            promoted = owner
            break
        time.sleep(0.2)
    promotion_s = time.monotonic() - began
    healed = fault.heal(ctx)
    assert promoted is not None, "no promotion within 8 s of the partition"
    assert healed.bit, healed.to_dict()
    topo.redis.wait_ready(30)
    assert not master.is_master()  # it rejoined as a replica
    print(f"master cut from the other Redis nodes: replica promoted after {promotion_s:.2f} s")


# A stand-in "service" process: listens on its own address and keeps pinging one Redis node, from its own
# address (bound) or from wherever the kernel picks (unbound: 127.0.0.1), like a real broker node does.
PINGER = """
import socket, sys, time
host, port, redis_host, redis_port, bind = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
listener = socket.create_server((host, port))
out = socket.socket()
out.settimeout(0.2)
if bind == "bound":
    out.bind((host, 0))
out.connect((redis_host, redis_port))
while True:
    try:
        out.sendall(b"PING\\r\\n")
        out.recv(64)
    except OSError:
        pass
    time.sleep(0.05)
"""


@pytest.mark.parametrize("bind", ["bound", "unbound"])
def test_partition_sees_only_traffic_from_the_nodes_addresses(topo: LocalTopology, ctx: FaultContext, bind,
                                                              tmp_path):
    import sys
    from types import SimpleNamespace

    from harness.node import ProcessNode

    redis_node = topo.redis_nodes[0]
    # Each case serves on its own address: the bound case's pinger leaves a closed socket whose PING, dropped
    # by its partition, the kernel still retransmits (backing off) after the process is gone, from
    # 127.0.0.200; on the same address the next case's rules counted that one 58-byte segment.
    host = {"bound": "127.0.0.200", "unbound": "127.0.0.201"}[bind]
    service = ProcessNode("broker-1", "broker", host, 18830,
                          [sys.executable, "-c", PINGER, host, "18830", redis_node.host,
                           str(redis_node.port), bind], log_path=tmp_path / "pinger.log", data_dir=tmp_path)
    service.start()
    try:
        service.wait_ready(10)
        time.sleep(0.2)
        with_service = SimpleNamespace(redis_nodes=topo.redis_nodes, kafka=None, storage=None, brokers=[service])
        context = FaultContext(with_service, seed=1)
        fault = _fault("net_partition", a="broker", b=f"node:{redis_node.name}")
        evidence = fault.apply(context)
        time.sleep(0.4)
        healed = fault.heal(context)
    finally:
        service.stop(2)
    traffic = evidence.checks[1]
    if bind == "bound":
        assert evidence.bit and healed.bit, (evidence.to_dict(), healed.to_dict())
    else:
        # The rules cannot see a connection that leaves from 127.0.0.1: the evidence says so, and the
        # counters confirm nothing was dropped.
        assert not traffic.ok and traffic.observed["misrouted"][0]["local"].startswith("127.0.0.1:")
        assert not evidence.bit and not healed.bit
        assert healed.checks[0].observed["packets"] == 0


def test_concurrent_faults_keep_their_own_chains_and_classes(topo: LocalTopology, ctx: FaultContext):
    import subprocess

    first, second = topo.redis_nodes[3], topo.redis_nodes[4]
    cut_first = build_fault(validate_spec({"id": "cut-1", "kind": "net_partition_oneway",
                                           "params": {"src": "client", "dst": f"node:{first.name}"}}))
    cut_second = build_fault(validate_spec({"id": "cut-2", "kind": "net_partition_oneway",
                                            "params": {"src": "client", "dst": f"node:{second.name}"}}))
    slow_first = build_fault(validate_spec({"id": "slow-1", "kind": "net_bandwidth",
                                            "params": {"a": "client", "b": f"node:{first.name}"}}))
    slow_second = build_fault(validate_spec({"id": "slow-2", "kind": "net_bandwidth",
                                             "params": {"a": "client", "b": f"node:{second.name}"}}))
    for fault in (cut_first, cut_second, slow_first, slow_second):
        assert fault.apply(ctx).checks[0].ok
    assert probes.port_state(first.host, first.port, 0.3) == "silent"
    cut_first.heal(ctx)
    slow_first.heal(ctx)
    assert cut_second.chain in _nft_table() and cut_first.chain not in _nft_table()
    assert probes.port_state(first.host, first.port) == "accepts"
    assert probes.port_state(second.host, second.port, 0.3) == "silent"
    assert "htb" in subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert cut_second.heal(ctx).bit and slow_second.heal(ctx).checks[1].ok
    assert _nft_table() == ""
    assert "htb" not in subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout


def test_broker_redis_partition_bites_and_the_broker_recovers(topology_factory):
    """The reference broker binds its outgoing connections to its own address, so a broker <-> Redis
    partition by role groups really drops its Redis traffic (counters > 0); publishes keep being
    acknowledged (Kafka is reachable), and after the heal every acknowledged message is delivered."""
    from test_broker_faults import DURABLE, Publisher
    from test_broker_flow import FILTER

    from harness.recording_client import Probe

    topo = topology_factory(TopologyConfig(broker_nodes=1, kafka_storage="memory"),
                            broker_config={**DURABLE, "incoming_partitions": 4, "persisted_partitions": 4,
                                           "delivery_recheck_s": 0.5})
    broker = topo.brokers[0]
    sub = Probe(broker.host, broker.port, "net-sub", version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(FILTER, 1)
    publisher = Publisher([(broker.host, broker.port)], count=120, rate=30)
    fault = _fault("net_partition", a="broker", b="redis")
    context = FaultContext(topo, seed=5, record=None, effect_timeout_s=5.0)
    publisher.start()
    healed = None
    try:
        time.sleep(1.0)
        evidence = fault.apply(context)
        time.sleep(2.5)
        healed_at = time.monotonic()
        healed = fault.heal(context)
        publisher.join(60)
    finally:
        if healed is None:
            heal_all_network()
    assert evidence.bit, evidence.to_dict()  # rules installed, no broker connection from another address
    assert healed.bit, healed.to_dict()
    dropped = healed.checks[0].observed["packets"]
    acked = set(publisher.acked)
    sub.drop()
    final = Probe(broker.host, broker.port, "net-sub", version=5)
    final.connect(clean=False, session_expiry=3600)
    deadline = time.monotonic() + 40
    seen: set[int] = set()
    while time.monotonic() < deadline:
        seen = {int(d.payload[1:]) for d in sub.deliveries + final.deliveries}
        if acked <= seen:
            break
        time.sleep(0.2)
    drained_s = time.monotonic() - healed_at
    final.drop()
    lost = acked - seen
    print(f"\nbroker<->redis partition 2.5 s: {dropped} packets dropped, acked {len(acked)} of "
          f"{publisher.count}, delivered {len(seen)}, lost {len(lost)}, drained {drained_s:.1f} s after heal")
    assert dropped > 0
    assert len(acked) > 100
    assert lost == set(), f"acknowledged but never delivered: {sorted(lost)[:20]}"
