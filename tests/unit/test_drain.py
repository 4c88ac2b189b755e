"""harness/drain.py: when the drain may end, and which deliveries are still owed."""

from __future__ import annotations

import pytest

from harness.drain import OUTSTANDING_QUIET, QUIET, TIMEOUT, DrainRule, OutstandingDeliveries, drain_decision

RULE = DrainRule(quiet_s=2.0, timeout_s=60.0)


def decide(**kwargs):
    values = {"elapsed_s": 5.0, "quiet_for_s": 0.0, "all_up": True, "outstanding": 0, **kwargs}
    return drain_decision(RULE, **values)


def test_outstanding_quiet_is_three_quiets_but_at_least_ten_seconds():
    assert DrainRule(2.0, 60.0).outstanding_quiet_s == 10.0
    assert DrainRule(6.0, 60.0).outstanding_quiet_s == 18.0


def test_quiet_with_nothing_owed_ends_after_quiet_s():
    assert decide(quiet_for_s=1.9) is None
    assert decide(quiet_for_s=2.0) == QUIET


def test_owed_deliveries_keep_the_drain_waiting_until_the_long_quiet():
    assert decide(quiet_for_s=2.0, outstanding=3) is None
    assert decide(quiet_for_s=9.9, outstanding=3) is None
    assert decide(quiet_for_s=10.0, outstanding=3) == OUTSTANDING_QUIET


def test_a_subscriber_not_back_keeps_the_drain_waiting_until_timeout():
    assert decide(quiet_for_s=30.0, all_up=False) is None
    assert decide(quiet_for_s=30.0, all_up=False, elapsed_s=60.0) == TIMEOUT


def test_timeout_wins_over_a_pipeline_that_never_goes_quiet():
    assert decide(quiet_for_s=0.1, elapsed_s=59.9, outstanding=1) is None
    assert decide(quiet_for_s=0.1, elapsed_s=60.0, outstanding=1) == TIMEOUT


@pytest.mark.parametrize("quiet, timeout", [(0.0, 10.0), (-1.0, 10.0), (5.0, 4.0)])
def test_bad_rule_is_refused_with_the_values(quiet, timeout):
    with pytest.raises(ValueError, match="quiet_s|timeout_s"):
        DrainRule(quiet, timeout)


SUBSCRIBERS = [("s1", [("t/#", 1)]), ("s2", [("t/a", 0)]), ("s3", [("other/+", 2)])]
GROUP = "$share/g/t/#"


def test_an_ack_is_owed_to_matching_subscribers_with_effective_qos_above_zero():
    owed = OutstandingDeliveries(member_of={"s4": frozenset({GROUP})})
    owed.acknowledged("p1", 1, "t/a", 1, [*SUBSCRIBERS, ("s4", [(GROUP, 1)])])
    # s2 subscribed at QoS 0, s3 does not match, s4's shared group is owed it once (tests/unit/test_shared_workload.py)
    assert owed.owed == {("s1", "p1", 1), (GROUP, "p1", 1)}
    owed.acknowledged("p1", 2, "t/a", 0, SUBSCRIBERS)
    assert owed.count == 2  # QoS 0 publishes are never owed
    owed.delivered("s1", "p1", 1)
    owed.delivered("s4", "p1", 1)
    assert owed.count == 0


def test_a_delivery_that_overtakes_its_ack_is_not_owed_afterwards():
    owed = OutstandingDeliveries()
    owed.delivered("s1", "p1", 7)
    owed.acknowledged("p1", 7, "t/x", 2, SUBSCRIBERS)
    assert owed.count == 0


def test_the_remembered_deliveries_are_bounded_to_two_generations():
    """A delivery that overtook its ack is remembered while fewer than ``generation`` to 2 x ``generation`` others
    came after it; the memory of deliveries stays bounded however long the run (the soak's RSS)."""
    owed = OutstandingDeliveries(generation=3)
    owed.delivered("s1", "p1", 1)  # overtakes its ack
    for seq in range(2, 5):  # three more: the first generation is full, the second begins
        owed.delivered("s1", "p1", seq)
    owed.acknowledged("p1", 1, "t/x", 1, SUBSCRIBERS)
    assert owed.count == 0  # still remembered (the previous generation)
    for seq in range(5, 12):
        owed.delivered("s1", "p1", seq)
    assert len(owed.seen) + len(owed.seen_before) <= 2 * 3
    owed.acknowledged("p1", 1, "t/x", 1, SUBSCRIBERS)
    assert owed.owed == {("s1", "p1", 1)}  # forgotten: owed again (the drain's outstanding_quiet ends the wait)


def test_undecodable_deliveries_change_nothing():
    owed = OutstandingDeliveries()
    owed.acknowledged("p1", 1, "t/a", 1, SUBSCRIBERS)
    owed.delivered("s1", None, None)
    assert owed.count == 1


def _record(publisher: str, seq: int) -> bytes:
    import base64
    import json

    from contracts.payload import Identity, encode

    payload = encode(Identity(publisher_index=0, seq=seq, send_wall_us=1), 40)
    return json.dumps({"publisher": publisher, "payload": base64.b64encode(payload).decode()}).encode()


