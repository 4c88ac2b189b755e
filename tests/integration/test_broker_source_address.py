"""A broker node's outgoing connections (Redis Cluster client, Kafka producer and consumers, node links)
leave from its own --listen address, so that network faults keyed on the node's address match them
(reference_broker/source_address.py).  Checked with ``ss -tnp`` against real broker processes on the
shared topology; the partition that then really bites is in test_faults_network.py."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from support.capabilities import missing_capability
from test_broker_flow import brokers  # noqa: F401 - the fixture (broker nodes on the shared topology)

from reference_broker.source_address import source_address_for

SS_LINE = re.compile(r"^\S+\s+\d+\s+\d+\s+(?P<local>\S+):(?P<lport>\d+)\s+(?P<peer>\S+):(?P<pport>\d+)\s+"
                     r"users:\(\(.*?pid=(?P<pid>\d+)")


def established_by_pid() -> dict[int, list[tuple[str, tuple[str, int]]]]:
    """pid -> [(local ip, (peer ip, peer port))] of every established TCP connection (``ss -tnpH``)."""
    text = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True,
                          check=True).stdout
    found: dict[int, list[tuple[str, tuple[str, int]]]] = {}
    for line in text.splitlines():
        match = SS_LINE.match("ESTAB " + line.strip()) or SS_LINE.match(line.strip())
        if match:
            found.setdefault(int(match["pid"]), []).append(
                (match["local"], (match["peer"], int(match["pport"]))))
    return found


def test_source_address_choice():
    assert source_address_for("127.0.0.9", "127.0.0.2") == "127.0.0.9"
    assert source_address_for("127.0.0.1", "127.0.0.2") == "127.0.0.1"
    assert source_address_for("0.0.0.0", "127.0.0.2") is None          # no specific address to use
    assert source_address_for("127.0.0.9", "localhost") is None        # names: the resolver decides
    assert source_address_for("127.0.0.9", "10.1.2.3") is None         # a loopback source cannot leave
    assert source_address_for("10.0.0.5", "127.0.0.2") is None
    assert source_address_for("::1", "::1") is None
    assert source_address_for("127.0.0.9", None) is None


@pytest.mark.integration
def test_broker_connections_leave_from_its_own_address(brokers, topology):  # noqa: F811
    if topology.addresses.mode != "distinct":
        missing_capability("needs the private network namespace (own 127.0.0.x per node); on 127.0.0.1 the "
                           "source address is the listen address anyway")
    cluster = brokers(count=2)
    first, second = cluster.nodes
    redis = {(h, p) for h, p in topology.redis_startup_nodes()}
    kafka_host, _, kafka_port = topology.kafka_bootstrap().rpartition(":")
    kafka = (kafka_host, int(kafka_port))

    def ready(connections) -> bool:
        return all(any(c[1] in redis for c in connections.get(n.pid, [])) and
                   any(c[1] == kafka for c in connections.get(n.pid, [])) for n in (first, second))

    deadline = time.monotonic() + 15
    while True:
        # A takeover makes the second node kick the first over a node link (its own outgoing connection);
        # repeated, because a kick posted before the node registry lists the first node is dropped.
        old = cluster.probe("moved-client", node=0, version=5)
        old.connect(clean=True)
        new = cluster.probe("moved-client", node=1, version=5)
        new.connect(clean=True)
        time.sleep(0.5)
        connections = established_by_pid()
        peer_links = [c for c in connections.get(second.pid, []) if c[1][0] == first.host and c[1][1] != first.port]
        if (peer_links and ready(connections)) or time.monotonic() > deadline:
            break
        new.drop()
    for node in (first, second):
        outgoing = [c for c in connections.get(node.pid, []) if c[1] in redis or c[1] == kafka
                    or (c[1][0] in (first.host, second.host) and c[1][0] != node.host)]
        to_redis = [c for c in outgoing if c[1] in redis]
        to_kafka = [c for c in outgoing if c[1] == kafka]
        print(f"\n{node.name} ({node.host}): {len(to_redis)} to Redis, {len(to_kafka)} to Kafka, "
              f"{len(outgoing) - len(to_redis) - len(to_kafka)} node links; sources "
              f"{sorted({local for local, _ in outgoing})}")
        assert to_redis and to_kafka, (node.name, connections.get(node.pid))
        assert {local for local, _ in outgoing} == {node.host}, (node.name, outgoing)
    assert peer_links, f"no node link from {second.name} to {first.name}: {connections.get(second.pid)}"
    assert {local for local, _ in peer_links} == {second.host}
