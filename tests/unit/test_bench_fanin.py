"""benchmarks/broker_p2p.py's pure helpers for the fan-in and side-by-side rounds: the workloads, the round
order, the counting of one round's deliveries, the totals over rounds, the ratio and the recorded table."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from benchmarks import broker_p2p as bench
from benchmarks import record


def _delivery(round_no: int, pub: int, seq: int, sent_at: float, at: float) -> tuple[bytes, float]:
    return bench.HEAD.pack(round_no, pub, seq, sent_at) + b"x" * 38, at


def test_fanin_workload_uses_the_plans_topics_and_the_application_rule():
    work = bench.fanin_workload(publishers=3, subscribers=2)
    assert [topic for _, topic in work.publishers] == [f"europe/ua/kyiv/fanin/{j}" for j in range(3)]
    assert {f for _, f, _ in work.subscribers} == {"europe/ua/kyiv/fanin/+"}
    assert all(streams == (0, 1, 2) for _, _, streams in work.subscribers)
    # the subscribers match the APPLICATION rule, P2P's subscribers do not (same broker config for both)
    assert all(fnmatchcase(cid, bench.APP_CLIENT_GLOB) for cid, _, _ in work.subscribers)
    p2p = bench.p2p_workload(2)
    assert not any(fnmatchcase(cid, bench.APP_CLIENT_GLOB) for cid, _, _ in p2p.subscribers)
    assert [(cid, f, s) for cid, f, s in p2p.subscribers] == [
        ("test_sub_client_0_0", "europe/ua/kyiv/0/+", (0,)), ("test_sub_client_1_0", "europe/ua/kyiv/1/+", (1,))]


def test_payload_is_62_bytes_and_carries_round_publisher_and_sequence():
    data = bench.payload(7, 41, round_no=3)
    assert len(data) == bench.PAYLOAD_SIZE
    assert bench.HEAD.unpack_from(data)[:3] == (3, 7, 41)


def test_schedule_alternates_patterns_with_both():
    assert bench.schedule("both", 2) == ["p2p", "fan-in", "p2p", "fan-in"]
    assert bench.schedule("fan-in", 1) == ["fan-in"]
    with pytest.raises(ValueError):
        bench.schedule("fan-out", 1)


def test_tally_counts_lost_duplicates_unexpected_and_earlier_rounds():
    work = bench.fanin_workload(publishers=2, subscribers=2)
    sent = [2, 1]  # publisher 0 sent seq 0 and 1, publisher 1 sent seq 0: 3 owed to each subscriber
    first = [_delivery(5, 0, 0, 100.0, 0.25), _delivery(5, 0, 1, 100.0, 0.5), _delivery(5, 1, 0, 100.0, 0.5),
             _delivery(5, 0, 1, 100.0, 0.75)]                      # all three, one twice
    second = [_delivery(5, 1, 0, 100.0, 0.5), _delivery(4, 0, 0, 90.0, 0.5),   # one, and an earlier round's
              _delivery(5, 1, 9, 100.0, 0.5), (b"short", 0.5)]                 # never sent; not ours
    counts, e2e = bench.tally(work, sent, [first, second], round_no=5, clock_offset=100.0)
    assert counts == {"owed": 6, "delivered_unique": 4, "duplicates": 1, "lost": 2, "unexpected": 2,
                      "from_earlier_rounds": 1}
    assert sorted(e2e) == [0.25, 0.5, 0.5, 0.5]
    assert bench.problems([{"round": 5, "pattern": "fan-in", **counts}]) == [
        "round 5 (fan-in): 2 of 6 owed messages LOST (not delivered by the round's end: --drain-timeout s after "
        "publishing ended)",
        "round 5 (fan-in): 2 deliveries nobody was owed"]


def test_tally_p2p_owes_each_subscriber_its_own_publisher_only():
    work = bench.p2p_workload(2)
    counts, _ = bench.tally(work, [1, 1], [[_delivery(1, 0, 0, 0.0, 0.0)], [_delivery(1, 0, 0, 0.0, 0.0)]],
                            round_no=1, clock_offset=0.0)
    assert (counts["owed"], counts["delivered_unique"], counts["lost"], counts["unexpected"]) == (2, 1, 1, 1)
    assert bench.problems([{"round": 1, "pattern": "p2p", **counts}])


def _round(number: int, pattern: str, published: int, unique: int, wall: float, cpu: float) -> dict:
    return {"round": number, "pattern": pattern, "published": published, "owed": unique, "delivered_unique": unique,
            "duplicates": 0, "lost": 0, "unexpected": 0, "from_earlier_rounds": 0, "wall_s": wall,
            "cpu_s_system": cpu, "cpu_s_broker": cpu / 4,
            **bench.rates(published, unique, wall, cpu, cpu / 4, [0.1], [0.01])}


def test_combine_takes_ratios_of_totals_and_compare_divides_fan_in_by_p2p():
    p2p = [_round(1, "p2p", 100, 100, 10.0, 2.0), _round(3, "p2p", 100, 100, 10.0, 2.0)]
    fan = [_round(2, "fan-in", 100, 300, 10.0, 1.0), _round(4, "fan-in", 100, 300, 10.0, 3.0)]
    p2p_all = bench.combine(p2p, [([0.1, 0.2], [0.01]), ([0.3], [0.02])])
    fan_all = bench.combine(fan, [([0.1], [0.01]), ([0.1], [0.01])])
    assert (p2p_all["published"], p2p_all["wall_s"], p2p_all["msg_s_per_core"]) == (200, 20.0, 100.0)
    assert fan_all["msg_s_per_core"] == 200.0            # 800 messages / 4 CPU s, not the mean of 400 and 133
    assert fan_all["throughput_msg_s_in_plus_out"] == 40.0
    assert p2p_all["e2e_latency_ms_p50"] == 200.0         # over every round's samples
    compared = bench.compare(fan_all, p2p_all, list(zip(fan, p2p, strict=True)))
    assert compared["msg_s_per_core"] == 2.0
    assert compared["msg_s_per_core_by_round"] == [4.0, 1.333]
    assert bench.ratio(1, 0) is None and bench.ratio(None, 2) is None


def test_record_rows_one_column_per_round_pattern_ratio_and_setup():
    p2p = [_round(1, "p2p", 100, 100, 10.0, 2.0)]
    fan = [_round(2, "fan-in", 100, 300, 10.0, 1.0)]
    result = {"pattern": "both", "rate_per_publisher": 20.0, "pairs": 1, "publishers": 1, "subscribers": 3,
              "rounds": p2p + fan, "p2p": bench.combine(p2p, [([0.1], [0.01])]),
              "fan_in": bench.combine(fan, [([0.1], [0.01])]), "settings": {"producer_acks": "1"},
              "run_dir": "/tmp/x"}
    result["fan_in_over_p2p"] = bench.compare(result["fan_in"], result["p2p"], [(fan[0], p2p[0])])
    rows = bench.record_rows(result)
    assert list(rows[0]) == ["figure", "run p2p 1", "run fan-in 2", "run p2p all", "run fan-in all",
                             "run fan-in / p2p", "run setup"]
    by_name = {row["figure"]: row for row in rows}
    assert by_name["msg_s_per_core"]["run fan-in / p2p"] == 4.0
    assert by_name["settings.producer_acks"]["run setup"] == "1"
    assert "run_dir" not in by_name and "round" not in by_name
    assert record.table(rows).startswith("| figure | run p2p 1 |")


def test_record_rows_of_one_p2p_round_stay_two_columns():
    rows = bench.record_rows({"pairs": 20, "msg_s_per_core": 690.5, "run_dir": "/tmp/x"})
    assert rows == [{"figure": "pairs", "value": 20}, {"figure": "msg_s_per_core", "value": 690.5}]
