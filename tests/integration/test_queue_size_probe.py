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


def test_preset_only_into_an_empty_queue(topology, tmp_path):
    """preset_each_offline: the last packet id is set in the same atomic step that sees an empty queue; a
    queue holding messages keeps its id (a jump could collide with a queued message's payload key)."""
    import json

    from harness.snapshot import last_packet_id_key

    prefix, stamp = "ordeal-test:", int(time.time() * 1000)
    empty, busy = f"preset-empty-{stamp}", f"preset-busy-{stamp}"
    cluster = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in topology.redis_startup_nodes()],
                           decode_responses=True)
    try:
        cluster.set(last_packet_id_key(prefix, empty), 30)
        cluster.set(last_packet_id_key(prefix, busy), 40)
        cluster.zadd(messages_key(prefix, busy), {messages_key(prefix, busy) + "_40": 40})
        recorder = HistoryRecorder(tmp_path, run_id="preset")
        probe = QueueSizeProbe(topology.redis_startup_nodes(), prefix, recorder)
        probe.preset_if_empty(empty, 65500)
        probe.preset_if_empty(busy, 65500)
        probe.close()
        recorder.close(reason="test")
        assert cluster.get(last_packet_id_key(prefix, empty)) == "65500"
        assert cluster.get(last_packet_id_key(prefix, busy)) == "40"
    finally:
        for client in (empty, busy):
            cluster.delete(messages_key(prefix, client), last_packet_id_key(prefix, client))
        cluster.close()
    rows = {r["client"]: (r, json.loads(r["detail"])) for r in _snapshot_rows(tmp_path)}
    row, detail = rows[empty]
    assert detail == {"when": "preset", "applied": True, "preset_last_packet_id": 65500,
                      "previous_last_packet_id": 30}
    assert row["zset_size"] == 0 and row["last_packet_id"] is None  # the id only in detail
    row, detail = rows[busy]
    assert detail["applied"] is False and row["zset_size"] == 1 and probe.presets_applied == 1
