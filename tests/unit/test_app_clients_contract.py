"""The checkers' reading of the reference broker's ``application_clients`` rules (contracts/app_clients.py) gives
the broker's own answers (reference_broker/app_clients.py ``classify``, which cannot import the contracts), on
the rules as scenario.json carries them: the broker's normalised configuration."""

from __future__ import annotations

import pytest

from contracts.app_clients import application_rules, is_application
from reference_broker.app_clients import APPLICATION, classify
from reference_broker.config import BrokerConfig

BROKER = {"application_clients": [{"client_id": "analytics-*"}, {"username": "integration"},
                                  {"client_id": "etl?", "username": "etl"}, {"client_id": "test_sub_client_*"},
                                  {"client_id": "[ab]x"}]}

CASES = [("analytics-1", None), ("analytics", None), ("Analytics-1", None), ("test_sub_client_1_0", "integration"),
         ("test_sub_client_1_0", "Integration"), ("test_sub_client_2_3", None), ("test_pub_client_0", None),
         ("etl1", "etl"), ("etl1", None), ("etl12", "etl"), ("ax", None), ("cx", None), ("", None)]


@pytest.mark.parametrize(("client_id", "username"), CASES)
def test_the_checkers_classify_as_the_broker_does(client_id, username):
    config = BrokerConfig.from_mapping(BROKER)
    rules = application_rules(config.to_dict())   # what scenario.json's "broker" says
    assert is_application(rules, client_id, username) == (
        classify(config.application_clients, client_id, username) == APPLICATION)


def test_no_rules_means_no_application_client():
    assert application_rules({}) == () and application_rules(None) == ()
    assert application_rules(BrokerConfig().to_dict()) == ()
    assert not is_application((), "anything")


@pytest.mark.parametrize(("value", "message"), [
    ("app*", "broker.application_clients must be a list of rules"),
    ([{}], r"broker.application_clients\[0\] = \{\}"),
    ([{"clientid": "a"}], r"broker.application_clients\[0\]"),
    ([{"client_id": ""}], r"broker.application_clients\[0\]"),
    (["app*"], r"broker.application_clients\[0\] = 'app\*'"),
])
def test_a_scenario_json_with_unusable_rules_is_refused_naming_it(value, message):
    with pytest.raises(ValueError, match=f"run/scenario.json: {message}"):
        application_rules({"application_clients": value}, "run/scenario.json")
