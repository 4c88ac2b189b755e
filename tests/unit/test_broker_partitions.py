"""Partition ownership math of the broker nodes (reference_broker/kafka_path.py)."""

from __future__ import annotations

from reference_broker.kafka_path import desired_partitions, live_nodes


def test_live_nodes_drop_stale_heartbeats_and_sort():
    nodes = {"broker-2": {"ts": 9_000}, "broker-1": {"ts": 9_500}, "broker-3": {"ts": 1_000}}
    assert live_nodes(nodes, now_ms=10_000, lease_s=5) == ["broker-1", "broker-2"]


def test_partitions_split_without_overlap_or_gap():
    live = ["broker-1", "broker-2", "broker-3"]
    parts = [desired_partitions(n, live, 16) for n in live]
    assert set().union(*parts) == set(range(16))
    assert sum(len(p) for p in parts) == 16
    assert desired_partitions("broker-2", live, 16) == {1, 4, 7, 10, 13}


def test_alone_or_not_yet_registered():
    assert desired_partitions("broker-1", ["broker-1"], 4) == {0, 1, 2, 3}
    assert desired_partitions("broker-9", [], 3) == {0, 1, 2}
    assert desired_partitions("broker-9", ["broker-1"], 3) == set()
