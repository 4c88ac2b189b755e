"""Faults against the broker configured for durability (retry forever, WAIT for a replica): a Redis master
killed mid-stream, and a broker node killed with its clients moving to the other node.  Nothing whose
PUBACK the publisher received may be missing at the subscriber after the drain.  The numbers measured are
printed (run with -s to see them)."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import uuid

import pytest
import test_broker_flow
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_broker_flow import FILTER, TOPIC, RawClient, payloads

from harness.recording_client import Probe
from reference_broker import codec

pytestmark = pytest.mark.integration
brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests

DURABLE = {"incoming_failure_strategy": "retry_forever", "persisted_failure_strategy": "retry_forever",
           "incoming_failure_backoff_s": 0.3, "persisted_failure_backoff_s": 0.3, "producer_acks": "all"}


def _numbers_in_topics(bootstrap: str, topics: list[str]) -> list[set[int]]:
    """The message numbers each topic holds (read from offset 0 to its end by harness/kafka.py)."""
    from harness.kafka import topics_backlog

    reads = topics_backlog(bootstrap, {topic: f"ordeal-broker-{topic}" for topic in topics})
    return [{int(base64.b64decode(json.loads(value)["payload"])[1:])
             for records in reads[topic].get("records", {}).values() for _offset, value in records}
            for topic in topics]


def where_lost_messages_are(cluster, client: str, lost: set[int]) -> str:
    """For a failing loss assertion: which hop the lost messages got to (incoming topic, persisted topic,
    the subscriber's Redis queue), so the message says whose fault it is."""
    incoming, persisted = _numbers_in_topics(cluster.topology.kafka_bootstrap(),
                                             [cluster.settings["incoming_topic"], cluster.settings["persisted_topic"]])
    stored = set()
    for member in cluster.redis.zrange(cluster.key(client, "messages"), 0, -1):
        raw = cluster.redis.get(member)
        if raw:
            stored.add(int(base64.b64decode(json.loads(raw)["payload"])[1:]))
    pick = lambda found: sorted(n for n in lost if n in found)[:20]  # noqa: E731
    return (f"lost {len(lost)}: {sorted(lost)[:20]}; the incoming topic holds {len(incoming)} numbers, the "
            f"persisted topic {len(persisted)}, Redis {len(stored)}; of the lost in the incoming topic {pick(incoming)}, in the "
            f"persisted topic {pick(persisted)}, still stored in Redis {pick(stored)} "
            f"(last packet id {cluster.redis.get(cluster.key(client, 'last_packet_id'))})")


class Publisher(threading.Thread):
    """Publishes numbered QoS 1 messages at a fixed rate; on a failure reconnects (to the next address)
    and goes on with the next number.  Records which numbers were acknowledged."""

    def __init__(self, addresses: list[tuple[str, int]], count: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.addresses, self.count, self.rate = addresses, count, rate
        self.acked: list[int] = []
        self.failed: list[int] = []
        self.probe: Probe | None = None
        self.target = 0

    def _connect(self) -> None:
        for _ in range(40):
            host, port = self.addresses[self.target % len(self.addresses)]
            self.probe = Probe(host, port, "fault-publisher", version=5)
            try:
                self.probe.connect(clean=True, timeout=3)
                return
            except Exception:  # noqa: BLE001 - that node is down: try the next one
                self.target += 1
                time.sleep(0.25)
        raise RuntimeError("publisher could not reconnect")

    def run(self) -> None:
        self._connect()
        for seq in range(self.count):
            try:
                self.probe.publish(TOPIC, b"s%05d" % seq, 1, timeout=3)
                self.acked.append(seq)
            except Exception:  # noqa: BLE001 - indeterminate: not owed, may still arrive
                self.failed.append(seq)
                self.probe.drop()
                self.target += 1
                self._connect()
            time.sleep(1 / self.rate)
        self.probe.disconnect()


def drain(cluster, client_id: str, node: int, expected: set[int], before: Probe, timeout: float = 30.0):
    """Reconnect the persistent subscriber and collect until every expected number arrived (or time out)."""
    sub = cluster.probe(client_id, node=node, version=5)
    sub.connect(clean=False, session_expiry=3600)
    deadline = time.monotonic() + timeout
    earlier = {int(d.payload[1:]) for d in before.deliveries}
    while time.monotonic() < deadline:
        seen = earlier | {int(d.payload[1:]) for d in sub.deliveries}
        if expected <= seen:
            break
        time.sleep(0.2)
    sub.settle(0.5)
    return sub


def test_redis_master_killed_mid_stream_loses_nothing_acknowledged(brokers, topology):
    cluster = brokers(redis_wait_replicas=1, redis_wait_timeout_ms=500, **DURABLE)
    sub = cluster.probe(version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(FILTER, 1)
    master = topology.redis.master_for_key(cluster.key(sub.client_id, "messages"))
    node = cluster.nodes[0]
    publisher = Publisher([(node.host, node.port)], count=150, rate=60)
    publisher.start()
    killed_at = None
    try:
        time.sleep(0.8)
        killed_at = time.monotonic()
        master.kill()
        time.sleep(3.0)                                 # the replica takes over meanwhile
        master.start()                                   # back as a replica: WAIT can succeed again
        master.wait_ready(15)
        publisher.join(60)
    finally:
        if not master.is_alive():
            master.start()
            master.wait_ready(15)
        topology.redis.wait_ready(30)
    assert not publisher.is_alive()
    sub.drop()
    acked = set(publisher.acked)
    final = drain(cluster, sub.client_id, 0, acked, sub)
    seen = [int(d.payload[1:]) for d in sub.deliveries + final.deliveries]
    lost = acked - set(seen)
    duplicates = len(seen) - len(set(seen))
    took = time.monotonic() - killed_at
    print(f"\nredis master killed: published {publisher.count}, acked {len(acked)}, "
          f"failed {len(publisher.failed)}, delivered {len(set(seen))} unique, duplicates {duplicates}, "
          f"lost {len(lost)}, kill-to-drained {took:.1f} s")
    assert len(acked) > 100
    assert lost == set(), f"acknowledged but never delivered: {sorted(lost)[:20]}"


def test_broker_node_killed_clients_move_and_nothing_acknowledged_is_lost(brokers):
    cluster = brokers(count=2, **DURABLE)
    first, second = cluster.nodes
    sub = cluster.probe(node=0, version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(FILTER, 1)
    publisher = Publisher([(first.host, first.port), (second.host, second.port)], count=150, rate=60)
    publisher.start()
    time.sleep(1.0)
    killed_at = time.monotonic()
    first.kill()                                        # SIGKILL: its leases run out after 2 s
    sub.drop()
    publisher.join(60)
    assert not publisher.is_alive()
    acked = set(publisher.acked)
    final = drain(cluster, sub.client_id, 1, acked, sub)
    seen = [int(d.payload[1:]) for d in sub.deliveries + final.deliveries]
    lost = acked - set(seen)
    took = time.monotonic() - killed_at
    print(f"\nbroker node killed: published {publisher.count}, acked {len(acked)}, failed "
          f"{len(publisher.failed)}, delivered {len(set(seen))} unique, duplicates {len(seen) - len(set(seen))}, "
          f"lost {len(lost)}, kill-to-drained {took:.1f} s")
    assert len(acked) > 100
    assert lost == set(), f"acknowledged but never delivered: {sorted(lost)[:20]}"


def test_kafka_broker_killed_service_resumes_and_loss_is_measured(brokers, topology):
    """Tansu SIGKILLed and restarted mid-stream.  Measured on this machine: Tansu over S3 loses records it
    had acknowledged before the kill and reuses their offsets (a fresh consumer reading the topic from the
    start does not find them).  Messages acknowledged just before the kill are then lost whatever the
    broker does, and so are the first ones written after the restart into the reused offsets, which a
    consumer already past them skips.  That loss is printed, not asserted.  Asserted: the broker recovers
    by itself, delivers at least 90 % of what was acknowledged after the restart, and all of the last 50."""
    cluster = brokers(**DURABLE)
    sub = cluster.probe(version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(FILTER, 1)
    node = cluster.nodes[0]
    publisher = Publisher([(node.host, node.port)], count=160, rate=40)
    publisher.start()
    try:
        time.sleep(1.0)
        killed_at = time.monotonic()
        before_kill = set(publisher.acked)
        topology.kafka.kill()
        time.sleep(1.0)
        topology.kafka.start()
        topology.kafka.wait_ready(30)
        time.sleep(1.0)
        after_restart_from = len(publisher.acked)
        publisher.join(90)
    finally:
        if not topology.kafka.is_alive():
            topology.kafka.start()
            topology.kafka.wait_ready(30)
    assert not publisher.is_alive()
    after_restart = set(publisher.acked[after_restart_from:])
    deadline = time.monotonic() + 30
    while not set(publisher.acked[-50:]) <= {int(d.payload[1:]) for d in sub.deliveries} \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    sub.settle(1.0)
    seen = {int(d.payload[1:]) for d in sub.deliveries}
    print(f"\nkafka killed 1 s: published {publisher.count}, acked {len(publisher.acked)}, failed "
          f"{len(publisher.failed)}, acked before the kill {len(before_kill)} of which lost "
          f"{len(before_kill - seen)}, acked around the outage lost {len(set(publisher.acked) - seen - before_kill)}, "
          f"acked after the restart {len(after_restart)} of which lost {len(after_restart - seen)}, "
          f"kill-to-drained {time.monotonic() - killed_at:.1f} s")
    assert len(after_restart) > 60
    assert len(after_restart - seen) <= len(after_restart) // 10, sorted(after_restart - seen)
    last = set(publisher.acked[-50:])
    assert last <= seen, f"acknowledged at the end, never delivered: {sorted(last - seen)}"


@pytest.mark.parametrize("pause_s", [4.0, 8.0], ids=["2-leases", "declared-dead"])
def test_broker_node_paused_beyond_its_lease_loses_nothing(brokers, pause_s):
    """SIGSTOP of the node holding the subscriber (and half the partitions) for 2 leases, or long enough
    (> 3 leases) to be declared dead and have its sessions released: the other node takes the partitions
    over; after SIGCONT the paused node takes its sessions back and both run on.  Nothing acknowledged is
    lost."""
    cluster = brokers(count=2, **DURABLE)
    paused, other = cluster.nodes
    sub = cluster.probe(node=0, version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(FILTER, 1)
    publisher = Publisher([(other.host, other.port)], count=150, rate=50)
    publisher.start()
    time.sleep(0.8)
    paused.pause()
    try:
        time.sleep(pause_s)                              # lease 2 s: its partitions move meanwhile
    finally:
        paused.resume()
        resumed_at = time.monotonic()
    publisher.join(60)
    acked = set(publisher.acked)
    deadline = time.monotonic() + 30
    while not acked <= {int(d.payload[1:]) for d in sub.deliveries} and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = [int(d.payload[1:]) for d in sub.deliveries]
    lost = acked - set(seen)
    last = max((d.at for d in sub.deliveries), default=resumed_at)
    print(f"\nbroker node paused {pause_s:.0f} s: published {publisher.count}, acked {len(acked)}, delivered "
          f"{len(set(seen))} unique, duplicates {len(seen) - len(set(seen))}, lost {len(lost)}, "
          f"last delivery {last - resumed_at:.1f} s after the resume (the publisher waits for each PUBACK)")
    assert len(acked) > 100
    assert lost == set(), where_lost_messages_are(cluster, sub.client_id, lost)
    if pause_s > 6:
        assert "sessions reasserted" in cluster.log(0) and "is dead: released 1" in cluster.log(1)
        assert cluster.redis.hget(cluster.key(sub.client_id, "session"), "node") == b"broker-1"


def test_sessions_of_a_dead_node_are_released_and_expire(brokers):
    """A node SIGKILLed with an MQTT 5 client connected (session expiry 2 s): after 3 leases the other
    node releases the session, and it expires 2 s later (messages and all)."""
    cluster = brokers(count=2, partition_lease_s=1.0)
    sub = cluster.probe(node=0, version=5)
    sub.connect(clean=True, session_expiry=2)
    sub.subscribe(FILTER, 1)
    survivor = cluster.probe(node=1, version=5)
    survivor.connect(clean=True, session_expiry=600)
    cluster.nodes[0].kill()
    sub.drop()
    pub = cluster.probe(node=1, version=4)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"for-the-dead", 1)
    assert len(cluster.wait_stored(sub.client_id, 1)) == 1
    session_key = cluster.key(sub.client_id, "session")
    deadline = time.monotonic() + 15
    while cluster.redis.exists(session_key) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not cluster.redis.exists(session_key)
    assert cluster.stored_ids(sub.client_id) == [] and cluster.payload_keys(sub.client_id) == set()
    assert cluster.redis.exists(cluster.key(survivor.client_id, "session"))   # the living are untouched
    assert "released 1 of its sessions" in cluster.log(1)


class KillOnFirstWrite(threading.Thread):
    """SIGKILLs a broker node the moment Redis reports the first write to one key (a keyspace
    notification on the key's master), so the node dies in the middle of whatever step wrote it."""

    def __init__(self, cluster, key: str, node) -> None:
        super().__init__(daemon=True)
        import redis

        self.node = node
        self.fired = threading.Event()
        master = cluster.redis.get_node_from_key(key)
        self.admin = redis.Redis(master.host, master.port)
        self.old_setting = self.admin.config_get("notify-keyspace-events")["notify-keyspace-events"]
        self.admin.config_set("notify-keyspace-events", "Kgh")   # keyspace events of generic and hash commands
        self.sock = socket.create_connection((master.host, master.port), timeout=10)
        channel = f"__keyspace@0__:{key}".encode()
        self.sock.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel))
        confirmation = b""
        while b":1\r\n" not in confirmation:   # the subscribe reply ends with the channel count
            confirmation += self.sock.recv(4096)

    def run(self) -> None:
        with contextlib.suppress(OSError):
            if self.sock.recv(4096):          # any notification: the key was just written
                self.node.kill()
                self.fired.set()

    def close(self) -> None:
        self.sock.close()
        self.admin.config_set("notify-keyspace-events", self.old_setting)
        self.admin.close()


def test_node_killed_during_a_resuming_connect_keeps_the_session(brokers):
    """A persistent subscriber resumes its session on node 2, which is SIGKILLed while its CONNECT writes
    the session record (chaos-mix seed 1: durability.session_lost).  Reconnecting to node 1 must still
    find the session: session present = 1, the offline backlog and the subscription."""
    cluster = brokers(count=2)
    first, second = cluster.nodes
    client_id = f"resume-{uuid.uuid4().hex[:6]}"
    sub = cluster.probe(client_id, node=0, version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(FILTER, 1)
    sub.disconnect()
    session_key = cluster.key(client_id, "session")
    deadline = time.monotonic() + 5
    while cluster.redis.hget(session_key, "conn") != b"" and time.monotonic() < deadline:
        time.sleep(0.05)
    pub = cluster.probe(node=0, version=4)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"backlog", 1)
    assert len(cluster.wait_stored(client_id, 1)) == 1

    killer = KillOnFirstWrite(cluster, session_key, second)
    try:
        killer.start()
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        raw = RawClient(second.host, second.port)
        raw.send(codec.Connect(codec.MQTT5, client_id, False, 30, properties))
        assert killer.fired.wait(10), "node 2 never wrote the session record"
        raw.close()
    finally:
        killer.close()
    assert not second.is_alive()

    resumed = cluster.probe(client_id, node=0, version=5)
    assert resumed.connect(clean=False, session_expiry=3600) is True, "session present = 0: session lost"
    assert payloads(resumed.wait_for(1)) == [b"backlog"]
    pub.publish(TOPIC, b"after", 1)                     # the subscription survived too
    assert payloads(resumed.wait_for(2)) == [b"backlog", b"after"]
