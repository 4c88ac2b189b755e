"""BrokerConfig / NodeConfig validation: every error names the source, the key and what is allowed."""

from __future__ import annotations

import json

import pytest

from reference_broker.config import BrokerConfig, ConfigError, NodeConfig
from reference_broker.defects import CATALOG


def test_defaults_model_tbmq():
    config = BrokerConfig()
    assert config.persisted_messages_limit == 10000
    assert config.persisted_message_ttl_s == 604800
    assert config.producer_acks == "1"
    assert (config.incoming_partitions, config.persisted_partitions) == (16, 12)
    assert (config.persisted_failure_strategy, config.persisted_failure_retries) == ("skip", 3)
    assert config.defects == ()


@pytest.mark.parametrize("limit", [0, 65536, -1, 100000])
def test_limit_out_of_range_is_a_clear_error(limit):
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping({"persisted_messages_limit": limit}, source="s.toml [broker]")
    message = str(caught.value)
    assert "s.toml [broker]" in message and "persisted_messages_limit" in message and "1..65535" in message


@pytest.mark.parametrize("limit", [1, 65535])
def test_limit_edges_accepted(limit):
    assert BrokerConfig.from_mapping({"persisted_messages_limit": limit}).persisted_messages_limit == limit


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError, match="unknown key.*persisted_limit.*allowed keys:.*persisted_messages_limit"):
        BrokerConfig.from_mapping({"persisted_limit": 5}, source="x")


def test_unknown_defect_lists_catalog():
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping({"defects": ["no_such_bug"]}, source="x")
    assert "no_such_bug" in str(caught.value)
    for name in CATALOG:
        assert name in str(caught.value)


def test_acks_and_strategies():
    assert BrokerConfig.from_mapping({"producer_acks": 1}).producer_acks == "1"
    assert BrokerConfig.from_mapping({"producer_acks": "all"}).producer_acks == "all"
    with pytest.raises(ConfigError, match="producer_acks.*'0', '1', 'all'"):
        BrokerConfig.from_mapping({"producer_acks": "2"})
    with pytest.raises(ConfigError, match="incoming_failure_strategy.*retry_forever"):
        BrokerConfig.from_mapping({"incoming_failure_strategy": "ignore"})
    config = BrokerConfig.from_mapping({"persisted_failure_strategy": "retry_forever", "processing_timeout_s": 5})
    assert config.persisted_failure_strategy == "retry_forever" and config.processing_timeout_s == 5.0


def test_type_errors_name_the_key():
    with pytest.raises(ConfigError, match="max_inflight = 'many': expected an integer"):
        BrokerConfig.from_mapping({"max_inflight": "many"})
    with pytest.raises(ConfigError, match="defects = 'trim_newest': expected a list"):
        BrokerConfig.from_mapping({"defects": "trim_newest"})
    with pytest.raises(ConfigError, match="key_prefix"):
        BrokerConfig.from_mapping({"key_prefix": 3})


def test_roundtrip_to_dict():
    config = BrokerConfig.from_mapping({"defects": ["trim_newest"], "persisted_messages_limit": 5})
    assert BrokerConfig.from_mapping(config.to_dict()) == config
    assert config.has("trim_newest") and not config.has("trim_off_by_one")


def test_node_config_file(tmp_path):
    path = tmp_path / "broker-config.json"
    path.write_text(json.dumps({"broker": {"persisted_messages_limit": 7},
                                "redis_startup_nodes": ["127.0.0.1:7001", ["127.0.0.2", 7002]],
                                "kafka_bootstrap": "127.0.0.1:9092"}))
    node = NodeConfig.load(path)
    assert node.redis_startup_nodes == (("127.0.0.1", 7001), ("127.0.0.2", 7002))
    assert node.broker.persisted_messages_limit == 7
    assert NodeConfig.from_mapping(node.to_dict()) == node


def test_node_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        NodeConfig.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        NodeConfig.load(bad)
    with pytest.raises(ConfigError, match="redis_startup_nodes is missing"):
        NodeConfig.from_mapping({"kafka_bootstrap": "h:1"})
    with pytest.raises(ConfigError, match="port must be an integer"):
        NodeConfig.from_mapping({"kafka_bootstrap": "h:1", "redis_startup_nodes": ["h:x"]})
    with pytest.raises(ConfigError, match=r"\[broker\]: persisted_messages_limit"):
        NodeConfig.from_mapping({"kafka_bootstrap": "h:1", "redis_startup_nodes": ["h:1"],
                                 "broker": {"persisted_messages_limit": 70000}}, source="f.json")


def test_catalog_entries_are_complete():
    assert len(CATALOG) >= 10
    invariants = {d.invariant for d in CATALOG.values()}
    for family in ("durability.", "order.", "expiry.", "limits.", "duplicates."):
        assert any(i.startswith(family) for i in invariants), family
    assert sum(1 for d in CATALOG.values() if "wrap" in d.what) >= 2
    assert all(d.what and d.invariant and d.where for d in CATALOG.values())


def test_kafka_fetch_max_wait_defaults_above_an_s3_round_trip_and_is_validated():
    # 30 ms starved the consumers on Tansu over moto (docs/reference-broker.md, Known bugs)
    assert BrokerConfig().kafka_fetch_max_wait_ms == 250
    assert BrokerConfig.from_mapping({"kafka_fetch_max_wait_ms": 100}).kafka_fetch_max_wait_ms == 100
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping({"kafka_fetch_max_wait_ms": 0}, source="s.toml [broker]")
    assert "kafka_fetch_max_wait_ms" in str(caught.value) and "1..60000" in str(caught.value)


def test_producer_max_batch_bytes_defaults_to_1_mib_and_is_validated():
    # aiokafka's 16 KiB made a burst one S3 object per 16 KiB (tests/integration/test_broker_flow.py)
    assert BrokerConfig().producer_max_batch_bytes == 1048576
    assert BrokerConfig().producer_linger_ms == 50  # the knee measured on the S3 stand-in
    assert BrokerConfig.from_mapping({"producer_max_batch_bytes": 16384}).producer_max_batch_bytes == 16384
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping({"producer_max_batch_bytes": 100}, source="s.toml [broker]")
    assert "producer_max_batch_bytes" in str(caught.value) and "1024..16777216" in str(caught.value)


@pytest.mark.parametrize("key, bad, good", [("receive_maximum", 0, 1), ("max_packet_size", 63, 64),
                                            ("max_topic_length", 0, 1), ("max_pending_publishes", 0, 1)])
def test_declared_limits_are_validated(key, bad, good):
    """The limits CONNACK declares: out of range is a clear error naming the key; the edge works."""
    with pytest.raises(ConfigError, match=key):
        BrokerConfig.from_mapping({key: bad})
    assert getattr(BrokerConfig.from_mapping({key: good}), key) == good
