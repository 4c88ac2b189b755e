"""The white-box queue-size probe (harness/snapshot.QueueSizeProbe) against the real Redis Cluster: it records
the size of a client's message ZSET just before a persistent session resumes, which is how
``limits.over_limit`` sees a broker that keeps limit + 1 while the subscriber is away."""

import time

import pytest
from redis.cluster import ClusterNode, RedisCluster

from contracts.history_schema import Kind
from harness.history import HistoryRecorder, read_history
from harness.snapshot import QueueSizeProbe, messages_key

pytestmark = pytest.mark.integration


def _snapshot_rows(directory):
    table = read_history(directory).to_pylist()
    return [r for r in table if r["kind"] == Kind.SESSION_SNAPSHOT]


def test_probe_records_the_queue_size_of_the_session(topology, tmp_path):
    client = f"probe-{int(time.time() * 1000)}"
    cluster = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in topology.redis_startup_nodes()],
                           decode_responses=True)
    try:
        cluster.zadd(messages_key("ordeal-test:", client), {f"m{i}": i for i in range(1, 8)})
        recorder = HistoryRecorder(tmp_path, run_id="probe")
        probe = QueueSizeProbe(topology.redis_startup_nodes(), "ordeal-test:", recorder)
        probe(client, "plan")
        probe(f"{client}-empty", "drain")
        probe.close()
        recorder.close(reason="test")
    finally:
        cluster.delete(messages_key("ordeal-test:", client))
        cluster.close()
    rows = {r["client"]: r for r in _snapshot_rows(tmp_path)}
    assert rows[client]["zset_size"] == 7
    assert rows[f"{client}-empty"]["zset_size"] == 0
    assert '"before_reconnect"' in rows[client]["detail"]
    # Only the size: the post-drain white-box counts must not be judged on a mid-run probe.
    assert rows[client]["last_packet_id"] is None and rows[client]["orphan_payloads"] is None


def test_probe_without_redis_records_nothing_and_does_not_raise(tmp_path):
    recorder = HistoryRecorder(tmp_path, run_id="probe")
    probe = QueueSizeProbe([("127.0.0.1", 1)], "", recorder)  # nothing listens on port 1
    probe("c1", "plan")
    probe.close()
    recorder.close(reason="test")
    assert probe.failed == 1 and probe.recorded == 0
    assert _snapshot_rows(tmp_path) == []
