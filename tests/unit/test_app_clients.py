"""APPLICATION clients of the reference broker, the pure parts: the client type, the per-client topic's name, the
packet ids, the committable prefix and the ack strategies (reference_broker/application.py), and their config."""

from __future__ import annotations

import hashlib

import pytest

from reference_broker.application import (
    APPLICATION,
    DEVICE,
    AckStrategy,
    AppClientRule,
    acked_prefix_end,
    app_consumer_group,
    app_topic,
    classify,
    packet_id_for,
)
from reference_broker.config import BrokerConfig, ConfigError

RULES = (AppClientRule(client_id="analytics-*"), AppClientRule(username="integration"),
         AppClientRule(client_id="etl?", username="etl"))


@pytest.mark.parametrize(("client_id", "username", "expected"), [
    ("analytics-1", None, APPLICATION),          # client-id glob
    ("analytics", None, DEVICE),                 # the glob needs the dash
    ("test_sub_client_1_0", "integration", APPLICATION),   # user name alone
    ("test_sub_client_1_0", "Integration", DEVICE),        # exact, case-sensitive
    ("etl1", "etl", APPLICATION),                # both fields must fit
    ("etl1", None, DEVICE),
    ("etl12", "etl", DEVICE),
])
def test_classify_by_client_id_glob_and_user_name(client_id, username, expected):
    assert classify(RULES, client_id, username) == expected


def test_no_rules_means_every_client_is_a_device():
    assert classify((), "anything", "anyone") == DEVICE


@pytest.mark.parametrize(("client_id", "topic"), [
    ("app1", "tbmq.msg.app.app1"),
    ("AbC09", "tbmq.msg.app.AbC09"),
])
def test_alphanumeric_client_ids_name_the_topic(client_id, topic):
    assert app_topic(client_id) == topic


@pytest.mark.parametrize("client_id", ["app-1", "app_1", "a.b", "ü", "a b", "x/y", "a" * 300])
def test_other_client_ids_are_hashed_into_a_legal_kafka_topic(client_id):
    topic = app_topic(client_id)
    assert topic == "tbmq.msg.app." + hashlib.sha256(client_id.encode()).hexdigest()
    assert len(topic) <= 249 and all(c.isalnum() or c in "._-" for c in topic)


def test_consumer_group_is_tbmqs():
    assert app_consumer_group("app1") == "application-persisted-msg-consumer-group-app1"


def test_packet_ids_follow_offsets_and_skip_zero():
    assert [packet_id_for(o) for o in (0, 1, 65533, 65534, 65535, 65536)] == [1, 2, 65534, 65535, 1, 2]
    window = [packet_id_for(o) for o in range(70000, 70000 + 65535)]
    assert len(set(window)) == 65535 and 0 not in window


@pytest.mark.parametrize(("done", "expected"), [
    (set(), None),              # nothing acknowledged
    ({11, 12}, None),           # a gap at the start: nothing committable (TBMQ #320 committed over it)
    ({10}, 11),
    ({10, 11, 13}, 12),         # only the contiguous prefix
    ({10, 11, 12, 13}, 14),     # the whole pack: one past its last offset
])
def test_commit_only_the_acknowledged_prefix(done, expected):
    assert acked_prefix_end([10, 11, 12, 13], done) == expected


def test_retry_strategy_enforces_its_cap_over_the_whole_pack():
    strategy = AckStrategy("retry", 3)
    decisions = [strategy.on_timeout() for _ in range(4)]
    assert [d.commit_all for d in decisions] == [False, False, False, True]
    assert [d.retry for d in decisions] == [1, 2, 3, 4]


def test_retry_zero_waits_forever_and_skip_gives_up_at_once():
    forever = AckStrategy("retry", 0)
    assert not any(forever.on_timeout().commit_all for _ in range(1000))
    assert AckStrategy("skip", 3).on_timeout().commit_all


def test_config_reads_rules_and_round_trips():
    config = BrokerConfig.from_mapping({"application_clients": [{"client_id": "app*"}, {"username": "u"}],
                                        "application_ack_strategy": "skip", "application_retries": 0})
    assert config.application_clients == (AppClientRule("app*"), AppClientRule(username="u"))
    assert config.to_dict()["application_clients"] == [{"client_id": "app*"}, {"username": "u"}]
    assert BrokerConfig.from_mapping(config.to_dict()) == config
    assert BrokerConfig().application_ack_strategy == "retry" and BrokerConfig().application_retries == 3


@pytest.mark.parametrize(("settings", "message"), [
    ({"application_clients": "app*"}, "application_clients = 'app*': expected a list of tables"),
    ({"application_clients": [{"clientid": "a"}]}, "application_clients[0]: unknown key(s) clientid"),
    ({"application_clients": [{}]}, "application_clients[0]: empty rule"),
    ({"application_clients": [{"username": ""}]}, "application_clients[0].username = '': expected a non-empty"),
    ({"application_clients": ["app*"]}, "application_clients[0] = 'app*': expected a table"),
    ({"application_ack_strategy": "RETRY_ALL"}, "application_ack_strategy = 'RETRY_ALL': expected one of 'retry', "
                                                "'skip'"),
    ({"application_retries": -1}, "application_retries = -1: expected an integer in 0..1000000"),
    ({"application_pack_timeout_s": 0}, "application_pack_timeout_s = 0.0: expected a number > 0"),
    ({"application_poll_max_records": 70000}, "application_poll_max_records = 70000: expected an integer in "
                                              "1..65535"),
])
def test_bad_application_settings_are_refused_naming_the_key(settings, message):
    with pytest.raises(ConfigError) as raised:
        BrokerConfig.from_mapping(settings, source="s.toml [broker]")
    assert str(raised.value).startswith("s.toml [broker]: ")
    assert message in str(raised.value)
