"""The failure-path faults (faults/failure_paths.py) against the real topology: each bites, its evidence
says so, and the broker's own log shows the path it reached."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import redis
from redis.crc import key_slot

from faults.base import FaultContext
from faults.catalog import build_fault, validate_spec
from faults.failure_paths import _timed, probe_key
from faults.redis_cluster_view import ClusterView, client_messages_key, query
from harness.recording_client import Probe
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration


def _fault(fault_id: str, kind: str, target: str, **params):
    return build_fault(validate_spec({"id": fault_id, "kind": kind, "target": target, "params": params}))


def _queue_size(topology, client: str) -> int:
    view = ClusterView.read(topology)
    master = view.handle(topology, view.master_of_key(client_messages_key(client)))
    return int(query(master.host, master.port, "ZCARD", client_messages_key(client)))


def _offline_subscriber(broker, client: str, topic_filter: str) -> None:
    sub = Probe(broker.host, broker.port, client)
    sub.connect(clean=False, session_expiry=600)
    sub.subscribe(topic_filter)
    sub.disconnect()


def _client_away_from_leases(topology) -> str:
    """A client id whose session slot is on another master than the broker's lease keys ({ordeal})."""
    view = ClusterView.read(topology)
    leases = view.master_of_key("{ordeal}:lease")
    for index in range(1000):
        client = f"fp_sub_{index}"
        if view.master_of_slot(key_slot(client_messages_key(client).encode())).node_id != leases.node_id:
            return client
    raise AssertionError("every client id lands on the lease master")


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_write_stall_holds_saves_while_reads_answer(topology_factory):
    topology = topology_factory(TopologyConfig(broker_nodes=1, redis_replicas_per_master=0, kafka_storage="memory"))
    broker = topology.brokers[0]
    ctx = FaultContext(topology, seed=3, record=lambda kind, **columns: None)
    _offline_subscriber(broker, "fp_stall", "fp/stall/+")
    publisher = Probe(broker.host, broker.port, "fp_stall_pub")
    publisher.connect(clean=True)
    try:
        stall = _fault("stall-1", "redis_write_stall", "redis-master-of:fp_stall", probe_timeout_s=0.3)
        evidence = stall.apply(ctx)
        assert evidence.bit, evidence.to_dict()
        assert {c.what for c in evidence.checks} == {"write blocked", "read answers"}
        publisher.publish("fp/stall/x", b"during the stall")  # acked once in Kafka; its save must wait
        time.sleep(1.5)
        assert _queue_size(topology, "fp_stall") == 0, "the save went through a write stall"
        healed = stall.heal(ctx)
        assert healed.bit, healed.to_dict()
        assert healed.checks[0].observed["stalled_s"] >= 1.5
        assert _wait(lambda: _queue_size(topology, "fp_stall") == 1, 10), "the held save never completed"
    finally:
        publisher.drop()


