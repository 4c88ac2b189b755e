"""The pure half of shared subscriptions: ``$share/{ShareName}/{filter}`` parsing ([MQTT-4.8.2-1], [MQTT-4.8.2-2]) and
the Kafka names TBMQ gives a shared APPLICATION subscription (reference_broker/shared_subs.py)."""

from __future__ import annotations

import hashlib

import pytest

from reference_broker.shared_subs import (
    SharedFilter,
    SharedFilterError,
    granted_shared_qos,
    is_shared,
    parse_shared,
    shared_consumer_group,
    shared_topic,
)


@pytest.mark.parametrize("text, share, topic_filter", [
    ("$share/g/a/b", "g", "a/b"),
    ("$share/consumers/europe/+/kyiv/#", "consumers", "europe/+/kyiv/#"),
    ("$share/g/#", "g", "#"),
    ("$share/g/+", "g", "+"),
    ("$share/g//", "g", "/"),                 # an empty level is a valid filter
    ("$share/a-b.c$d/x", "a-b.c$d", "x"),     # any character but / + # in the ShareName
])
def test_valid_shared_filters_parse(text, share, topic_filter):
    parsed = parse_shared(text)
    assert parsed == SharedFilter(share, topic_filter)
    assert parsed.text == text


@pytest.mark.parametrize("text, words", [
    ("$share//a/b", "ShareName"),             # empty ShareName [MQTT-4.8.2-1]
    ("$share/g+/a", "'+'"),                   # wildcard in the ShareName [MQTT-4.8.2-1]
    ("$share/#/a", "'#'"),
    ("$share/+/a", "'+'"),
    ("$share/g", "no topic filter"),          # no filter [MQTT-4.8.2-2]
    ("$share/g/", "no topic filter"),
    ("$share/g/a/#/b", "not a valid topic filter"),
    ("$share/g/a+", "not a valid topic filter"),
    ("a/b", "starts with"),
])
def test_invalid_shared_filters_name_the_problem(text, words):
    with pytest.raises(SharedFilterError) as error:
        parse_shared(text)
    assert repr(text) in str(error.value) and words in str(error.value)


def test_is_shared_is_the_prefix_only():
    assert is_shared("$share/g/a") and is_shared("$share/")
    assert not is_shared("$SHARE/g/a") and not is_shared("$sys/a") and not is_shared("share/g/a")


def test_shared_topic_is_tbmqs_name():
    # TBMQ MqttApplicationClientUtil.getSharedAppTopic: / -> ., + -> slw, # -> mlw
    assert shared_topic("europe/ua/kyiv/+/0") == "tbmq.msg.app.shared.europe.ua.kyiv.slw.0"
    assert shared_topic("a/#") == "tbmq.msg.app.shared.a.mlw"
    assert shared_topic("test") == "tbmq.msg.app.shared.test"


def test_shared_topic_hashes_characters_kafka_refuses_and_long_names():
    assert shared_topic("a b/c") == "tbmq.msg.app.shared." + hashlib.sha256(b"a b/c").hexdigest()
    assert shared_topic("a-b") == "tbmq.msg.app.shared." + hashlib.sha256(b"a-b").hexdigest()
    long = "x" * 300
    assert shared_topic(long) == "tbmq.msg.app.shared." + hashlib.sha256(long.encode()).hexdigest()
    assert len(shared_topic(long)) <= 249


def test_consumer_group_per_share_name_and_topic():
    assert shared_consumer_group(SharedFilter("g1", "a/+")) == \
        "application-shared-msg-consumer-group-g1-tbmq.msg.app.shared.a.slw"
    # two groups on one filter: one topic, two consumer groups (each its own committed offset)
    one, two = SharedFilter("g1", "a/+"), SharedFilter("g2", "a/+")
    assert shared_topic(one.topic_filter) == shared_topic(two.topic_filter)
    assert shared_consumer_group(one) != shared_consumer_group(two)


def test_granted_qos_is_at_most_one():
    assert [granted_shared_qos(q) for q in (0, 1, 2)] == [0, 1, 1]
