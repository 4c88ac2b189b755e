"""The fan-out's topic trie agrees with the plain MQTT matcher on many filters and topics."""

from __future__ import annotations

import itertools

from reference_broker.codec import topic_matches
from reference_broker.topic_index import TopicIndex

FILTERS = ["#", "+", "a", "a/#", "a/+", "a/b", "a/+/c", "+/b/#", "+/+", "a/b/c/#", "/#", "+/", "$SYS/#", "$SYS/+"]
TOPICS = ["a", "a/b", "a/b/c", "a/x/c", "b/b", "b/b/z", "/", "/x", "a/", "$SYS/load", "x", "a/b/c/d"]


def test_trie_matches_like_the_plain_matcher():
    for size in (1, 2, 3):
        for chosen in itertools.combinations(FILTERS, size):
            subscriptions = {f"c{i}": {"filters": {flt: i % 3}} for i, flt in enumerate(chosen)}
            index = TopicIndex(subscriptions)
            for topic in TOPICS:
                expected = {c: rec["filters"][next(iter(rec["filters"]))]
                            for c, rec in subscriptions.items() if topic_matches(next(iter(rec["filters"])), topic)}
                assert index.match(topic) == expected, (chosen, topic)


def test_highest_qos_of_one_clients_overlapping_filters():
    index = TopicIndex({"s": {"filters": {"europe/ua/kyiv/1/+": 1, "europe/#": 2, "europe/ua/+/1/0": 0}}})
    assert index.match("europe/ua/kyiv/1/0") == {"s": 2}
    assert index.match("asia/x") == {}


def test_p2p_pattern():
    index = TopicIndex({f"test_sub_client_{i}_0": {"filters": {f"europe/ua/kyiv/{i}/+": 1}} for i in range(1000)})
    assert index.match("europe/ua/kyiv/7/0") == {"test_sub_client_7_0": 1}


def test_no_local_grant_ignores_no_local_filters_only():
    """[MQTT-3.8.3-3] for the publisher's own message: the highest QoS among its matching filters without
    No Local; None when only No Local filters match."""
    from reference_broker.kafka_path import not_local_grant

    record = {"filters": {"a/+": 1, "a/#": 2, "b/x": 1}, "no_local": ["a/#"]}
    assert not_local_grant(record, "a/1") == 1          # a/# (QoS 2) is No Local, a/+ is not
    assert not_local_grant({**record, "no_local": ["a/#", "a/+"]}, "a/1") is None
    assert not_local_grant(record, "a/1/2") is None     # only a/# matches, and it is No Local
    assert not_local_grant({**record, "no_local": []}, "a/1") == 2
