"""Subscribers that withhold PUBACKs before an abrupt drop: scenario key → plan → executor schedule."""

from __future__ import annotations

import pytest

from contracts.scenario import ScenarioError, load_scenario, parse_scenario
from harness.executor import withhold_starts
from properties.generate import make_plan
from properties.plan import CONNECT, DISCONNECT, Plan, SubscriberAction

BASE = """
[scenario]
name = "withhold"
duration_s = 8
[workload]
pattern = "p2p"
pairs = 2
rate_per_publisher = 5
qos_mix = { qos1 = 1 }
[subscribers]
disconnects_per_minute = 30
abrupt_fraction = 0.5
offline_s = [0.3, 0.6]
"""


def test_scenario_key_reaches_every_abrupt_disconnect_of_the_plan() -> None:
    scenario = parse_scenario(BASE + "withhold_acks_s = 0.4\n")
    assert scenario.subscribers.withhold_acks_s == 0.4
    plan = make_plan(scenario, 4)
    disconnects = [a for a in plan.subscriber_actions if a.action == DISCONNECT]
    assert any(a.abrupt for a in disconnects) and any(not a.abrupt for a in disconnects)
    for action in disconnects:
        assert action.withhold_acks_s == (0.4 if action.abrupt else 0.0)
    assert Plan.from_json(plan.to_json()) == plan  # the plan.json round trip keeps it


def test_default_withholds_nothing_and_keeps_the_plan_otherwise_identical() -> None:
    without = make_plan(parse_scenario(BASE), 4)
    with_key = make_plan(parse_scenario(BASE + "withhold_acks_s = 0.4\n"), 4)
    assert all(a.withhold_acks_s == 0.0 for a in without.subscriber_actions)
    assert withhold_starts(without.subscriber_actions) == []
    strip = [(a.offset_s, a.client_id, a.action, a.abrupt, a.clean_start) for a in with_key.subscriber_actions]
    assert strip == [(a.offset_s, a.client_id, a.action, a.abrupt, a.clean_start) for a in without.subscriber_actions]
    assert with_key.publishes == without.publishes


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ScenarioError, match="withhold_acks_s"):
        parse_scenario(BASE + "withhold_acks_s = -1\n")


def _connect(offset: float, client: str = "c") -> SubscriberAction:
    return SubscriberAction(offset_s=offset, client_id=client, action=CONNECT)


def _drop(offset: float, withhold: float, *, abrupt: bool = True, client: str = "c") -> SubscriberAction:
    return SubscriberAction(offset_s=offset, client_id=client, action=DISCONNECT, abrupt=abrupt,
                            withhold_acks_s=withhold)


def test_withhold_starts_before_each_abrupt_drop_but_not_before_its_connection() -> None:
    actions = [_connect(0.0), _drop(2.0, 0.5), _connect(2.5), _drop(2.7, 0.5), _connect(3.0),
               _drop(5.0, 0.5, abrupt=False), _connect(0.0, "d"), _drop(0.2, 1.0, client="d")]
    assert withhold_starts(actions) == [(0.0, "d"), (1.5, "c"), (2.5, "c")]


def test_resend_scenario_withholds() -> None:
    scenario = load_scenario("scenarios/selftest/selftest-resend.toml")
    plan = make_plan(scenario, 1)
    assert scenario.subscribers.withhold_acks_s > 0
    assert withhold_starts(plan.subscriber_actions), "seed 1 must have an abrupt drop to withhold before"


def test_preset_points_come_shortly_before_each_planned_disconnect() -> None:
    from harness.executor import PRESET_LEAD_S, preset_starts

    actions = [SubscriberAction(0.0, "s", CONNECT), SubscriberAction(3.0, "s", DISCONNECT, abrupt=True),
               SubscriberAction(5.0, "s", CONNECT), SubscriberAction(5.4, "s", DISCONNECT),
               SubscriberAction(0.0, "t", CONNECT)]
    # 0.5 s before the first drop; halfway into the short second connection (never before its connect)
    assert preset_starts(actions) == [(3.0 - PRESET_LEAD_S, "s"), (5.2, "s")]
    plan = make_plan(load_scenario("scenarios/wrap-backlog.toml"), 1)
    drops = [a for a in plan.subscriber_actions if a.action == DISCONNECT]
    assert len(preset_starts(plan.subscriber_actions)) == len(drops) >= 3
