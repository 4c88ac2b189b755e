"""Reference-broker nodes started by the topology (python -m reference_broker), as real processes."""

from __future__ import annotations

import json
import time

import pytest

from harness.health import check
from harness.local.host_topology import LocalTopology
from harness.node import port_accepts
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration


def test_broker_nodes_start_ready_and_restart(topology_factory) -> None:
    topology: LocalTopology = topology_factory(TopologyConfig(broker_nodes=2, kafka_storage="memory"),
                                               broker_config={"persisted_messages_limit": 100})
    assert [b.name for b in topology.brokers] == ["broker-1", "broker-2"]
    assert len({b.address for b in topology.brokers}) == 2
    written = json.loads((topology.run_dir / "broker-config.json").read_text())
    assert written["broker"] == {"persisted_messages_limit": 100}
    assert written["kafka_bootstrap"] == topology.kafka_bootstrap()
    assert written["redis_startup_nodes"] == [f"{h}:{p}" for h, p in topology.redis_startup_nodes()]
    for broker in topology.brokers:
        assert port_accepts(broker.host, broker.port) and " ready" in broker.log_since_start()
    assert topology.endpoints()["mqtt"] == {b.name: b.address for b in topology.brokers}

    broker = topology.brokers[0]
    old_pid = broker.pid
    began = time.monotonic()
    broker.kill()
    assert not port_accepts(broker.host, broker.port)
    broker.start()
    broker.wait_ready(30)
    assert broker.pid != old_pid
    summary = check(topology)
    assert summary["healthy"], summary
    print(f"\nbroker node SIGKILL -> ready again: {time.monotonic() - began:.2f} s")