def test_kafka_backlog_tells_lost_from_still_in_the_pipeline():
    from harness.kafka import backlog_summary, record_identity

    assert record_identity(_record("p", 7)) == ("p", 7)
    assert record_identity(b"not json") is None and record_identity(b'{"payload": "AAAA"}') is None
    read = {"records": {0: [(0, _record("p", 1)), (1, _record("p", 2))], 1: [(0, _record("p", 3)), (1, b"x")]},
            "committed": {0: 1, 1: None}}  # partition 0 consumed up to offset 1; partition 1 never committed
    summary = backlog_summary({"t": read}, acked={("p", 1), ("p", 2), ("p", 3), ("p", 4)})["t"]
    assert summary["records"] == 4 and summary["unconsumed"] == 3  # offset 1 of p0, both of p1
    assert summary["acked_missing"] == 1 and summary["acked_missing_first"] == [("p", 4)]
    assert summary["acked_unconsumed"] == 2  # seqs 2 and 3


def test_owed_records_still_in_kafka_are_counted_once_across_topics():
    from harness.kafka import owed_in_backlog

    incoming = {"records": {0: [(0, _record("p", 1)), (1, _record("p", 2))]}, "committed": {0: 1}}
    persisted = {"records": {0: [(0, _record("p", 2)), (1, _record("p", 3))]}, "committed": {0: 0}}
    owed = {("p", 1), ("p", 2), ("p", 3), ("p", 9)}
    assert owed_in_backlog({"in": incoming, "out": persisted}, owed) == 2  # p2 (both topics) and p3
    assert owed_in_backlog({"in": incoming, "out": {"error": "closed"}}, owed) == 1
    assert owed_in_backlog({"in": {"error": "closed"}}, owed) is None


def test_the_pipeline_wait_goes_on_only_while_kafka_holds_owed_records_and_they_move():
    from harness.drain import pipeline_wait_decision

    assert pipeline_wait_decision(owed=5, in_kafka=None, previous=None) == "kafka_unreadable"
    assert pipeline_wait_decision(owed=5, in_kafka=0, previous=None) == "pipeline_empty"  # lost or last hop
    assert pipeline_wait_decision(owed=144, in_kafka=114, previous=None) is None  # first read: wait
    assert pipeline_wait_decision(owed=69, in_kafka=36, previous=(144, 114)) is None  # moving
    assert pipeline_wait_decision(owed=144, in_kafka=100, previous=(144, 114)) is None  # Kafka side moving
    assert pipeline_wait_decision(owed=60, in_kafka=114, previous=(144, 114)) is None  # deliveries moving
    assert pipeline_wait_decision(owed=144, in_kafka=114, previous=(144, 114)) == "pipeline_stalled"


def test_a_topic_read_empty_counts_as_unreadable_not_as_an_empty_pipeline():
    from harness.kafka import owed_in_backlog

    empty = {"records": {}, "committed": {0: 5}}
    assert owed_in_backlog({"in": empty, "out": {"records": {0: []}, "committed": {}}}, {("p", 1)}) is None
    from harness.kafka import backlog_summary

    assert "no conclusion" in backlog_summary({"t": empty}, {("p", 1)})["t"]["error"]


def test_a_read_short_of_the_committed_offsets_is_partial():
    from harness.kafka import backlog_summary, owed_in_backlog, read_is_complete

    short = {"records": {0: [(0, _record("p", 1)), (1, _record("p", 2))]}, "committed": {0: 5}}
    assert not read_is_complete(short)  # the group committed offset 5, the read stopped at offset 1
    assert owed_in_backlog({"t": short}, {("p", 2)}) is None
    assert "no conclusion" in backlog_summary({"t": short}, {("p", 9)})["t"]["error"]
    assert read_is_complete({"records": {0: [(0, _record("p", 1))]}, "committed": {0: 1, 1: None}})


def test_the_broker_topics_come_from_the_node_configs_broker_table(tmp_path):
    import json

    from harness.run import _broker_topics

    assert _broker_topics(tmp_path) == ["tbmq.msg.all", "tbmq.msg.persisted"]  # no config: the defaults
    (tmp_path / "broker-config.json").write_text(json.dumps(
        {"broker": {"incoming_topic": "in.x"}, "kafka_bootstrap": "127.0.0.1:9092", "redis_startup_nodes": []}))
    assert _broker_topics(tmp_path) == ["in.x", "tbmq.msg.persisted"]


def test_a_fresh_session_forgets_what_the_old_one_was_owed():
    owed = OutstandingDeliveries()
    subs = [("sub-a", [("t/#", 1)]), ("sub-b", [("t/#", 1)])]
    owed.acknowledged("pub", 1, "t/x", 1, subs)
    owed.acknowledged("pub", 2, "t/x", 1, subs)
    owed.forget("sub-a")  # sub-a reconnected with clean start: its old queue is gone, legally
    assert owed.owed == {("sub-b", "pub", 1), ("sub-b", "pub", 2)}