@contextlib.contextmanager
def _writes_paused(topology):
    """A master with its writes paused: yields (host, port, a key it owns, connections(): the connections it
    has accepted so far, the asking INFO's own included)."""
    view = ClusterView.read(topology)
    entry = view.masters()[0]
    master = view.handle(topology, entry)

    def connections() -> int:
        return int(query(master.host, master.port, "INFO", "stats")["total_connections_received"])

    query(master.host, master.port, "CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        yield master.host, master.port, probe_key(entry), connections
    finally:
        query(master.host, master.port, "CLIENT", "UNPAUSE")


def test_the_write_probe_on_a_paused_master_is_sent_once(topology):
    """A blocked probe write answers 'blocked' after one socket timeout, not after redis-py's default
    retries (8.x: 10, each a new connection and another blocked SET): those held the nemesis ~10 s in the
    apply of redis-write-stall seed 101's first fault, past its planned heal and into the next fault."""
    with _writes_paused(topology) as (host, port, key, connections):
        before = connections()
        outcome, _ = _timed(host, port, 0.2, "SET", key, "probe")
        sent = connections() - before - 1  # the first INFO's own connection
    assert outcome == "blocked"
    assert sent == 1, f"the probe write was sent on {sent} connections: redis-py retried it"


def test_redis_outage_outlasts_the_retries_and_the_broker_commits_anyway(topology_factory):
    """scope master: the brokers' connections to one master are reset while the cluster (and the lease keys'
    master) stays up, so the persisted stage exhausts its retries and, with the skip strategy, commits what
    it failed to save; scope cluster: every node stopped, every Redis call fails."""
    config = {"persisted_failure_strategy": "skip", "persisted_failure_retries": 1,
              "persisted_failure_backoff_s": 0.2, "processing_timeout_s": 2.0}
    topology = topology_factory(TopologyConfig(broker_nodes=1, redis_replicas_per_master=0, kafka_storage="memory"),
                                broker_config=config)
    broker = topology.brokers[0]
    ctx = FaultContext(topology, seed=4, record=lambda kind, **columns: None)
    client = _client_away_from_leases(topology)
    _offline_subscriber(broker, client, "fp/outage/+")
    publisher = Probe(broker.host, broker.port, "fp_outage_pub")
    publisher.connect(clean=True)
    try:
        outage = _fault("outage-1", "redis_outage", f"redis-master-of:{client}", scope="master")
        evidence = outage.apply(ctx)
        assert evidence.bit, evidence.to_dict()
        publisher.publish("fp/outage/x", b"saved nowhere")
        log = broker.log_path
        assert _wait(lambda: "committing anyway" in log.read_text(errors="replace"), 20), \
            "the broker never gave up: the outage did not outlast its retries"
        healed = outage.heal(ctx)
        assert healed.bit, healed.to_dict()
        seen = next(c for c in healed.checks if c.what == "broker met the outage").observed
        assert seen["counts"].get("gave_up") and seen["counts"].get("committing_anyway"), seen
        assert next(c for c in healed.checks if c.what == "packets dropped").observed["packets"] > 0
        assert _queue_size(topology, client) == 0  # committed anyway: lost, which is what the path does

        whole = _fault("outage-2", "redis_outage", f"redis-master-of:{client}", scope="cluster")
        assert whole.apply(ctx).bit
        publisher.publish("fp/outage/x", b"during the full outage")
        # Longer than the broker's Redis socket timeout (5 s): a stopped node answers nothing, and only a
        # timeout turns that into a failure the broker logs (shorter, the calls just wait and succeed).
        time.sleep(6.5)
        healed = whole.heal(ctx)
        assert healed.bit, healed.to_dict()
    finally:
        publisher.drop()


def test_kafka_killed_while_a_save_is_in_flight(topology_factory):
    topology = topology_factory(TopologyConfig(broker_nodes=1, redis_replicas_per_master=0))  # Tansu on S3
    broker = topology.brokers[0]
    ctx = FaultContext(topology, seed=5, record=lambda kind, **columns: None, ready_timeout_s=30.0)
    _offline_subscriber(broker, "fp_kafka", "fp/kafka/+")
    publisher = Probe(broker.host, broker.port, "fp_kafka_pub")
    publisher.connect(clean=True)
    stop = threading.Event()

    def publish() -> None:
        # Why a stream: the fault waits for a save to be in flight, which needs records on their way.
        n = 0
        while not stop.is_set():
            n += 1
            publisher.publish("fp/kafka/x", f"m{n}".encode(), timeout=0)
            time.sleep(0.1)

    feeder = threading.Thread(target=publish, daemon=True)
    feeder.start()
    try:
        fault = _fault("kafka-1", "kafka_outage_during_save", "kafka", stall_master="redis-master-of:fp_kafka",
                       hold_max_s=8.0)
        evidence = fault.apply(ctx)
        stop.set()
        assert evidence.bit, evidence.to_dict()
        assert evidence.checks[0].observed["blocked"], evidence.to_dict()
        time.sleep(3.0)  # the released save completes; its commit meets a Kafka that is gone
        healed = fault.heal(ctx)
        assert healed.bit, healed.to_dict()
        assert _wait(lambda: _queue_size(topology, "fp_kafka") > 0, 10)
    finally:
        stop.set()
        feeder.join(5)
        publisher.drop()


def test_a_query_of_a_paused_master_is_sent_once(topology):
    """``query`` (every nemesis read and command on one node) gives up after one socket timeout: with redis-py's
    default retries a query of a silent node took ~15 s, and a write command was sent again each time."""
    with _writes_paused(topology) as (host, port, key, connections):
        before = connections()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            query(host, port, "SET", key, "query")
        took = time.monotonic() - started
        sent = connections() - before - 1  # the first INFO's own connection
    assert sent == 1, f"the write was sent on {sent} connections: redis-py retried it"
    assert took < 3.0, f"the query of a paused node took {took:.1f} s (one socket timeout is 1 s)"
