"""Process faults on reference-broker nodes, chosen as "the node holding this subscriber" from the
broker's own session record in Redis; the subscriber really loses its connection."""

from __future__ import annotations

import re

import pytest

from faults import probes
from faults.base import FaultContext, FaultNotApplicable
from faults.catalog import build_fault, validate_spec
from faults.redis_cluster_view import wait_until
from faults.selectors import resolve_node
from harness.recording_client import Probe
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration


def _fault(fault_id: str, kind: str, target: str, **params):
    return build_fault(validate_spec({"id": fault_id, "kind": kind, "target": target, "params": params}))


def test_kill_the_broker_holding_a_subscriber_and_pause_another(topology_factory):
    topology = topology_factory(TopologyConfig(broker_nodes=2, kafka_storage="memory"))
    ctx = FaultContext(topology, seed=5, effect_timeout_s=5.0)
    second = topology.brokers[1]
    subscriber = Probe(second.host, second.port, "faults_sub_1")
    bystander = Probe(topology.brokers[0].host, topology.brokers[0].port, "faults_sub_2")
    try:
        subscriber.connect(clean=False, session_expiry=300)
        subscriber.subscribe("faults/+/x")
        bystander.connect(clean=True)
        bystander.disconnect()
        # The client's side of the DISCONNECT ends before the broker's: it drops the clean session's record
        # from Redis only after it has read the packet and closed the socket, so right after disconnect() the
        # record may still name broker 1 as connected (seen once in the full suite, 2026-11-24).  What must
        # hold is that it stops naming a holder, within a few seconds.
        def released() -> tuple[bool, dict]:
            try:
                return False, {"holder": resolve_node(topology, "broker-holding:faults_sub_2", ctx.rng_for("x")).name}
            except FaultNotApplicable as error:
                return True, {"why": str(error)}

        ok, observed, waited = wait_until(released, timeout_s=5.0, interval_s=0.05)
        assert ok, f"{waited} s after its DISCONNECT faults_sub_2 is still held: {observed}"
        assert re.search("no session|not connected", observed["why"]), observed
        assert resolve_node(topology, "broker-holding:faults_sub_1", ctx.rng_for("x")) is second

        kill = _fault("kill-holder", "process_kill", "broker-holding:faults_sub_1")
        evidence = kill.apply(ctx)
        assert evidence.bit, evidence.to_dict()
        assert kill.node is second
        assert subscriber._disconnected.wait(5)  # the client really lost its socket
        healed = kill.heal(ctx)
        assert healed.bit, healed.to_dict()
        assert probes.port_state(second.host, second.port) == "accepts"

        pause = _fault("pause-1", "process_pause", "broker:1")
        assert pause.apply(ctx).bit
        assert probes.is_stopped(topology.brokers[0].pid)
        assert pause.heal(ctx).bit
    finally:
        subscriber.drop()
        bystander.drop()
